"""Running a pipeline schedule on real ranks: cut the model into stages, one per rank, and let
each stage run its part of the schedule, talking to its two neighbours.

    stage = pp.Stage(stages[grid.pp_rank], grid.pp_group, activation_shape=(2, 16, 32))
    result = pp.run_schedule("1f1b", stage, idx, targets, n_microbatches=4, loss_fn=lm_loss)

With virtual stages a rank holds several Stages (chunks) and runs them all:

    stages = [pp.Stage(pieces[c * p + r], group, activation_shape=shape, chunk=c, n_chunks=2)
              for c in range(2)]
    result = pp.run_schedule("interleaved", stages, idx, targets, n_microbatches=8, ...)

run_schedule sends with isend and receives with blocking recv: in 1F1B's steady state two
neighbours both want to send first (one an activation, the other a gradient), and with two
blocking sends they would wait for each other forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab._helpers import whole_number
from dpmp_lab._torch_helpers import group_ready, resolve_group
from dpmp_lab.context import device as rank_device
from dpmp_lab.i18n.messages import _
from dpmp_lab.pp.schedules import Schedule, Span
from dpmp_lab.pp.tables import make_schedule

__all__ = ["PipelineResult", "Stage", "run_schedule", "split_pieces"]

# -- splitting a model into stages ------------------------------------------------------------


def split_pieces(pieces: Sequence[nn.Module], n_stages: int,
                 boundaries: Sequence[int] | None = None) -> list[nn.Sequential]:
    """Cut a list of consecutive pieces into n_stages runs, one nn.Sequential per stage.

    Without boundaries the cut is balanced by count (the first stages take one more piece when
    it does not divide). boundaries=[b1, ...] gives the index of the first piece of stage 1, 2,
    ...: for TinyGPT's [embed, block0, block1, head], boundaries=[2] gives [embed, block0] and
    [block1, head]. The stages share the pieces' parameters (nothing is copied), so gradients
    land in the original model.
    """
    pieces = list(pieces)
    whole_number("n_stages", n_stages, what=_("a pipeline needs at least 1 stage"))
    for i, piece in enumerate(pieces):
        if not isinstance(piece, nn.Module):
            raise TypeError(_("piece {i} is a {kind}, not an nn.Module").format(
                i=i, kind=type(piece).__name__))
    if len(pieces) < n_stages:
        raise ValueError(_("{pieces} pieces cannot fill {n_stages} pipeline stages: every "
                           "stage needs at least one piece (use fewer stages or a deeper "
                           "model)").format(pieces=len(pieces), n_stages=n_stages))
    if boundaries is None:
        base, extra = divmod(len(pieces), n_stages)
        sizes = [base + (1 if s < extra else 0) for s in range(n_stages)]
        cuts = [sum(sizes[:s]) for s in range(1, n_stages)]
    else:
        cuts = [int(b) for b in boundaries]
        if len(cuts) != n_stages - 1:
            raise ValueError(_("{n_stages} stages need {n} boundaries (where stages 1..{n} "
                               "start), got {got}: {boundaries}").format(
                n_stages=n_stages, n=n_stages - 1, got=len(cuts), boundaries=list(boundaries)))
        edges = [0, *cuts, len(pieces)]
        if any(a >= b for a, b in zip(edges[:-1], edges[1:], strict=True)):
            raise ValueError(_("boundaries {cuts} must rise strictly between 0 and {pieces} "
                               "(exclusive), so that every stage gets a piece").format(
                cuts=cuts, pieces=len(pieces)))
    edges = [0, *cuts, len(pieces)]
    return [nn.Sequential(*pieces[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]


# -- running a schedule on real ranks ---------------------------------------------------------


class Stage:
    """One stage of the model on this rank: its layers, its place, and its two neighbours.

    `pp_group`: the ranks of this pipeline in order (ProcessGrid's pp_group; None = the whole
    world). `activation_shape`: the shape of one micro-batch's activation passed between
    stages, e.g. (micro_batch, seq_len, d_model). As in Megatron and picotron every boundary
    carries that one shape, so a receiver can allocate its buffer without asking first.
    Virtual stages (interleaved schedules): a rank holds n_chunks Stages, one per chunk; chunk
    c of the rank at position r is stage c * p + r of the model, so the last rank's chunk c
    hands its output to rank 0's chunk c + 1.
    (Not called PipelineStage: torch.distributed.pipelining.PipelineStage is another class,
    built from a submodule, stage index, stage count and device.)
    """

    def __init__(self, module: nn.Module, pp_group: dist.ProcessGroup | None = None, *,
                 activation_shape: Sequence[int], dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, chunk: int = 0,
                 n_chunks: int = 1):
        if not isinstance(module, nn.Module):
            raise TypeError(_("the stage's module must be an nn.Module, not {kind}").format(
                kind=type(module).__name__))
        if not group_ready():
            raise RuntimeError(_("a Stage talks to other ranks, so it must be built "
                                 "inside a rank (a function started by dl.launch)"))
        shape = tuple(activation_shape)
        if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
            raise ValueError(_("activation_shape must be positive ints, e.g. (2, 16, 32), not "
                               "{shape!r}").format(shape=activation_shape))
        whole_number("n_chunks", n_chunks, what=_("a rank holds at least 1 chunk"))
        whole_number("chunk", chunk, at_least=0, at_most=n_chunks - 1,
                     what=_("the chunks of a rank holding {n} are 0..{last}").format(
                         n=n_chunks, last=n_chunks - 1))
        params = [p for p in module.parameters() if p.is_floating_point()]
        self.module = module
        self.group = resolve_group(pp_group, "Stage")
        self.ranks: list[int] = dist.get_process_group_ranks(self.group)
        if dist.get_rank() not in self.ranks:
            raise ValueError(_("rank {rank} is not in the pipeline group {ranks}").format(
                rank=dist.get_rank(), ranks=self.ranks))
        self.index = self.ranks.index(dist.get_rank())     # this rank's row of the schedule
        self.n_ranks = len(self.ranks)                       # ranks in the pipeline (p)
        self.chunk, self.n_chunks = chunk, n_chunks
        self.model_stage = chunk * self.n_ranks + self.index
        self.n_model_stages = n_chunks * self.n_ranks
        k, p = self.model_stage, self.n_ranks
        self.prev_rank = self.ranks[(k - 1) % p] if k > 0 else None
        self.next_rank = self.ranks[(k + 1) % p] if k < self.n_model_stages - 1 else None
        self.activation_shape = shape
        self.dtype = dtype or (params[0].dtype if params else torch.get_default_dtype())
        self.device = torch.device(device) if device is not None else (
            params[0].device if params else rank_device())

    is_first = property(lambda self: self.prev_rank is None)
    is_last = property(lambda self: self.next_rank is None)

    def recv_activation(self, microbatch: int) -> torch.Tensor:
        """The previous stage's output for this micro-batch, as a leaf that collects its grad."""
        buf = self._empty()
        dist.recv(buf, src=self.prev_rank, group=self.group,
                  tag=self._tag(microbatch, self.model_stage, "activation"))
        return buf.requires_grad_()

    def recv_grad(self, microbatch: int) -> torch.Tensor:
        """d loss / d (this stage's output) for this micro-batch, from the next stage."""
        buf = self._empty()
        dist.recv(buf, src=self.next_rank, group=self.group,
                  tag=self._tag(microbatch, self.model_stage, "grad"))
        return buf

    def send_activation(self, out: torch.Tensor, microbatch: int) -> _Pending:
        if tuple(out.shape) != self.activation_shape or out.dtype != self.dtype:
            raise ValueError(_("stage {stage} produced an activation of shape {shape} "
                               "({dtype}), but the stages agreed on activation_shape={agreed} "
                               "({agreed_dtype}): each micro-batch has the rows the stages "
                               "were built for, batch / n_microbatches. Cut the batch the "
                               "step was handed into its n_microbatches micro-batches (not "
                               "another batch size or count), or fix activation_shape").format(
                stage=self.model_stage, shape=tuple(out.shape), dtype=out.dtype,
                agreed=self.activation_shape, agreed_dtype=self.dtype))
        return self._isend(out, self.next_rank,
                           self._tag(microbatch, self.model_stage + 1, "activation"))

    def send_grad(self, grad: torch.Tensor, microbatch: int) -> _Pending:
        if not isinstance(grad, torch.Tensor):
            raise TypeError(_(
                "stage {stage}: send_grad got {kind} for micro-batch {microbatch}, not a "
                "tensor. The gradient of this stage's input is what backward leaves in the "
                "input's .grad, and only an input that requires grad collects one: the "
                "received activation does (recv_activation returns it so); a copy, a detached "
                "view or a tensor made anew does not").format(
                    stage=self.model_stage, kind=type(grad).__name__, microbatch=microbatch))
        return self._isend(grad, self.prev_rank,
                           self._tag(microbatch, self.model_stage - 1, "grad"))

    def _tag(self, microbatch: int, to_stage: int, what: str) -> int:
        """The micro-batch; with chunks, two ranks exchange several kinds of message (p = 2:
        activations and gradients both ways), so the tag also names the receiving stage and
        gloo matches them whatever order a hand-written table sends them in. (NCCL ignores
        tags and matches a pair's messages in order; every table of pp.tables sends them in
        the order the receiver receives them.)"""
        if self.n_chunks == 1:
            return microbatch
        return (microbatch * self.n_model_stages + to_stage) * 2 + (what == "grad")

    def _empty(self) -> torch.Tensor:
        return torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> _Pending:
        payload = tensor.detach().contiguous()
        return _Pending(dist.isend(payload, dst=dst, group=self.group, tag=tag), payload)

    def __repr__(self) -> str:
        chunk = f", chunk {self.chunk} of {self.n_chunks}" if self.n_chunks > 1 else ""
        return (f"Stage({self.model_stage} of {self.n_model_stages}, ranks {self.ranks}"
                f"{chunk}, activation {self.activation_shape})")


class _Pending(NamedTuple):
    """An isend in flight: wait() before reusing or dropping what was sent."""

    work: Any
    tensor: torch.Tensor   # kept alive until the send completes

    def wait(self) -> None:
        self.work.wait()


@dataclass
class PipelineResult:
    """What one rank did in one pipeline step."""

    index: int      # this rank's place in the pipeline group (its stage, with one chunk)
    n_ranks: int    # ranks in the pipeline group (p)
    rank: int
    schedule: str
    losses: list[float] = field(default_factory=list)   # per micro-batch; last stage only
    spans: list[Span] = field(default_factory=list)      # compute time of each action (s)
    peak_in_flight: int = 0    # most micro-batches (x chunks) whose activations were held

    @property
    def loss(self) -> float | None:
        """The mean micro-batch loss = the full-batch loss (last stage; None elsewhere)."""
        return sum(self.losses) / len(self.losses) if self.losses else None


def run_schedule(schedule: Schedule | str, stage: Stage | Sequence[Stage],
                 inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None, *,
                 n_microbatches: int | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 after_last_backward: Callable[[], None] | None = None) -> PipelineResult:
    """Run this rank's part of one pipeline step (forward and backward of every micro-batch).

    Call it on every rank of the pipeline with the same schedule, and this rank's Stage (a
    list of them, one per chunk, for an interleaved schedule). `inputs` (the whole batch) is
    needed on the rank holding the model's first stage and `targets` with
    `loss_fn(output, targets)` on the one holding its last; other ranks ignore them. Both are
    cut into m equal micro-batches along dim 0. The last stage scales each micro-batch loss by
    1/m, so the gradients that accumulate in the stage's parameters (add to .grad, as
    loss.backward() does: zero them before) equal those of the full-batch mean loss.

    On a rank whose actions include W, B computes only the gradient of the stage's input (what
    the previous stage waits for) and keeps the autograd graph; W later computes the
    parameters' gradients from the same output gradient and frees the graph. W asks autograd
    for d loss / d parameters from the stage's output again, so inside a stage of several
    layers it walks back the path above each weight a second time; torch.distributed.pipelining
    (stage_backward_weight) instead keeps the gradients where the weights branch off. The
    numbers are the same either way.

    `after_last_backward()` runs right after this rank's last backward (or weight gradient),
    before the runner waits for its last sends: work that needs the step's whole gradients can
    start there, while the last messages are still in flight.
    """
    stages, schedule = _checked_stages_and_schedule(stage, schedule, n_microbatches)
    first, m = stages[0], schedule.n_microbatches
    xs, ys = _checked_batch(stages, m, inputs, targets, loss_fn)

    split = schedule.splits_backward[first.index]
    result = PipelineResult(first.index, first.n_ranks, dist.get_rank(), schedule.name)
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (chunk, mb) -> in, out
    out_grads: dict[tuple[int, int], torch.Tensor | None] = {}   # B done, W to come
    pending: list[_Pending] = []
    for action in schedule.actions[first.index]:
        j, here, key = action.microbatch, stages[action.chunk], (action.chunk, action.microbatch)
        if action.kind == "F":
            x = xs[j] if here.is_first else here.recv_activation(j)
            if here.is_first and split and x.is_floating_point():
                x = x.detach().requires_grad_()   # so B does here the work it does elsewhere
            start = time.perf_counter()
            out = here.module(x)
            if here.is_last:
                loss = loss_fn(out, ys[j])
                result.losses.append(loss.item())
                out = loss / m
            else:
                pending.append(here.send_activation(out, j))
            held[key] = (x, out)
            result.peak_in_flight = max(result.peak_in_flight, len(held))
        elif action.kind == "B":
            grad = None if here.is_last else here.recv_grad(j)
            start = time.perf_counter()
            x, out = held[key]
            if not split:
                del held[key]
                torch.autograd.backward(out, grad)
                x_grad = x.grad
            else:
                out_grads[key] = grad
                x_grad = torch.autograd.grad(out, x, grad, retain_graph=True)[0] \
                    if x.requires_grad else None
            if not here.is_first:
                pending.append(here.send_grad(x_grad, j))
        else:
            start = time.perf_counter()
            _, out = held.pop(key)
            _weight_gradients(here.module, out, out_grads.pop(key))
        result.spans.append(Span(action.kind, j, start, time.perf_counter(), action.chunk))
        pending = [p for p in pending if not p.work.is_completed()]
    if after_last_backward is not None:
        after_last_backward()
    for p in pending:
        p.work.wait()
    return result


# -- what run_schedule checks before it runs: every rank refuses the same bad call at once ----


def _checked_stages_and_schedule(stage: Stage | Sequence[Stage], schedule: Schedule | str,
                                 n_microbatches: int | None) -> tuple[list[Stage], Schedule]:
    """This rank's stages as a list in chunk order, and the schedule they run, checked to fit
    each other."""
    stages = [stage] if isinstance(stage, Stage) else list(stage) \
        if isinstance(stage, (list, tuple)) else stage
    if not isinstance(stages, list) or not stages or \
            not all(isinstance(s, Stage) for s in stages):
        raise TypeError(_("stage must be a Stage (or a list of them, one per chunk), not "
                          "{kind}").format(kind=type(stage).__name__))
    first = stages[0]
    if any(s.n_chunks != len(stages) for s in stages):
        raise ValueError(_("this rank passed {n} stage(s) built with n_chunks={n_chunks}: pass "
                           "one Stage per chunk, all {n_chunks} of them, in chunk order").format(
            n=len(stages), n_chunks=first.n_chunks))
    if [s.chunk for s in stages] != list(range(len(stages))) or \
            any(s.ranks != first.ranks for s in stages):
        got = ", ".join(_("chunk {chunk} of {n} on ranks {ranks}").format(
            chunk=s.chunk, n=s.n_chunks, ranks=s.ranks) for s in stages)
        raise ValueError(_("pass this rank's stages in chunk order, all on the same pipeline "
                           "group: got {stages}").format(stages=got))
    if isinstance(schedule, str):
        if n_microbatches is None:
            raise ValueError(_("a schedule given by name ({schedule!r}) needs "
                               "n_microbatches").format(schedule=schedule))
        schedule = make_schedule(schedule, first.n_ranks, n_microbatches,
                                 n_chunks=len(stages))
    elif not isinstance(schedule, Schedule):
        raise TypeError(_("schedule must be a Schedule or a name, not {kind}").format(
            kind=type(schedule).__name__))
    if n_microbatches is not None and n_microbatches != schedule.n_microbatches:
        raise ValueError(_("n_microbatches={n}, but the schedule has {m}").format(
            n=n_microbatches, m=schedule.n_microbatches))
    if schedule.n_ranks != first.n_ranks:
        raise ValueError(_("the schedule has {stages} stages but the pipeline group has {n} "
                           "ranks {ranks}").format(stages=schedule.n_ranks, n=first.n_ranks,
                                                   ranks=first.ranks))
    if schedule.n_chunks != len(stages):
        raise ValueError(_("the schedule runs {chunks} chunks per rank, but this rank passed "
                           "{n} stage(s): one Stage per chunk").format(
            chunks=schedule.n_chunks, n=len(stages)))
    if schedule.n_ranks == 1 and schedule.n_chunks > 1:
        raise ValueError(_("{chunks} chunks on a pipeline of one rank: every chunk follows the "
                           "one before on the same rank, so there is nothing to send between "
                           "them; run the chunks as one module (one Stage), or use p >= 2 "
                           "ranks").format(chunks=schedule.n_chunks))
    return stages, schedule


def _checked_batch(stages: list[Stage], m: int, inputs: torch.Tensor | None,
                   targets: torch.Tensor | None, loss_fn: Callable | None
                   ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """The inputs and targets cut into m micro-batches, where given; refused where a stage of
    this rank needs them and they are missing."""
    # checked wherever given (not only where used), so that ranks passing the same batch all
    # refuse it together instead of leaving their neighbours waiting
    xs = _microbatches(inputs, m, "inputs") if inputs is not None else None
    ys = _microbatches(targets, m, "targets") if targets is not None else None
    if any(s.is_first for s in stages) and xs is None:
        raise ValueError(_("the first stage needs the batch: pass inputs"))
    if any(s.is_last for s in stages) and (ys is None or loss_fn is None):
        raise ValueError(_("the last stage computes the loss: pass targets and loss_fn"))
    return xs, ys


def _weight_gradients(module: nn.Module, out: torch.Tensor, grad: torch.Tensor | None) -> None:
    """W: d loss / d parameters through `out`, added to .grad as backward() would."""
    params = [q for q in module.parameters() if q.requires_grad]
    if not params:
        return
    grads = torch.autograd.grad(out, params, grad, allow_unused=True)
    for q, g in zip(params, grads, strict=True):
        if g is not None:
            q.grad = g if q.grad is None else q.grad + g


def _microbatches(batch: torch.Tensor, m: int, name: str) -> list[torch.Tensor]:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(_("{name} must be a tensor, not {kind}").format(
            name=name, kind=type(batch).__name__))
    if batch.dim() == 0 or batch.shape[0] % m:
        rows = batch.shape[0] if batch.dim() else 0
        raise ValueError(_("{name} has {rows} rows, which do not split into {m} equal "
                           "micro-batches: the mean of micro-batch losses would not be the "
                           "full-batch loss (use a batch divisible by {m})").format(
            name=name, rows=rows, m=m))
    return list(batch.chunk(m))
