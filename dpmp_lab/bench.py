"""Measuring distributed training: time inside ranks, sweep collectives, fit a network model,
profile a step.

    t = dl.bench.time_in_ranks(step, warmup=2, repeats=5)       # inside a rank: a Timing
    table = dl.bench.sweep(["all_reduce"], [2**12, 2**20], [2, 4])   # in the notebook: a Sweep
    fit = dl.bench.fit_alpha_beta(table.rows)                   # T = steps * alpha + wire / beta
    fit.predict("all_reduce", 2**22, 4)                         # seconds, from the ring model
    out, prof = dl.bench.profile(step)                          # inside a rank: a Profile

A step is as slow as its slowest rank, so every repeat is timed between barriers and reduced
with the max over ranks; the median over repeats is the figure to quote (robust to the other
processes on a shared machine), the min the least disturbed one.

The network model is the alpha-beta (latency-bandwidth) model: one message of n bytes costs
alpha + n / beta. A ring collective over N ranks is a sequence of such messages: all-reduce is
2 (N - 1) steps of n / N bytes, all-gather and reduce-scatter N - 1 steps (n is the full tensor).
A binomial-tree all-reduce ("tree_all_reduce": reduce to a root, then broadcast) is
2 ceil(log2 N) rounds of the whole n bytes. So T = steps * alpha + wire / beta, with wire the
bytes a rank sends one after another, is linear in (alpha, 1 / beta) and one least-squares fit
over every measured size and world size gives both. The fit weights each row
by 1 / T (it minimises relative residuals): sizes span orders of magnitude, and an unweighted
fit would let the largest message decide alpha, which then predicts small messages badly.

`profile` (from dpmp_lab.profiling) runs one call under torch.profiler and reduces its events
to compute and communication intervals; `dl.viz.profile` draws them per rank.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from dpmp_lab._helpers import whole_number
from dpmp_lab.context import device, synchronize
from dpmp_lab.i18n.messages import _
from dpmp_lab.launcher.launch import launch
from dpmp_lab.profiling import Interval, Profile, profile
from dpmp_lab.render import Table, human_bytes

__all__ = ["AlphaBeta", "Interval", "Profile", "Sweep", "SweepRow", "Timing", "fit_alpha_beta",
           "matmul_flops", "profile", "ring_steps", "scaling", "sweep", "time_collective",
           "time_in_ranks", "train_flops", "tree_steps"]

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter")


# -- timing inside ranks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds per repeat on every rank: per_rank[r][i] is rank r's time for repeat i."""

    per_rank: list[list[float]]

    @property
    def per_repeat(self) -> list[float]:
        """Each repeat's time: the slowest rank's, since the step waits for it."""
        return [max(times) for times in zip(*self.per_rank, strict=True)]

    @property
    def median(self) -> float:
        return statistics.median(self.per_repeat)

    @property
    def min(self) -> float:
        return min(self.per_repeat)

    def __repr__(self) -> str:
        return (f"Timing(median {self.median * 1e3:.3f} ms, min {self.min * 1e3:.3f} ms, "
                f"{len(self.per_repeat)} repeats on {len(self.per_rank)} ranks)")


def _check_counts(warmup: int, repeats: int) -> None:
    whole_number("warmup", warmup, at_least=0)
    whole_number("repeats", repeats, at_most=1000)


def time_in_ranks(fn: Callable[..., Any], *args: Any, warmup: int = 2, repeats: int = 5,
                  group: dist.ProcessGroup | None = None, **kwargs: Any) -> Timing:
    """Time `fn(*args, **kwargs)` on every rank of `group` (inside a rank; every rank calls it).

    `warmup` untimed calls first (allocations, first-call setup), then `repeats` timed ones,
    each started after a barrier so that all ranks start together, and ended after the device
    finished its queued work. Every rank gets the same Timing: all ranks' times, gathered.
    """
    _check_counts(warmup, repeats)
    for _step in range(warmup):
        fn(*args, **kwargs)
    synchronize()
    mine = []
    for _repeat in range(repeats):
        dist.barrier(group=group)
        start = time.perf_counter()
        fn(*args, **kwargs)
        synchronize()
        mine.append(time.perf_counter() - start)
    size = dist.get_world_size(group)
    local = torch.tensor(mine, dtype=torch.float64, device=device())
    gathered = torch.empty(size * repeats, dtype=torch.float64, device=device())
    dist.all_gather_single(gathered, local, group=group)
    return Timing(gathered.view(size, repeats).tolist())


# -- collectives against size and world size ----------------------------------------------------


def ring_steps(op: str, world_size: int) -> int:
    """Messages each rank sends in a ring `op` over world_size ranks: 2 (N - 1) for all-reduce
    (reduce-scatter, then all-gather), N - 1 for all-gather and reduce-scatter, 1 for a "message"
    (one send to one peer)."""
    whole_number("world_size", world_size)
    if op == "message":
        return 1
    if op not in RING_OPS:
        raise ValueError(_("ring_steps knows {ops} and 'message', not {op!r}").format(
            ops=", ".join(RING_OPS), op=op))
    return (2 if op == "all_reduce" else 1) * (world_size - 1)


def tree_steps(world_size: int) -> int:
    """Rounds of a binomial-tree all-reduce over world_size ranks: ceil(log2 N) to reduce to a
    root (each round halves the ranks holding a partial sum), as many to broadcast back."""
    whole_number("world_size", world_size)
    return 2 * (world_size - 1).bit_length()


def _steps(op: str, world_size: int) -> int:
    return tree_steps(world_size) if op == "tree_all_reduce" else ring_steps(op, world_size)


def _wire_bytes(op: str, nbytes: float, world_size: int) -> float:
    """Bytes each rank sends one after another: every ring step carries n / N bytes, every tree
    round the whole buffer."""
    if op == "message":
        return nbytes
    if op == "tree_all_reduce":
        return tree_steps(world_size) * nbytes
    return ring_steps(op, world_size) * nbytes / world_size


def time_collective(op: str, nbytes: int, *, warmup: int = 2, repeats: int = 5,
                    group: dist.ProcessGroup | None = None) -> Timing:
    """Time one collective of `nbytes` (the full tensor: all-reduce's buffer, all-gather's
    output, reduce-scatter's input) on `group`, inside a rank. fp32 data on dl.device()."""
    if op not in RING_OPS:
        raise ValueError(_("time_collective times {ops}, not {op!r}").format(
            ops=", ".join(RING_OPS), op=op))
    size = dist.get_world_size(group)
    if nbytes < 4 * size or nbytes % (4 * size):
        raise ValueError(_("nbytes={nbytes}: use a multiple of 4 x world size ({step}) bytes, "
                           "so that every rank's share is whole fp32 numbers").format(
            nbytes=nbytes, step=4 * size))
    full = torch.ones(nbytes // 4, device=device())
    part = torch.ones(nbytes // 4 // size, device=device())
    run = {"all_reduce": lambda: dist.all_reduce(full, group=group),
           "all_gather": lambda: dist.all_gather_single(full, part, group=group),
           "reduce_scatter": lambda: dist.reduce_scatter_single(part, full, group=group)}[op]
    return time_in_ranks(run, warmup=warmup, repeats=repeats, group=group)


class SweepRow(NamedTuple):
    """One measured point: `seconds` is the median over repeats of the slowest rank.

    Its bandwidths are nccl-tests' (doc/PERFORMANCE.md there): algbw = size / time, with size
    the full tensor as in time_collective; busbw = algbw x 2(N-1)/N for all-reduce and
    x (N-1)/N for all-gather and reduce-scatter, the bytes each rank's link carries per second,
    comparable with the hardware's peak whatever the number of ranks (the ring's wire bytes
    over the time)."""

    op: str
    world_size: int
    nbytes: int
    seconds: float
    min_seconds: float

    @property
    def algbw(self) -> float:
        """Bytes per second of the collective's size, at the median time."""
        return self.nbytes / self.seconds

    @property
    def busbw(self) -> float:
        """Bytes per second on each rank's link, at the median time."""
        return _wire_bytes(self.op, self.nbytes, self.world_size) / self.seconds


def _sweep_in_rank(ops: Sequence[str], sizes: Sequence[int], warmup: int,
                   repeats: int) -> list[SweepRow]:
    rows = []
    for op in ops:
        for n in sizes:
            t = time_collective(op, n, warmup=warmup, repeats=repeats)
            rows.append(SweepRow(op, dist.get_world_size(), n, t.median, t.min))
    return rows


@dataclass
class Sweep:
    """A table of collective times: one SweepRow per (op, world size, size)."""

    rows: list[SweepRow]

    def select(self, op: str | None = None, world_size: int | None = None) -> list[SweepRow]:
        return [r for r in self.rows if (op is None or r.op == op)
                and (world_size is None or r.world_size == world_size)]

    def table(self) -> Table:
        return Table([_("op"), _("ranks"), _("size"), _("median ms"), _("min ms"), "algbw GB/s",
                      "busbw GB/s"],
                     [[r.op, r.world_size, human_bytes(r.nbytes), f"{r.seconds * 1e3:.3f}",
                       f"{r.min_seconds * 1e3:.3f}", f"{r.algbw / 1e9:.2f}",
                       f"{r.busbw / 1e9:.2f}"]
                      for r in self.rows],
                     title=_("collective sweep (nccl-tests' algbw and busbw, at the median)"))

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def __repr__(self) -> str:
        return str(self.table())


def sweep(ops: Sequence[str], sizes: Sequence[int], world_sizes: Sequence[int], *,
          warmup: int = 2, repeats: int = 5, timeout: float = 120) -> Sweep:
    """Time every op at every size (bytes) on every world size: one launch per world size.

    Called from the notebook. Each launch runs every (op, size) in a loop bounded by
    len(ops) x len(sizes) x (warmup + repeats) calls.
    """
    _check_counts(warmup, repeats)
    if not ops or not sizes or not world_sizes:
        raise ValueError(_("sweep needs at least one op, one size and one world size"))
    for op in ops:
        ring_steps(op, 1)
    for w in world_sizes:
        whole_number(_("a world size of the sweep"), w, at_least=2,
                     what=_("world_sizes {sizes}: a collective needs 2 ranks or more").format(
                         sizes=list(world_sizes)))
    rows: list[SweepRow] = []
    for w in world_sizes:
        bad = [n for n in sizes if n < 4 * w or n % (4 * w)]
        if bad:
            raise ValueError(_("sizes {bad} do not split into whole fp32 shares over {w} "
                               "ranks").format(bad=bad, w=w))
        res = launch(_sweep_in_rank, list(ops), list(sizes), warmup, repeats, world_size=w,
                     timeout=timeout, stream=False)
        rows.extend(res.values[0])
    return Sweep(rows)


# -- the alpha-beta model -----------------------------------------------------------------------


@dataclass(frozen=True)
class AlphaBeta:
    """The fitted network: alpha seconds per message, beta bytes per second on the wire.

    `residuals`: (measured - predicted) / measured for each row of the fit, in its order.
    """

    alpha: float
    beta: float
    residuals: tuple[float, ...] = ()

    def predict(self, op: str, nbytes: float, world_size: int) -> float:
        """Seconds for `op` of nbytes over world_size ranks: steps * alpha + wire / beta (a ring
        op, "tree_all_reduce" or "message")."""
        return (_steps(op, world_size) * self.alpha
                + _wire_bytes(op, nbytes, world_size) / self.beta)

    def __repr__(self) -> str:
        worst = max((abs(r) for r in self.residuals), default=0.0)
        return (f"AlphaBeta(alpha={self.alpha * 1e6:.1f} us per message, "
                f"beta={self.beta / 1e9:.3g} GB/s, worst residual {worst:.0%})")


def fit_alpha_beta(rows: Iterable[Any], *, relative: bool = True) -> AlphaBeta:
    """Least-squares fit of T = steps * alpha + wire / beta to measured (op, world_size, nbytes,
    seconds) rows (SweepRows or tuples), each weighted by 1 / T: relative residuals (with
    relative=False, absolute ones: the largest messages then decide, kept to show why not).

    Needs at least two rows with different wire/steps ratios (sizes), else alpha and beta
    cannot be told apart.
    """
    ops, worlds, sizes, times = [], [], [], []
    for row in rows:
        op, w, n, t = tuple(row)[:4]
        if not t > 0:
            raise ValueError(_("measured time {t!r} for {op} of {n} bytes: times must be "
                               "> 0").format(t=t, op=op, n=n))
        ops.append(op)
        worlds.append(w)
        sizes.append(n)
        times.append(t)
    design = torch.tensor([[_steps(op, w), _wire_bytes(op, n, w)]
                           for op, w, n in zip(ops, worlds, sizes, strict=True)],
                          dtype=torch.float64)
    if len(times) < 2 or torch.linalg.matrix_rank(design) < 2:
        raise ValueError(_("fit_alpha_beta needs at least two sizes (per message, the wire "
                           "bytes must differ) to tell latency from bandwidth"))
    t = torch.tensor(times, dtype=torch.float64)
    scale = design.abs().max(dim=0).values            # conditioning: columns of order 1
    weight = t if relative else torch.ones_like(t)
    solution = torch.linalg.lstsq((design / scale) / weight[:, None], (t / weight)[:, None],
                                  driver="gelsd").solution[:, 0] / scale
    alpha, inverse_beta = solution.tolist()
    if not inverse_beta > 0:
        raise ValueError(_("the fitted time does not grow with size (1/beta <= 0): measure "
                           "sizes further apart, or more repeats"))
    predicted = design @ solution
    return AlphaBeta(alpha, 1 / inverse_beta, tuple(((t - predicted) / t).tolist()))


# -- scaling --------------------------------------------------------------------------------------


def scaling(times: Mapping[int, float], *, weak: bool = False) -> dict[int, tuple[float, float]]:
    """{N: (speed-up, efficiency)} from {N: seconds per step}, which must hold N = 1.

    Strong scaling runs the same global batch on N ranks, weak scaling N times that batch (the
    same batch per rank). The speed-up is work per second against one rank; the efficiency is
    the time a perfect run would take (T(1) / N strong, T(1) weak) over the time measured."""
    if 1 not in times:
        raise ValueError(_("scaling needs the 1-rank time as its baseline; got ranks "
                           "{ranks}").format(ranks=sorted(times)))
    t1 = times[1]
    return {n: ((n if weak else 1) * t1 / t, (t1 if weak else t1 / n) / t)
            for n, t in times.items()}


# -- FLOPs ----------------------------------------------------------------------------------------


def train_flops(n_params: float, tokens: float, *, n_layers: int = 0, d_model: int = 0,
                seq_len: int = 0) -> float:
    """FLOPs of one training step on `tokens` tokens: 6 Psi D for the Psi weights that multiply
    activations (2 per weight and token forward, 4 backward), plus attention's score products,
    which have no weights: 12 L S d per token (Q K^T and scores V, 2 S d each per layer
    forward, 3x that for training; d = heads x head size, the full S x S matrix counted as
    dense kernels compute it). PaLM (Chowdhery et al. 2022), appendix B."""
    return 6 * n_params * tokens + 12 * n_layers * d_model * seq_len * tokens


def matmul_flops(n: int = 1024, *, repeats: int = 3, dtype: torch.dtype = torch.float32,
                 dev: torch.device | str | None = None) -> float:
    """Measured FLOP/s of an n x n matmul (2 n^3 FLOPs), the best of `repeats`: a stand-in
    for the device's peak where no data sheet applies (a laptop CPU)."""
    _check_counts(0, repeats)
    dev = torch.device(dev) if dev is not None else torch.device("cpu")
    a = torch.randn(n, n, dtype=dtype).to(dev)
    b = torch.randn(n, n, dtype=dtype).to(dev)
    a @ b
    best = math.inf
    for _repeat in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
