"""Context parallelism: ring attention over a cp group, for sequences too long for one rank.

    q, k, v = (split_sequence(t, cp_group, zigzag=True) for t in (q, k, v))   # (b, h, s/cp, d)
    out = ring_attention(q, k, v, cp_group, zigzag=True)                     # causal
    full = gather_sequence(out, cp_group, zigzag=True)                      # = attention(q, k, v)

Every rank holds a piece of the sequence: its queries, keys and values. Attention needs every
query against every (earlier) key, so the ranks sit in a ring and pass their K/V block to the
right, n - 1 times, while they compute attention of their queries against the block they hold
(the send of the next block is posted before the compute: communication hides behind it).
Blocks arrive one at a time, so the softmax is computed online, as in FlashAttention: a
running max m and running sum l per query row, and an output accumulated unnormalised and
rescaled by exp(m_old - m_new) whenever the max grows. At the end out = acc / l, and
lse = m + log l is all the backward needs of the softmax.

Causal masking makes work uneven: with contiguous chunks rank 0's queries see only its own
block, the last rank's see all n. The zig-zag split cuts the sequence into 2n chunks and gives
rank r chunks r and 2n - 1 - r (one early, one late), so every rank does the same work.
The unit of work here is a (query chunk, key chunk) pair: skipped when the keys lie wholly in
the future, masked on the diagonal, full below it (`attention_work` counts them).

Backward: a custom autograd.Function (ring-flash-attention's scheme), not recomputation through
autograd. It saves only q, k, v, out and lse (O(s/cp) per rank; autograd through the online
softmax would keep every block's probabilities, O(s/cp x s), the very memory cp is meant to
cut). K/V go round the ring once more; with them travels an accumulator of dK/dV for the block,
to which each rank adds its queries' part; after n steps it has visited every rank, and one
more step brings it home. Per rank: forward n - 1 K/V sends; backward n - 1 K/V sends and
n dK/dV sends, all to the right neighbour (and as many receives from the left).

The alternative `all_gather_attention` all-gathers K/V instead (and reduce-scatters dK/dV in
backward): every rank then holds the whole sequence's K/V and the all-gather is not hidden, but
any mask is easy (document masks) and, with grouped-query attention, K/V are small next to Q:
Llama 3's context parallel works this way (Dubey et al. 2024). Either way cp keeps the other
activations (MLP, projections, norms) split, which is most of what it saves. Other designs:
DeepSpeed-Ulysses (all-to-all from sequence-split to head-split and back) and striped
attention (round-robin tokens, another load balance). The weights are replicated over the cp
ranks, so their gradients are reduced over dp x cp.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dpmp_lab._helpers import whole_number
from dpmp_lab._torch_helpers import member_group
from dpmp_lab._torch_helpers import tensor_arg as _check_tensor
from dpmp_lab.collectives import start_ring_exchange
from dpmp_lab.i18n.messages import N_, _

SEQ_DIM = -2   # q, k, v: (batch, heads, sequence, head_dim)


def _check_group(group: object) -> dist.ProcessGroup:
    return member_group(group, "cp", N_("context-parallel"), "dl.ProcessGrid(cp=...).cp_group")


# -- which tokens a rank holds (pure arithmetic) ---------------------------------------------------


def chunk_ids(cp: int, rank: int, zigzag: bool = False) -> list[int]:
    """The sequence chunks rank `rank` holds, in order: contiguous [rank] of cp chunks, or
    zig-zag [rank, 2 cp - 1 - rank] of 2 cp chunks."""
    whole_number("cp", cp, what=_("a cp group has at least 1 rank"))
    if not 0 <= rank < cp:
        raise ValueError(_("rank {rank} is outside a cp group of {cp} ranks").format(
            rank=rank, cp=cp))
    return [rank, 2 * cp - 1 - rank] if zigzag else [rank]


def positions(seq_len: int, cp: int, rank: int, zigzag: bool = False) -> torch.Tensor:
    """Global positions of the tokens rank `rank` holds (what a causal mask compares)."""
    ids = chunk_ids(cp, rank, zigzag)
    c = _chunk_len(seq_len, cp, zigzag)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in ids])


def attention_work(cp: int, zigzag: bool = False, causal: bool = True) -> list[int]:
    """Per rank: the attention scores ring attention computes, in units of (s / cp)^2 (one
    rank's queries against one rank's keys); a diagonal chunk pair, half masked, counts half.
    Contiguous causal: rank r does r + 1/2, so the last rank waits for nobody and everybody
    waits for it; zig-zag: every rank does cp / 2."""
    area = 1.0 / len(chunk_ids(cp, 0, zigzag)) ** 2
    work = []
    for me in range(cp):
        q_ids = chunk_ids(cp, me, zigzag)
        k_ids = [k for src in range(cp) for k in chunk_ids(cp, src, zigzag)]
        pairs = [_pair_kind(qi, kj, causal) for qi in q_ids for kj in k_ids]
        work.append(area * sum({"full": 1.0, "diagonal": 0.5, "skip": 0.0}[p] for p in pairs))
    return work


def _chunk_len(seq_len: int, cp: int, zigzag: bool) -> int:
    pieces = 2 * cp if zigzag else cp
    if seq_len % pieces:
        raise ValueError(_("a sequence of {seq_len} tokens does not split into {pieces} equal "
                           "chunks ({twice}cp = {pieces}): choose a length divisible by "
                           "{pieces}").format(seq_len=seq_len, pieces=pieces,
                                              twice="2 x " if zigzag else ""))
    return seq_len // pieces


def _pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "skip"


# -- splitting and gathering the sequence ----------------------------------------------------------


def split_sequence(x: torch.Tensor, group: dist.ProcessGroup, zigzag: bool = False,
                   dim: int = SEQ_DIM) -> torch.Tensor:
    """This rank's part of a whole sequence (every rank passes the same x)."""
    x = _check_tensor(x, "x")
    n, me = dist.get_world_size(_check_group(group)), dist.get_rank(group)
    c = _chunk_len(x.shape[dim], n, zigzag)
    return torch.cat([x.narrow(dim, i * c, c) for i in chunk_ids(n, me, zigzag)],
                     dim=dim).contiguous()


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup, zigzag: bool = False,
                    dim: int = SEQ_DIM) -> torch.Tensor:
    """The whole sequence from every rank's part, in token order (one all-gather; no autograd:
    for looking at results and for tests)."""
    n = dist.get_world_size(_check_group(group))
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    g = len(chunk_ids(n, 0, zigzag))
    chunks: dict[int, torch.Tensor] = {}
    for src, part in enumerate(parts):
        for i, piece in zip(chunk_ids(n, src, zigzag), part.chunk(g, dim=dim), strict=True):
            chunks[i] = piece
    return torch.cat([chunks[i] for i in sorted(chunks)], dim=dim)


# -- one block of attention, online ----------------------------------------------------------------


def _scores(q: torch.Tensor, k: torch.Tensor, kind: str) -> torch.Tensor:
    """Scaled scores q k^T / sqrt(d) of one block; a "diagonal" block (queries and keys of one
    chunk) hides each query's future keys."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if kind == "diagonal":   # same chunk: key j is visible to query i when j <= i
        future = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def online_softmax_update(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor,  # noqa: E741
                          s: torch.Tensor, v: torch.Tensor) -> None:
    """Fold one block of scores s (rows: queries) and its values v into the running state, in
    place: m the running max of each row, l the running sum of exp(s - m), acc the output
    before dividing by l. Every row of s must have one finite score (the callers skip blocks
    wholly in the future, so the diagonal provides it)."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    rescale = torch.exp(m - m_new)           # exp(-inf) = 0 on the first block
    p = torch.exp(s - m_new.unsqueeze(-1))
    l.mul_(rescale).add_(p.sum(dim=-1))
    acc.mul_(rescale.unsqueeze(-1)).add_(p @ v)
    m.copy_(m_new)


def _block_forward(q: torch.Tensor, kv: torch.Tensor, q_ids: list[int], k_ids: list[int],
                   state: tuple[torch.Tensor, torch.Tensor, torch.Tensor], causal: bool) -> None:
    acc, m, l = state  # noqa: E741
    k, v = kv
    for qs, qi in zip(_pieces(q, len(q_ids)), q_ids, strict=True):
        for ks, vs, kj in zip(_pieces(k, len(k_ids)), _pieces(v, len(k_ids)), k_ids, strict=True):
            kind = _pair_kind(qi, kj, causal)
            if kind == "skip":
                continue
            rows = _rows(q, len(q_ids), q_ids.index(qi))
            online_softmax_update(acc[..., rows, :], m[..., rows], l[..., rows],
                                  _scores(qs, ks, kind), vs)


def _block_backward(q: torch.Tensor, kv: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                    delta: torch.Tensor, q_ids: list[int], k_ids: list[int], dq: torch.Tensor,
                    dkv: torch.Tensor, causal: bool) -> None:
    """Add this block's part to dq and to the travelling dK/dV, from the saved lse: the
    probabilities are recomputed as p = exp(s - lse), so nothing per block was kept."""
    k, v = kv
    scale = 1.0 / math.sqrt(q.shape[-1])
    g = len(k_ids)
    for qi in q_ids:
        rows = _rows(q, len(q_ids), q_ids.index(qi))
        qs, dos = q[..., rows, :], do[..., rows, :]
        for j, kj in enumerate(k_ids):
            kind = _pair_kind(qi, kj, causal)
            if kind == "skip":
                continue
            cols = _rows(k, g, j)
            ks, vs = k[..., cols, :], v[..., cols, :]
            p = torch.exp(_scores(qs, ks, kind) - lse[..., rows].unsqueeze(-1))
            dkv[1][..., cols, :] += p.transpose(-1, -2) @ dos
            ds = p * (dos @ vs.transpose(-1, -2) - delta[..., rows].unsqueeze(-1))
            dq[..., rows, :] += ds @ ks * scale
            dkv[0][..., cols, :] += ds.transpose(-1, -2) @ qs * scale


def _pieces(x: torch.Tensor, g: int) -> tuple[torch.Tensor, ...]:
    return x.chunk(g, dim=SEQ_DIM)


def _rows(x: torch.Tensor, g: int, i: int) -> slice:
    c = x.shape[SEQ_DIM] // g
    return slice(i * c, (i + 1) * c)


# -- the ring --------------------------------------------------------------------------------------


def _wait(works: list[dist.Work]) -> list[dist.Work]:
    """Wait for the posted messages; returns [] (a Work waited twice hangs in gloo)."""
    for work in works:
        work.wait()
    return []


class _RingAttention(torch.autograd.Function):
    """Causal ring attention over the cp group.

    Forward: n - 1 steps of send K/V (stacked, one message) to the right and receive the next
    block from the left, each posted before the compute of the block held (overlap=True).
    Backward: n - 1 K/V passes again, and n passes of the travelling dK/dV accumulator.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: dist.ProcessGroup, zigzag: bool, causal: bool,
                overlap: bool) -> torch.Tensor:
        n, me = dist.get_world_size(group), dist.get_rank(group)
        q_ids = chunk_ids(n, me, zigzag)
        acc = torch.zeros_like(q)
        m = q.new_full(q.shape[:-1], float("-inf"))
        l = q.new_zeros(q.shape[:-1])  # noqa: E741
        kv = torch.stack([k, v])
        for step in range(n):
            src = (me - step) % n
            works, nxt = [], None
            if step < n - 1:
                nxt = torch.empty_like(kv)
                works = start_ring_exchange(kv, nxt, group)
                if not overlap:
                    works = _wait(works)
            _block_forward(q, kv, q_ids, chunk_ids(n, src, zigzag), (acc, m, l), causal)
            _wait(works)
            kv = nxt if nxt is not None else kv
        out = acc / l.unsqueeze(-1)
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.zigzag, ctx.causal, ctx.overlap = group, zigzag, causal, overlap
        return out

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        n, me = dist.get_world_size(group), dist.get_rank(group)
        q_ids = chunk_ids(n, me, ctx.zigzag)
        do = do.contiguous()
        delta = (do * out).sum(dim=-1)     # rowsum(dO * O): the softmax's backward term
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv)         # dK/dV of the block held, travelling with it
        for step in range(n):
            src = (me - step) % n
            works, nxt = [], None
            if step < n - 1:
                nxt = torch.empty_like(kv)
                works = start_ring_exchange(kv, nxt, group)
                if not ctx.overlap:
                    works = _wait(works)
            _block_backward(q, kv, do, lse, delta, q_ids, chunk_ids(n, src, ctx.zigzag), dq,
                            dkv, ctx.causal)
            _wait(works)
            kv = nxt if nxt is not None else kv
            # block src's accumulator moves on with the block; after the last step it goes home
            incoming = torch.empty_like(dkv)
            _wait(start_ring_exchange(dkv, incoming, group))
            dkv = incoming
        return dq, dkv[0], dkv[1], None, None, None, None


class _AllGatherKV(torch.autograd.Function):
    """Forward: all-gather the (stacked) K/V parts of every rank; backward: reduce-scatter of
    their gradients (each rank's queries used every rank's keys)."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        n = dist.get_world_size(group)
        out = kv.new_empty((n * kv.shape[0], *kv.shape[1:]))   # concatenated along dim 0
        dist.all_gather_single(out, kv.contiguous(), group=group)
        return out.view(n, *kv.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty(grad.shape[1:])
        dist.reduce_scatter_single(out, grad.reshape(-1, *grad.shape[2:]).contiguous(),
                                   group=ctx.group)
        return out, None


# -- public API ------------------------------------------------------------------------------------


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: object,
               zigzag: bool) -> dist.ProcessGroup:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, name)
        if t.dim() != 4:
            raise ValueError(_("{name} must be (batch, heads, sequence, head_dim), got shape "
                               "{shape}").format(name=name, shape=tuple(t.shape)))
    if not q.shape == k.shape == v.shape:
        raise ValueError(_("q, k and v must have one shape, got {q}, {k}, {v}").format(
            q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    group = _check_group(group)
    if zigzag and q.shape[SEQ_DIM] % 2:
        raise ValueError(_("a zig-zag part holds two equal chunks, so its length must be "
                           "even, not {length}").format(length=q.shape[SEQ_DIM]))
    return group


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                   *, zigzag: bool = False, causal: bool = True,
                   overlap: bool = True) -> torch.Tensor:
    """Attention of this rank's queries against the whole sequence's keys, K/V passed round
    the cp group's ring. q, k, v: this rank's part, (batch, heads, s / cp, head_dim), split
    by split_sequence with the same `zigzag`. Returns this rank's part of the output.
    overlap=False waits for each K/V message before computing (for measuring what overlap
    buys)."""
    group = _check_qkv(q, k, v, group, zigzag)
    return _RingAttention.apply(q, k, v, group, zigzag, causal, overlap)


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         group: dist.ProcessGroup, *, zigzag: bool = False,
                         causal: bool = True) -> torch.Tensor:
    """The same result as ring_attention, by all-gathering K/V first: every rank holds the
    whole sequence's K/V at once, and the communication waits in front of the compute."""
    group = _check_qkv(q, k, v, group, zigzag)
    n, me = dist.get_world_size(group), dist.get_rank(group)
    every = _AllGatherKV.apply(torch.stack([k, v]), group)       # (n, 2, b, h, s/n, d)
    k_all = torch.cat(list(every[:, 0]), dim=SEQ_DIM)            # in rank order, not token
    v_all = torch.cat(list(every[:, 1]), dim=SEQ_DIM)
    scores = q @ k_all.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[SEQ_DIM] * n
        q_pos = positions(seq, n, me, zigzag).to(q.device)
        k_pos = torch.cat([positions(seq, n, r, zigzag) for r in range(n)]).to(q.device)
        scores = scores.masked_fill(k_pos.unsqueeze(0) > q_pos.unsqueeze(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v_all


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              causal: bool = True) -> torch.Tensor:
    """Plain softmax attention on one process: the reference ring attention must equal."""
    return torch.softmax(_scores(q, k, "diagonal" if causal else "full"), dim=-1) @ v


__all__ = ["all_gather_attention", "attention", "attention_work", "chunk_ids", "gather_sequence",
           "online_softmax_update", "positions", "ring_attention", "split_sequence"]
