"""Back-of-the-envelope numbers: how many bytes a layout sends, and how much memory it needs.

    dl.cost.tensor_bytes((1024, 1024))              # 4 MiB: the articles' fp32 gradient
    dl.cost.ring_all_reduce_bytes(4 * 2**20, n=8)   # what each rank sends to all-reduce it
    print(dl.cost.memory(n_params=7e9, dp=8, zero=1))

Conventions. K is the size in bytes of the whole tensor being reduced or gathered. "Sent per
rank" is what a ring algorithm puts on each rank's outgoing link; it is also what each rank
receives. These are the textbook bandwidth terms (latency and the links' speeds are left
out), the same numbers the tracer measures when the collectives are built from send/recv.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpmp_lab._helpers import whole_number
from dpmp_lab.i18n.messages import _
from dpmp_lab.render import Table, human_bytes


def tensor_bytes(shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of a tensor: 1024 x 1024 fp32 = 4 MiB; an 8 x 128 x 4096 fp32 activation = 16 MiB."""
    numel = shape if isinstance(shape, int) else math.prod(shape)
    return int(numel) * torch.empty(0, dtype=dtype).element_size()


# -- collectives ------------------------------------------------------------------------------


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(_("a group has at least 1 rank, not {n}").format(n=n))


def ring_all_reduce_bytes(k: float, n: int) -> float:
    """Sent per rank by a ring all-reduce of K bytes over n ranks: 2 (n-1)/n K.

    A reduce-scatter ((n-1)/n K) then an all-gather ((n-1)/n K): almost 2K whatever n is.
    """
    _check_n(n)
    return 2 * (n - 1) / n * k


def all_gather_bytes(k: float, n: int) -> float:
    """Sent per rank by a ring all-gather whose result is K bytes: (n-1)/n K."""
    _check_n(n)
    return (n - 1) / n * k


def reduce_scatter_bytes(k: float, n: int) -> float:
    """Sent per rank by a ring reduce-scatter of a K-byte input: (n-1)/n K."""
    _check_n(n)
    return (n - 1) / n * k


# -- what each kind of parallelism communicates -------------------------------------------------


def dp_gradient_bytes(n_params: int, dtype: torch.dtype = torch.float32) -> int:
    """K of data parallel: every trainable gradient, all-reduced once per step.

    Per rank on the wire: ring_all_reduce_bytes(dp_gradient_bytes(...), dp).
    """
    return tensor_bytes(n_params, dtype)


def tp_activation_bytes(batch: int, seq: int, d_model: int,
                        dtype: torch.dtype = torch.float32) -> int:
    """K of one tensor-parallel all-reduce: a (batch, seq, d_model) activation.

    A Megatron MLP or attention block does one in forward (g) and one in backward (f), so a
    transformer layer does 2 forward + 2 backward, each of this size; with sequence
    parallelism each becomes a reduce-scatter plus an all-gather of the same K.
    """
    return tensor_bytes((batch, seq, d_model), dtype)


def pp_activation_bytes(micro_batch: int, seq: int, d_model: int,
                        dtype: torch.dtype = torch.float32) -> int:
    """Bytes one stage sends to the next per micro-batch in forward; backward sends the same
    amount of activation gradient back. Per step: 2 m of these on every stage boundary."""
    return tensor_bytes((micro_batch, seq, d_model), dtype)


def all_to_all_bytes(k: float, n: int) -> float:
    """Sent per rank by an all-to-all of a K-byte input: (n-1)/n K (the part for itself
    stays)."""
    _check_n(n)
    return (n - 1) / n * k


def sent_bytes(op: str, nbytes: float, n: int) -> float:
    """What one rank sends for one call of `op` over n ranks whose payload on that rank is
    `nbytes`, as dl.trace records it (all_gather: the rank's shard; reduce_scatter and
    all_to_all: the whole input), each collective run as a ring. A recv sends nothing, a send
    its payload. A broadcast, reduce, gather or scatter moves the payload over n - 1 links in
    all, wherever its root is (a pipelined chain for the first two): (n-1)/n of it per rank,
    on average over the ranks, which is exact for the calls of all n roots together (n
    broadcasts, one from each rank, send what one all-gather sends)."""
    _check_n(n)
    if op == "all_reduce":
        return ring_all_reduce_bytes(nbytes, n)
    if op == "all_gather":
        return all_gather_bytes(nbytes * n, n)
    if op == "reduce_scatter":
        return reduce_scatter_bytes(nbytes, n)
    if op == "all_to_all":
        return all_to_all_bytes(nbytes, n)
    if op in ("recv", "barrier"):
        return 0.0
    if op in ("broadcast", "reduce", "gather", "scatter"):
        return (n - 1) / n * nbytes
    return float(nbytes)


def cp_kv_bytes(batch: int, seq: int, d_kv: int, dtype: torch.dtype = torch.float32) -> int:
    """K of context parallel: the keys and values of the whole sequence for one attention
    layer, 2 x (batch, seq, d_kv) with d_kv = heads x head_dim.

    Ring attention passes every other rank's K/V part through each rank once in forward:
    all_gather_bytes(K, cp) sent per rank, the same bytes as an all-gather of K/V, but in
    cp - 1 messages that hide behind the attention of the block held, and never all at once
    in memory. Backward sends cp_ring_bytes(..., backward=True).
    """
    return 2 * tensor_bytes((batch, seq, d_kv), dtype)


def cp_ring_bytes(k: float, cp: int, backward: bool = False) -> float:
    """Sent per rank by dl.cp.ring_attention for K = cp_kv_bytes(...): forward (cp-1)/cp K
    (cp - 1 K/V blocks); backward (2 cp - 1)/cp K (the K/V blocks again, and the dK/dV
    accumulator, which makes cp hops to come home)."""
    _check_n(cp)
    return (2 * cp - 1) / cp * k if backward else (cp - 1) / cp * k


def ep_dispatch_bytes(tokens: int, d_model: int, n_experts: int, top_k: int = 1,
                      capacity_factor: float = 1.25,
                      dtype: torch.dtype = torch.float32) -> int:
    """K of one expert-parallel all-to-all: the (n_experts, capacity, d_model) buffer of a
    rank's tokens, capacity = ceil(capacity_factor x tokens x top_k / n_experts): about
    capacity_factor x top_k copies of the tokens.

    A MoE layer does 2 all-to-alls forward (dispatch, combine) and 2 backward, each putting
    all_to_all_bytes(K, ep) on the wire per rank. Compare per GPU for the same global batch:
    an ep rank sends about top_k capacity_factor copies of its own share of the tokens
    (twice), which falls with ep like its FLOPs, while every tp rank all-reduces all the tokens' activations
    (2 (tp-1)/tp copies) with 1/tp of the FLOPs: tp's communication per FLOP grows with tp,
    ep's stays about constant.
    """
    cap = math.ceil(capacity_factor * tokens * top_k / n_experts)
    return tensor_bytes((n_experts, cap, d_model), dtype)


# -- memory -----------------------------------------------------------------------------------

# bytes per parameter: (weights, gradients, optimizer state). "mixed" is the ZeRO paper's
# mixed-precision Adam: fp16 weights and gradients, plus fp32 master weights, momentum and
# variance (4 + 4 + 4 = 12 bytes).
_PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


@dataclass(frozen=True)
class Memory:
    """Model-state memory per GPU in bytes (activations not included)."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer

    def table(self) -> Table:
        parts = ((_("parameters"), self.params), (_("gradients"), self.grads),
                 (_("optimizer state"), self.optimizer), (_("total"), self.total))
        return Table([_("model state per GPU"), _("bytes")],
                     [[what, human_bytes(b)] for what, b in parts])

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def memory(n_params: float, *, dp: int = 1, tp: int = 1, pp: int = 1, zero: int = 0,
           precision: str = "fp32") -> Memory:
    """Memory of weights, gradients and Adam state per GPU.

    tp and pp split the model: each GPU holds about n_params / (tp * pp) of it. Data
    parallel replicates that share dp times, unless ZeRO shards it over the dp group:
    stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the weights.
    """
    if precision not in _PRECISIONS:
        raise ValueError(_("precision must be one of {names}, not {precision!r}").format(
            names=", ".join(_PRECISIONS), precision=precision))
    if zero not in (0, 1, 2, 3):
        raise ValueError(_("ZeRO stages are 0 (off), 1, 2 and 3, not {zero}").format(zero=zero))
    for name, size in (("dp", dp), ("tp", tp), ("pp", pp)):
        whole_number(name, size, what=_("{name} must be a whole number of ranks >= 1").format(
            name=name))
    w, g, o = _PRECISIONS[precision]
    share = n_params / (tp * pp)
    return Memory(params=share * w / (dp if zero >= 3 else 1),
                  grads=share * g / (dp if zero >= 2 else 1),
                  optimizer=share * o / (dp if zero >= 1 else 1))


def fsdp_peak_param_bytes(n_params: float, dp: int, largest_unit: float, *,
                          master: torch.dtype = torch.float32,
                          compute: torch.dtype | None = None, gathered: int = 1) -> float:
    """Peak parameter bytes per rank under FSDP (ZeRO-3): the 1/dp shard of every weight in the
    master dtype, plus `gathered` units held whole at once in the compute dtype (1 without
    prefetch, 2 with it). `memory(..., zero=3)` counts only the first term; the second is the
    price of computing with whole weights. Padding to a multiple of dp is left out."""
    whole_number("dp", dp, what=_("{name} must be a whole number of ranks >= 1").format(
        name="dp"))
    compute = compute or master
    return n_params / dp * master.itemsize + gathered * largest_unit * compute.itemsize


# -- pipeline schedules -------------------------------------------------------------------------

_PIPELINE_SCHEDULES = ("naive", "gpipe", "afab", "1f1b", "interleaved", "zbh1", "zbh2")


def pp_bubble(schedule: str, p: int, m: int, v: int = 1, *, t_f: float = 1.0,
              t_b: float = 1.0, t_w: float = 1.0, steps: int = 1,
              relative_to: str = "step") -> float:
    """The idle share of a pipeline step with equal stages: what pp.measured_bubble measures.

    Idle time I per rank, busy time T per rank, and the fraction I / (T + I) of the step
    (relative_to="ideal": I / T, the papers' "of the ideal time"). t_f, t_b, t_w: the times of
    a forward, a backward (its input-gradient part when W is split off) and a weight gradient.
    - naive: one stage busy at a time: (p-1)/p.
    - gpipe, 1f1b: the pipeline fills and drains once: I = (p-1)(t_f + t_b), T = m(t_f + t_b),
      so (p-1)/(m+p-1) of the step, (p-1)/m of the ideal time (Narayanan et al. 2021,
      Section 2.2.1).
    - interleaved (v chunks per rank, each 1/v of the rank's layers): the fill and drain are
      made of chunks, so I shrinks v times: (p-1)/(v m + p-1) of the step, (p-1)/(v m) of
      the ideal time (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
      on GPU Clusters Using Megatron-LM", Section 2.2.2; m a multiple of p).
    - zbh1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Section 2.1): the W passes fill
      the drain, I = (p-1)(t_f + t_b - t_w); 1F1B on the same model idles (p-1)(t_f + t_b +
      t_w), so with equal times a third of it. Needs m >= p, and t_w <= t_f: a W fills a slot
      a forward left, so a longer W fills no more (I = (p-1)(t_f + t_b - min(t_w, t_f)), as
      the simulated grids show).
    - zbh2 (ibid., Section 2.2): the paper's bubble (p-1)(t_f + t_b - 2 t_w) is 0 with equal
      times: every rank is busy from its first action to its last. Within one step there is
      still the fill of the first forward, rank r starting r t_f late and ending (p-1-r) t_f
      before the last: I = (p-1) t_f. Steps run back to back (no synchronisation between them,
      the paper's Section 4) share it: over `steps` steps I / (steps T + I), which tends to
      the paper's 0 (equal times, m >= 2p-1).
    For the others the step is the period: back-to-back steps do not overlap, because the first
    rank is busy up to the last moment of a step.
    """
    key = schedule.lower().replace("-", "").replace("_", "") if isinstance(schedule, str) \
        else schedule
    if key not in _PIPELINE_SCHEDULES:
        raise ValueError(_("pp_bubble knows {names}, not {schedule!r}").format(
            names=", ".join(_PIPELINE_SCHEDULES), schedule=schedule))
    for name, size in (("p", p), ("m", m), ("v", v), ("steps", steps)):
        whole_number(name, size)
    if relative_to not in ("step", "ideal"):
        raise ValueError(_("relative_to is 'step' or 'ideal', not {value!r}").format(
            value=relative_to))
    if v > 1 and key != "interleaved":
        raise ValueError(_("v={v}: only the interleaved schedule runs virtual stages").format(
            v=v))
    if key == "naive":
        idle, busy = (p - 1) * (t_f + t_b), t_f + t_b
    elif key in ("gpipe", "afab", "1f1b", "interleaved"):
        idle, busy = (p - 1) * (t_f + t_b), v * m * (t_f + t_b)
    elif key == "zbh1":
        idle, busy = (p - 1) * (t_f + t_b - min(t_w, t_f)), m * (t_f + t_b + t_w)
    else:
        idle, busy = (p - 1) * t_f, steps * m * (t_f + t_b + t_w)
    return idle / busy if relative_to == "ideal" else idle / (busy + idle)


def pp_messages(p: int, m: int, v: int = 1) -> int:
    """Point-to-point messages of one pipeline step, all ranks together, for p ranks, m
    micro-batches and v chunks per rank: an activation forward and its gradient back across
    every boundary between consecutive model stages, for every micro-batch (W sends nothing).
    Interleaving multiplies the boundaries (Narayanan et al. 2021, Section 2.2.2: the price of
    its smaller bubble); notebook 10 asks you to count them, and the count is in the code below.
    On one rank (p = 1) every boundary lies on that rank: no message.
    """
    for name, size in (("p", p), ("m", m), ("v", v)):
        whole_number(name, size)
    return 0 if p == 1 else 2 * m * (v * p - 1)


__all__ = ["Memory", "fsdp_peak_param_bytes", "all_gather_bytes", "dp_gradient_bytes", "memory", "pp_activation_bytes",
           "reduce_scatter_bytes", "ring_all_reduce_bytes", "tensor_bytes",
           "tp_activation_bytes"]
__all__ += ["all_to_all_bytes", "cp_kv_bytes", "cp_ring_bytes", "ep_dispatch_bytes"]
__all__ += ["pp_bubble", "pp_messages", "sent_bytes"]
