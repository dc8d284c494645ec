"""tp: every tensor-parallel layer equals its dense module in fp64 and talks as Megatron does.

Each rank computes the dense reference itself (same seed everywhere) and returns the largest
difference per quantity, and what it communicated per (op, group, phase): calls and bytes.
The tp group is a real sub-group: at tp=2 the world of 4 holds two tp groups side by side.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dpmp_lab as dl
from dpmp_lab import models, tp

pytestmark = pytest.mark.usefixtures("no_leaks")

TOL = 1e-10
B, T, D, FF, V, HEADS = 2, 4, 8, 16, 16, 4   # small, and divisible by tp = 2 and 4
F64 = 8                                      # bytes per element


# -- helpers that run inside the ranks -------------------------------------------------------------


def _err(got: torch.Tensor | None, want: torch.Tensor) -> float:
    if got is None or got.shape != want.shape:
        return float("inf")
    return (got - want).abs().max().item()


def _calls(t: dl.Trace, grid: dl.ProcessGrid) -> dict[tuple, tuple[int, int]]:
    """{(op, group, phase): (calls, bytes)}, group "tp" when it is this rank's tp group."""
    out: dict[tuple, tuple[int, int]] = {}
    for e in t.events:
        group = "tp" if e.group == tuple(sorted(grid.tp_ranks)) else e.group
        calls, nbytes = out.get((e.op, group, e.phase), (0, 0))
        out[(e.op, group, e.phase)] = (calls + 1, nbytes + e.nbytes)
    return out


def _grad_errors(prefix: str, par: nn.Module, dense: nn.Module, group,
                 errs: dict[str, float]) -> None:
    """Each parameter's gradient against this rank's shard of the dense gradient."""
    dense_grads = {n: p.grad for n, p in dense.named_parameters()}
    dims = tp.sharding(par)
    assert set(dims) == set(dense_grads), (sorted(dims), sorted(dense_grads))
    for name, dim in dims.items():
        want = dense_grads[name] if dim is None else tp.shard_tensor(dense_grads[name], group, dim)
        errs[f"{prefix} grad {name}"] = _err(par.get_parameter(name).grad, want)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_()


# -- every layer and region op, against the dense computation --------------------------------------


def layer_checks(grid: dl.ProcessGrid):
    tp_size, g, r = grid.tp, grid.tp_group, grid.tp_rank
    errs: dict[str, float] = {}
    comm: dict[str, dict] = {}
    x = _randn(B, T, D, seed=1)
    w_out = _randn(B, T, D, seed=2)       # loss = (y * w).sum(): a gradient that differs per entry
    w_ff = _randn(B, T, FF, seed=3)
    parts = _randn(tp_size, B, T, D, seed=4)   # parts[r]: rank r's partial sum or own weights

    def traced(name, make_output, weight):
        """y = make_output(), then backward of (y * weight).sum(), recording the communication."""
        with dl.trace() as t:
            y = make_output()
            (y * weight).sum().backward()
        comm[name] = _calls(t, grid)
        return y

    # Region ops. Replicated in, parallel out (copy_to, scatter_to, gather_from_sequence): each
    # rank's loss is its own part of the total, here a per-rank weight. Parallel in, replicated
    # out (reduce_from, gather_from_tp): every rank computes the same loss.
    xl = _leaf(x)
    y = traced("copy_to", lambda: tp.copy_to_tp_region(xl, g), parts[r])
    errs["copy_to out"], errs["copy_to grad"] = _err(y, x), _err(xl.grad, parts.sum(0))

    xl = _leaf(parts[r])
    y = traced("reduce_from", lambda: tp.reduce_from_tp_region(xl, g), w_out)
    errs["reduce_from out"], errs["reduce_from grad"] = _err(y, parts.sum(0)), _err(xl.grad, w_out)

    pieces = _randn(tp_size, B, T, 3, seed=5)
    w_cat = _randn(B, T, 3 * tp_size, seed=6)
    xl = _leaf(pieces[r])
    y = traced("gather_from_tp", lambda: tp.gather_from_tp_region(xl, g), w_cat)
    errs["gather_from_tp out"] = _err(y, torch.cat(list(pieces), dim=-1))
    errs["gather_from_tp grad"] = _err(xl.grad, tp.shard_tensor(w_cat, g, -1))

    xl = _leaf(x)
    y = traced("scatter_to_tp", lambda: tp.scatter_to_tp_region(xl, g), tp.shard_tensor(w_out, g, -1))
    errs["scatter_to_tp out"] = _err(y, tp.shard_tensor(x, g, -1))
    errs["scatter_to_tp grad"] = _err(xl.grad, w_out)

    xl = _leaf(tp.shard_tensor(x, g, 1))
    y = traced("gather_from_sequence", lambda: tp.gather_from_sequence_region(xl, g), parts[r])
    errs["gather_from_sequence out"] = _err(y, x)
    errs["gather_from_sequence grad"] = _err(xl.grad, tp.shard_tensor(parts.sum(0), g, 1))

    xl = _leaf(parts[r])
    y = traced("reduce_scatter_to_sequence",
               lambda: tp.reduce_scatter_to_sequence_region(xl, g), tp.shard_tensor(w_out, g, 1))
    errs["reduce_scatter_to_sequence out"] = _err(y, tp.shard_tensor(parts.sum(0), g, 1))
    errs["reduce_scatter_to_sequence grad"] = _err(xl.grad, w_out)

    # sequence first, (seq, batch, hidden) as Megatron lays it out: dim=0
    seq_first = _randn(2 * tp_size, B, D, seed=7)
    weights = _randn(tp_size, 2 * tp_size, B, D, seed=8)
    xl = _leaf(tp.shard_tensor(seq_first, g, 0))
    y = tp.gather_from_sequence_region(xl, g, dim=0)
    (y * weights[r]).sum().backward()
    errs["gather_from_sequence dim=0 out"] = _err(y, seq_first)
    errs["gather_from_sequence dim=0 grad"] = _err(xl.grad, tp.shard_tensor(weights.sum(0), g, 0))
    xl = _leaf(weights[r])
    y = tp.reduce_scatter_to_sequence_region(xl, g, dim=0)
    (y * tp.shard_tensor(seq_first, g, 0)).sum().backward()
    errs["reduce_scatter_to_sequence dim=0 out"] = _err(y, tp.shard_tensor(weights.sum(0), g, 0))
    errs["reduce_scatter_to_sequence dim=0 grad"] = _err(xl.grad, seq_first)

    # ColumnParallelLinear without and with gather_output
    with models.seeded(10):
        dense = nn.Linear(D, FF)
    for gather in (False, True):
        name = f"column gather_output={gather}"
        dense.zero_grad()
        par = tp.ColumnParallelLinear.from_dense(dense, g, gather_output=gather)
        xd, xl = _leaf(x), _leaf(x)
        yd = dense(xd)
        (yd * w_ff).sum().backward()
        y = traced(name, lambda par=par, xl=xl: par(xl), w_ff if gather else tp.shard_tensor(w_ff, g, -1))
        errs[f"{name} out"] = _err(y, yd if gather else tp.shard_tensor(yd, g, -1))
        errs[f"{name} input grad"] = _err(xl.grad, xd.grad)
        _grad_errors(name, par, dense, g, errs)

    # RowParallelLinear with a parallel (sliced) input and with a whole input
    with models.seeded(11):
        dense = nn.Linear(FF, D)
    xf = _randn(B, T, FF, seed=12)
    for parallel in (True, False):
        name = f"row input_is_parallel={parallel}"
        dense.zero_grad()
        par = tp.RowParallelLinear.from_dense(dense, g, input_is_parallel=parallel)
        xd, xl = _leaf(xf), _leaf(tp.shard_tensor(xf, g, -1) if parallel else xf)
        yd = dense(xd)
        (yd * w_out).sum().backward()
        y = traced(name, lambda par=par, xl=xl: par(xl), w_out)
        errs[f"{name} out"] = _err(y, yd)
        errs[f"{name} input grad"] = _err(xl.grad, tp.shard_tensor(xd.grad, g, -1) if parallel
                                          else xd.grad)
        _grad_errors(name, par, dense, g, errs)

    # VocabParallelEmbedding: ids spread over every rank's rows
    with models.seeded(13):
        dense_emb = nn.Embedding(V, D)
    ids = (torch.arange(B * T).reshape(B, T) * 5) % V
    par_emb = tp.VocabParallelEmbedding.from_dense(dense_emb, g)
    (dense_emb(ids) * w_out).sum().backward()
    y = traced("embedding", lambda: par_emb(ids), w_out)
    errs["embedding out"] = _err(y, dense_emb(ids))
    _grad_errors("embedding", par_emb, dense_emb, g, errs)

    # vocab-parallel cross entropy against F.cross_entropy on the whole logits
    logits = _randn(B, T, V, seed=14) * 3
    targets = (torch.arange(B * T).reshape(B, T) * 7 + 3) % V
    ld, ll = _leaf(logits), _leaf(tp.shard_tensor(logits, g, -1))
    loss_d = models.lm_loss(ld, targets)
    loss_d.backward()
    loss = traced("cross_entropy", lambda: tp.vocab_parallel_cross_entropy(ll, targets, g), 1.0)
    errs["cross_entropy loss"] = _err(loss, loss_d)
    errs["cross_entropy logits grad"] = _err(ll.grad, tp.shard_tensor(ld.grad, g, -1))
    big = tp.shard_tensor(logits * 1e3, g, -1)   # stable where a plain exp would overflow
    errs["cross_entropy large logits"] = _err(tp.vocab_parallel_cross_entropy(big, targets, g),
                                              models.lm_loss(logits * 1e3, targets))

    # ParallelMLP and ParallelSelfAttention, from the dense blocks of TinyGPT
    with models.seeded(15):
        blocks = {"mlp": models.MLP(D, FF), "attention": models.CausalSelfAttention(D, HEADS)}
    for name, dense in blocks.items():
        par = (tp.ParallelMLP if name == "mlp" else tp.ParallelSelfAttention).from_dense(dense, g)
        xd, xl = _leaf(x), _leaf(x)
        yd = dense(xd)
        (yd * w_out).sum().backward()
        y = traced(name, lambda par=par, xl=xl: par(xl), w_out)
        errs[f"{name} out"] = _err(y, yd)
        errs[f"{name} input grad"] = _err(xl.grad, xd.grad)
        _grad_errors(name, par, dense, g, errs)
    # an input that needs no gradient (the first layer of a model): f has nothing to sum
    mlp = tp.ParallelMLP.from_dense(blocks["mlp"], g)
    traced("mlp, input without grad", lambda: mlp(x), w_out)

    # built from scratch under a seed: the shards of the dense module built under that seed
    scratch = {"mlp": (lambda: tp.ParallelMLP(D, FF, g), lambda: models.MLP(D, FF)),
               "attention": (lambda: tp.ParallelSelfAttention(D, HEADS, g),
                             lambda: models.CausalSelfAttention(D, HEADS)),
               "embedding": (lambda: tp.VocabParallelEmbedding(V, D, g),
                             lambda: nn.Embedding(V, D))}
    for name, (make_par, make_dense) in scratch.items():
        with models.seeded(20):
            par = make_par()
        with models.seeded(20):
            dense_params = dict(make_dense().named_parameters())
        for pname, dim in tp.sharding(par).items():
            want = dense_params[pname] if dim is None else tp.shard_tensor(dense_params[pname], g, dim)
            errs[f"scratch {name} {pname}"] = _err(par.get_parameter(pname).detach(),
                                                   want.detach())
    # from_dense draws nothing from torch's RNG
    with models.seeded(21):
        before = torch.rand(1)
    with models.seeded(21):
        tp.ParallelMLP.from_dense(blocks["mlp"], g)
        tp.ParallelSelfAttention.from_dense(blocks["attention"], g)
        tp.VocabParallelEmbedding.from_dense(dense_emb, g)
        after = torch.rand(1)
    errs["from_dense leaves the RNG alone"] = _err(after, before)
    return errs, comm


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def layers(request, warm):
    """One launch per tp size for every layer test: 4 ranks, so tp=2 runs two tp groups."""
    res = dl.launch(all_layer_checks, request.param, world_size=4, stream=False)
    return request.param, res


def all_layer_checks(tp_size: int):
    torch.set_default_dtype(torch.float64)
    grid = dl.ProcessGrid(dp=dist.get_world_size() // tp_size, tp=tp_size)
    errs, comm = layer_checks(grid)
    return errs, comm, versus_dtensor(grid)


def test_every_layer_matches_its_dense_module_in_fp64(layers):
    tp_size, res = layers
    for rank, (errs, _, _) in enumerate(res.values):
        assert len(errs) == 67   # every check of layer_checks ran
        bad = {k: v for k, v in errs.items() if not v <= TOL}
        assert not bad, f"tp={tp_size}, rank {rank}: {bad}"


def expected_comm(tp_size: int) -> dict[str, dict]:
    """Megatron's communication per layer, {name: {(op, phase): (calls, bytes)}}, all on tp."""
    act = B * T * D * F64                      # one (B, T, D) activation in fp64
    return {
        "copy_to": {("all_reduce", "backward"): (1, act)},
        "reduce_from": {("all_reduce", "forward"): (1, act)},
        "gather_from_tp": {("all_gather", "forward"): (1, B * T * 3 * F64)},
        "scatter_to_tp": {("all_gather", "backward"): (1, act // tp_size)},
        "gather_from_sequence": {("all_gather", "forward"): (1, act // tp_size),
                                 ("reduce_scatter", "backward"): (1, act)},
        "reduce_scatter_to_sequence": {("reduce_scatter", "forward"): (1, act),
                                       ("all_gather", "backward"): (1, act // tp_size)},
        "column gather_output=False": {("all_reduce", "backward"): (1, act)},
        "column gather_output=True": {("all_gather", "forward"): (1, B * T * FF * F64 // tp_size),
                                      ("all_reduce", "backward"): (1, act)},
        "row input_is_parallel=True": {("all_reduce", "forward"): (1, act)},
        "row input_is_parallel=False": {("all_reduce", "forward"): (1, act),
                                        ("all_gather", "backward"):
                                            (1, B * T * FF * F64 // tp_size)},
        "embedding": {("all_reduce", "forward"): (1, act)},
        "cross_entropy": {("all_reduce", "forward"): (3, 3 * B * T * F64)},
        "mlp": {("all_reduce", "forward"): (1, act), ("all_reduce", "backward"): (1, act)},
        "mlp, input without grad": {("all_reduce", "forward"): (1, act)},
        "attention": {("all_reduce", "forward"): (1, act), ("all_reduce", "backward"): (1, act)},
    }


def test_every_layer_communicates_as_megatron_on_the_tp_group(layers):
    tp_size, res = layers
    want = expected_comm(tp_size)
    for rank, (_, comm, _) in enumerate(res.values):
        assert set(comm) == set(want)
        for name, seen in comm.items():
            expected = {(op, "tp", phase): v for (op, phase), v in want[name].items()}
            assert seen == expected, f"tp={tp_size}, rank {rank}, {name}: {seen}"


# -- against torch's own tensor parallelism (DTensor) ----------------------------------------------


def versus_dtensor(grid: dl.ProcessGrid):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    with models.seeded(0):
        dense = models.MLP(D, FF)
    ours = tp.ParallelMLP.from_dense(dense, grid.tp_group)
    theirs = parallelize_module(copy.deepcopy(dense), grid.mesh["tp"],
                                {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x, w = _randn(B, T, D, seed=1), _randn(B, T, D, seed=2)
    out = {}
    for name, mlp in (("ours", ours), ("dtensor", theirs)):
        xl = _leaf(x)
        with dl.trace() as t:
            y = mlp(xl)
            (y * w).sum().backward()
        grads = {n: p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for n, p in mlp.named_parameters()}
        out[name] = (y, xl.grad, grads, _calls(t, grid))
    return out


def test_parallel_mlp_equals_torch_dtensor_colwise_rowwise(layers):
    _, res = layers
    act = B * T * D * F64
    for rank, (_, _, out) in enumerate(res.values):
        (y, xg, grads, calls), (ty, txg, tgrads, tcalls) = out["ours"], out["dtensor"]
        assert _err(y, ty) <= TOL and _err(xg, txg) <= TOL, rank
        assert set(grads) == set(tgrads) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
        for name in grads:
            assert _err(grads[name], tgrads[name]) <= TOL, (rank, name)
        assert calls == tcalls == {("all_reduce", "tp", "forward"): (1, act),
                                   ("all_reduce", "tp", "backward"): (1, act)}, (rank, calls)


# -- a whole TinyGPT -------------------------------------------------------------------------------

GPT = models.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=4, n_layers=2, d_ff=32)
STEPS = 3


def gpt_checks():
    torch.set_default_dtype(torch.float64)
    grid = dl.ProcessGrid(tp=dist.get_world_size())
    g = grid.tp_group
    dense = models.TinyGPT(GPT, seed=0)
    par = tp.parallelize_gpt(models.TinyGPT(GPT, seed=0), g)
    dims = tp.sharding(par)
    opt_d = torch.optim.AdamW(dense.parameters(), lr=1e-2)
    opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2)
    errs: dict[str, float] = {}
    for step in range(STEPS):
        idx, targets = models.token_batch(4, GPT.seq_len, GPT.vocab_size, seed=step)
        loss_d = models.lm_loss(dense(idx), targets)
        loss_d.backward()
        with dl.trace() as t:
            logits = par(idx)
            loss = tp.vocab_parallel_cross_entropy(logits, targets, g)
            loss.backward()
        errs[f"step {step} loss"] = _err(loss, loss_d)
        if step == 0:
            comm = _calls(t, grid)
            shape = tuple(logits.shape)
            _grad_errors("gpt", par, dense, g, errs)
            replicated = {n: p.grad.clone() for n, p in par.named_parameters()
                          if dims[n] is None}
        for opt in (opt_d, opt_p):
            opt.step()
            opt.zero_grad()
    dense_params = dict(dense.named_parameters())
    for name, dim in dims.items():
        want = dense_params[name] if dim is None else tp.shard_tensor(dense_params[name], g, dim)
        errs[f"after {STEPS} AdamW steps: {name}"] = _err(par.get_parameter(name).detach(),
                                                          want.detach())

    # a deep copy has its own parameters and shares the tp group: it computes the same loss
    twin = copy.deepcopy(par)
    idx, targets = models.token_batch(4, GPT.seq_len, GPT.vocab_size, seed=8)
    errs["deepcopy loss"] = _err(tp.vocab_parallel_cross_entropy(twin(idx), targets, g),
                                 tp.vocab_parallel_cross_entropy(par(idx), targets, g))
    with pytest.warns(FutureWarning, match="vocab_parallel_cross_entropy"):   # the older name
        errs["tp_lm_loss, deprecated"] = _err(tp.tp_lm_loss(par(idx), targets, g),
                                              tp.vocab_parallel_cross_entropy(par(idx), targets, g))
    errs["deepcopy shares no parameter"] = float(any(
        a.data_ptr() == b.data_ptr() for a, b in zip(twin.parameters(), par.parameters(),
                                                     strict=True)))

    # vocab_parallel=False: embedding and head stay whole, the model returns full logits
    dense.zero_grad()
    half = tp.parallelize_gpt(copy.deepcopy(dense), g, vocab_parallel=False)
    idx, targets = models.token_batch(4, GPT.seq_len, GPT.vocab_size, seed=9)
    models.lm_loss(dense(idx), targets).backward()
    with dl.trace() as t:
        loss = models.lm_loss(half(idx), targets)
        loss.backward()
    errs["vocab_parallel=False loss"] = _err(loss, models.lm_loss(dense(idx), targets))
    _grad_errors("vocab_parallel=False", half, dense, g, errs)
    return errs, comm, _calls(t, grid), shape, replicated, dims


@pytest.mark.parametrize("world", [2, 4])
def test_parallelized_tiny_gpt_matches_dense_and_keeps_matching_under_adamw(warm, world):
    res = dl.launch(gpt_checks, world_size=world, stream=False)
    n_params = len(list(models.TinyGPT(GPT).parameters()))
    layers = GPT.n_layers
    for rank, (errs, comm, half_comm, shape, _, dims) in enumerate(res.values):
        # losses, grads, params, copy, the older name, no-vocab
        assert len(errs) == STEPS + 4 + 3 * n_params
        bad = {k: v for k, v in errs.items() if not v <= TOL}
        assert not bad, f"world {world}, rank {rank}: {bad}"
        assert shape == (4, GPT.seq_len, GPT.vocab_size // world)   # vocab-sharded logits
        # embedding g + (attention, MLP) per block + the vocab-parallel loss;
        # backward: f per block + head's f
        act = 4 * GPT.seq_len * GPT.d_model * F64
        per_token = 4 * GPT.seq_len * F64
        assert comm == {("all_reduce", "tp", "forward"): (2 * layers + 1 + 3,
                                                          (2 * layers + 1) * act + 3 * per_token),
                        ("all_reduce", "tp", "backward"): (2 * layers + 1, (2 * layers + 1) * act)}
        assert half_comm == {("all_reduce", "tp", "forward"): (2 * layers, 2 * layers * act),
                             ("all_reduce", "tp", "backward"): (2 * layers, 2 * layers * act)}
        replicated = {n for n, d in dims.items() if d is None}
        assert {"embed.pos.weight", "head.ln.weight", "blocks.0.ln1.bias",
                "blocks.1.mlp.fc2.bias", "blocks.1.attn.o.bias"} <= replicated
        assert "head.proj.weight" not in replicated and "embed.tok.weight" not in replicated
    # replicated parameters get the very same gradient on every tp rank
    first = res.values[0][4]
    for rank, values in enumerate(res.values[1:], start=1):
        for name, grad in values[4].items():
            assert torch.equal(grad, first[name]), f"rank {rank}: grad {name} differs from rank 0"


# -- bad input -------------------------------------------------------------------------------------


def bad_inputs():
    g = dl.ProcessGrid(tp=dist.get_world_size()).tp_group
    col, row = tp.ColumnParallelLinear(8, 8, g), tp.RowParallelLinear(8, 8, g)
    emb = tp.VocabParallelEmbedding(8, 4, g)
    logits, targets = torch.randn(3, 4), torch.tensor([0, 1, 7])
    cases = {
        "heads": lambda: tp.ParallelSelfAttention(12, 3, g),
        "column uneven": lambda: tp.ColumnParallelLinear(8, 7, g),
        "row uneven": lambda: tp.RowParallelLinear(7, 8, g),
        "vocab uneven": lambda: tp.VocabParallelEmbedding(15, 4, g),
        "mlp uneven": lambda: tp.ParallelMLP(8, 9, g),
        "scatter uneven": lambda: tp.scatter_to_tp_region(torch.ones(3, 5), g),
        "reduce_scatter uneven": lambda: tp.reduce_scatter_to_sequence_region(
            torch.ones(2, 3, 4), g),
        "shard uneven": lambda: tp.shard_tensor(torch.ones(5), g, 0),
        "sequence dim": lambda: tp.gather_from_sequence_region(torch.ones(2, 2, 2), g, dim=3),
        "column shape": lambda: col(torch.ones(2, 6)),
        "row shape": lambda: row(torch.ones(2, 8)),
        "row whole shape": lambda: tp.RowParallelLinear(8, 8, g, input_is_parallel=False)(
            torch.ones(2, 4)),
        "attention shape": lambda: tp.ParallelSelfAttention(8, 2, g)(torch.ones(1, 2, 4)),
        "ids dtype": lambda: emb(torch.ones(2)),
        "ids range": lambda: emb(torch.tensor([0, 8])),
        "targets shape": lambda: tp.vocab_parallel_cross_entropy(logits, targets[:2], g),
        "targets range": lambda: tp.vocab_parallel_cross_entropy(logits, targets + 1, g),
        "targets dtype": lambda: tp.vocab_parallel_cross_entropy(logits, targets.float(), g),
        "group": lambda: tp.copy_to_tp_region(torch.ones(2), None),
        "layer group": lambda: tp.ColumnParallelLinear(8, 8, "tp"),
        "not a tensor": lambda: tp.reduce_from_tp_region([1.0, 2.0], g),
        "from_dense type": lambda: tp.ParallelMLP.from_dense(nn.Linear(2, 2), g),
        "from_dense linear": lambda: tp.RowParallelLinear.from_dense(models.MLP(8, 8), g),
        "gpt type": lambda: tp.parallelize_gpt(nn.Linear(2, 2), g),
    }
    out = {}
    for name, case in cases.items():
        try:
            case()
        except Exception as exc:   # every case is expected to raise
            out[name] = (type(exc).__name__, str(exc))
        else:
            out[name] = ("no error", "")
    # a model whose heads do not split is refused before anything in it is replaced
    model = models.TinyGPT(models.GPTConfig(d_model=12, n_heads=3), seed=0)
    try:
        tp.parallelize_gpt(model, g)
    except ValueError as exc:
        out["gpt heads"] = ("ValueError", str(exc))
    untouched = all(type(b.attn) is models.CausalSelfAttention for b in model.blocks) and \
        type(model.embed.tok) is nn.Embedding
    return out, untouched


def test_bad_input_is_a_clear_error_not_a_hang(warm):
    res = dl.launch(bad_inputs, world_size=2, stream=False)
    want = {
        "heads": ("ValueError", r"n_heads=3 does not split over tp=2"),
        "column uneven": ("ValueError", r"out_features = 7 does not split evenly over 2"),
        "row uneven": ("ValueError", r"in_features = 7 does not split evenly over 2"),
        "vocab uneven": ("ValueError", r"num_embeddings = 15 does not split evenly"),
        "mlp uneven": ("ValueError", r"out_features = 9"),
        "scatter uneven": ("ValueError", r"last dim = 5 does not split evenly"),
        "reduce_scatter uneven": ("ValueError", r"dim 1 \(the sequence\) = 3 does not split"),
        "shard uneven": ("ValueError", r"dim 0 = 5 does not split evenly"),
        "sequence dim": ("ValueError", r"dim=3 is out of range"),
        "column shape": ("ValueError", r"last dim is 8, got shape \(2, 6\)"),
        "row shape": ("ValueError", r"last dim is 4.*input_is_parallel=False"),
        "row whole shape": ("ValueError", r"last dim is 8, got shape \(2, 4\)"),
        "attention shape": ("ValueError", r"last dim is 8, got shape \(1, 2, 4\)"),
        "ids dtype": ("TypeError", r"integer tensor"),
        "ids range": ("ValueError", r"\[0, 8\), got values from 0 to 8"),
        "targets shape": ("ValueError", r"agree on the leading dims"),
        "targets range": ("ValueError", r"\[0, 8\), got values from 1 to 8"),
        "targets dtype": ("TypeError", r"integer tensor"),
        "group": ("TypeError", r"ProcessGroup"),
        "layer group": ("TypeError", r"ProcessGroup.*not str"),
        "not a tensor": ("TypeError", r"torch.Tensor, not list"),
        "from_dense type": ("TypeError", r"needs a dpmp_lab.models.MLP, not Linear"),
        "from_dense linear": ("TypeError", r"needs a nn.Linear, not MLP"),
        "gpt type": ("TypeError", r"TinyGPT, not Linear"),
        "gpt heads": ("ValueError", r"n_heads=3 does not split over tp=2"),
    }
    for rank, (out, untouched) in enumerate(res.values):
        assert set(out) == set(want)
        for name, (kind, pattern) in want.items():
            got_kind, message = out[name]
            assert got_kind == kind and re.search(pattern, message), (rank, name, out[name])
        assert untouched, "parallelize_gpt changed the model before refusing it"


def test_region_ops_with_one_rank_are_the_identity_and_silent(warm):
    res = dl.launch(one_rank, world_size=1, stream=False)
    out, calls = res.values[0]
    assert calls == 0
    assert all(out.values()), out


def one_rank():
    g = dist.group.WORLD
    x = torch.randn(2, 3, 4, requires_grad=True)
    with dl.trace() as t:
        ops = {"copy_to": tp.copy_to_tp_region(x, g), "reduce_from": tp.reduce_from_tp_region(x, g),
               "gather_from": tp.gather_from_tp_region(x, g),
               "scatter_to": tp.scatter_to_tp_region(x, g),
               "gather_from_sequence": tp.gather_from_sequence_region(x, g),
               "reduce_scatter_to_sequence": tp.reduce_scatter_to_sequence_region(x, g)}
        sum(y.sum() for y in ops.values()).backward()
        logits, targets = torch.randn(5, 6), torch.tensor([0, 1, 2, 3, 5])
        loss = tp.vocab_parallel_cross_entropy(logits, targets, g)
    same = {name: torch.equal(y, x) for name, y in ops.items()}
    same["grad"] = torch.equal(x.grad, torch.full_like(x, 6.0))
    same["cross entropy"] = torch.allclose(loss, F.cross_entropy(logits, targets))
    return same, t.count()
