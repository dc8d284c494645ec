"""Record every collective and point-to-point operation a rank issues.

    with dl.trace() as t:
        loss = model(x).sum(); loss.backward()
    t.count("all_reduce", group="dp", phase="backward")    # -> 2
    t.summary()                                            # table: op, group, phase, calls, bytes

How it sees everything. Every torch.distributed operation, whoever issues it, ends in one of
the dispatcher ops of the `c10d` namespace (`c10d::allreduce_`, `c10d::send`, ...): python's
`dist.all_reduce`, functional collectives, DTensor's redistributions, and the C++ reducer of
torch's DistributedDataParallel, from any thread, in forward or inside autograd's backward.
While a trace is active we register a Python kernel for those ops on the dispatcher's
BackendSelect key, which every call passes through just before the CPU or CUDA kernel runs;
ours records a CommEvent and hands the call on. Other ops are untouched, so tracing costs
nothing per matmul; a TorchDispatchMode (what torch's CommDebugMode uses) runs Python for
every op and makes a tiny training step 1.7-1.9x slower (docs/library.md, benchmarks/trace.py).

What a CommEvent says:
- op: all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all,
  send, recv or barrier (coalesced variants count once: one call, several tensors).
- group: the global ranks of the process group, sorted; label: "dp"/"tp"/"pp" when the group
  comes from a ProcessGrid (or was named with dl.name_group), else None.
- nbytes: the payload of the call on this rank: the tensors it passes in (for all_gather its
  shard, for reduce_scatter and all_to_all the whole input, for broadcast the tensor on every
  rank) and, for a recv, the buffer it receives into. A barrier has 0.
- phase: "backward" when issued inside autograd's backward; "forward" while an nn.Module's
  forward runs (whatever the grad mode: FSDP gathers parameters under no_grad in a pre-forward
  hook, which counts as part of that forward) or while autograd records a graph (grad mode on
  and an input requires grad, or inside an autograd.Function's forward whose inputs need
  grad); None otherwise, e.g. a gradient all-reduce after backward returned.
- async_op: the caller gets a Work handle back instead of waiting (async_op=True, isend/irecv,
  DDP's bucketed all-reduces, functional collectives).
- peer: the other global rank of a send or recv, the root of broadcast/reduce/gather/scatter.

Why it stays whole: the events, the questions asked of them and the dispatcher hook that makes
them are the one mechanism dl.check trusts. integrity guards this module (and _Recorder) as a
unit, and the launcher hides this file's frames from a rank's traceback; split in two, the
trusted code would span a module neither of them knows.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dpmp_lab._torch_helpers import group_ready, tensors_in
from dpmp_lab.i18n.messages import _
from dpmp_lab.render import Table, human_bytes

__all__ = ["BackwardOverlap", "CommEvent", "GradReady", "OPS", "Trace", "matcher", "name_group",
           "trace", "traces_of", "watch_calls"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
       "all_to_all", "send", "recv", "barrier")

# c10d dispatcher op -> (normalised op, the argument holding this rank's payload, peer argument)
_C10D_OPS: dict[str, tuple[str, str | None, str | None]] = {
    "allreduce_": ("all_reduce", "tensors", None),
    "allreduce_coalesced_": ("all_reduce", "tensors", None),
    "allgather_": ("all_gather", "input_tensors", None),
    "_allgather_base_": ("all_gather", "input_tensor", None),
    "allgather_coalesced_": ("all_gather", "input_list", None),
    "allgather_into_tensor_coalesced_": ("all_gather", "inputs", None),
    "reduce_scatter_": ("reduce_scatter", "input_tensors", None),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor", None),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs", None),
    "broadcast_": ("broadcast", "tensors", "root_rank"),
    "reduce_": ("reduce", "tensors", "root_rank"),
    "gather_": ("gather", "input_tensors", "root_rank"),
    "scatter_": ("scatter", "input_tensors", "root_rank"),
    "alltoall_": ("all_to_all", "input_tensors", None),
    "alltoall_base_": ("all_to_all", "input", None),
    "send": ("send", "tensors", "dst"),
    "recv_": ("recv", "tensors", "src"),
    "recv_any_source_": ("recv", "tensors", None),
    "barrier": ("barrier", None, None),
    "monitored_barrier_": ("barrier", None, None),
}


@dataclass(frozen=True)
class CommEvent:
    """One collective or point-to-point call, as the calling rank issued it."""

    op: str
    group: tuple[int, ...]
    nbytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    phase: str | None
    async_op: bool
    label: str | None = None
    peer: int | None = None
    time: float = 0.0                    # time.perf_counter() when issued, in this rank
    backward_pass: int | None = None     # which backward (autograd graph task) issued it

    @property
    def group_label(self) -> str | tuple[int, ...]:
        """The group as people say it: "tp" when it has a name, else its ranks."""
        return self.label if self.label is not None else self.group


@dataclass(frozen=True)
class GradReady:
    """A parameter's gradient was computed (before it is added to .grad and before the
    parameter's post-accumulate hooks run): when, and in which backward pass."""

    name: str
    time: float
    backward_pass: int


@dataclass(frozen=True)
class BackwardOverlap:
    """How one backward pass's communication lined up with its gradients."""

    backward_pass: int
    grads: int                 # gradients computed in this pass
    last_grad: float           # when the last of them was computed
    calls: int                 # matching calls issued in this pass
    before_last_grad: int      # ... of which while gradients were still being computed
    first_call: float | None   # when the first matching call was issued
    async_before_last_grad: int = 0   # ... of those, asynchronous ones: the ones that can travel
    #                                   while backward goes on (a blocking call stops it)
    in_flight: int = 0         # the most asynchronous calls not yet waited for when backward
    #                            computed a gradient: what travelled while backward went on

    @property
    def overlapped(self) -> bool:
        return self.in_flight > 0


class Trace:
    """The CommEvents recorded while this trace was active, with ways to count them.

    Use it as a context manager inside a rank, or get one per rank from
    `dl.launch(fn, trace=True).traces`. Filters: `op` one of OPS; `group` a name ("tp"), a
    tuple of global ranks, or a ProcessGroup; `phase` "forward", "backward" or "none" (issued
    outside both). A filter left as None matches everything.

    `gradients_of=model` also records when each trainable parameter's gradient is computed
    in backward (`grads_ready`), so `overlap()` can tell communication that overlaps backward
    from communication that only starts once every gradient is there.
    """

    def __init__(self, gradients_of: torch.nn.Module | None = None) -> None:
        self.events: list[CommEvent] = []
        self.grads_ready: list[GradReady] = []
        self.waits: list[float] = []   # when the code waited on a Work handle (Work.wait)
        self.written: list[int] = []   # events whose tensor was written before any wait
        self._pending: list[tuple[int, list[tuple[Any, int]]]] = []   # async, not yet checked
        self.rank: int | None = None
        self.problems: list[str] = []   # tracer-internal errors; the user's calls still ran
        self._module = gradients_of
        self._handles: list[Any] = []

    def __enter__(self) -> Trace:
        if group_ready():
            self.rank = torch.distributed.get_rank()
        if self._module is not None:
            for name, p in self._module.named_parameters():
                if p.requires_grad:
                    self._handles.append(p.register_hook(self._grad_hook(name)))
            self._module = None   # a Trace travels back to the notebook: keep no model
        _recorder.start(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _recorder.stop(self)
        for handle in self._handles:
            handle.remove()
        self._handles, self._pending = [], []

    def __getstate__(self) -> dict[str, Any]:
        # a Trace travels back from a rank: the tensors it follows stay there
        return {**self.__dict__, "_handles": [], "_pending": []}

    def _grad_hook(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            self.grads_ready.append(GradReady(name, time.perf_counter(),
                                              torch._C._current_graph_task_id()))
        return hook

    def overlap(self, op: str | None = None, group: Any = None) -> list[BackwardOverlap]:
        """Per backward pass that computed gradients (needs `gradients_of=`): how many of its
        matching calls were issued while gradients were still being computed, how many of
        those asynchronously (a blocking call issued there holds backward until it is done),
        and how many were still in flight, not yet waited for, when backward computed a
        gradient (an asynchronous call waited for at once holds backward as a blocking one)."""
        out = []
        for pass_id in dict.fromkeys(g.backward_pass for g in self.grads_ready):
            grads = sorted(g.time for g in self.grads_ready if g.backward_pass == pass_id)
            calls = [ev for ev in self.select(op, group, "backward")
                     if ev.backward_pass == pass_id]
            started = sorted(ev.time for ev in calls if ev.async_op)
            waits = sorted(w for w in self.waits if started and w >= started[0])
            in_flight = max((sum(c < g for c in started) - sum(w < g for w in waits)
                             for g in grads), default=0)
            out.append(BackwardOverlap(
                pass_id, len(grads), grads[-1], len(calls),
                sum(ev.time < grads[-1] for ev in calls),
                min((ev.time for ev in calls), default=None),
                sum(ev.time < grads[-1] and ev.async_op for ev in calls), max(in_flight, 0)))
        return out

    # -- questions --------------------------------------------------------------------------

    def select(self, op: str | None = None, group: Any = None,
               phase: str | None = None) -> list[CommEvent]:
        """The events matching every filter given, in the order they were issued."""
        match = matcher(op, group, phase)
        return [ev for ev in self.events if match(ev)]

    def count(self, op: str | None = None, group: Any = None, phase: str | None = None) -> int:
        """How many calls match, e.g. `t.count("all_reduce", group="dp")`."""
        return len(self.select(op, group, phase))

    def bytes(self, op: str | None = None, group: Any = None, phase: str | None = None) -> int:
        """Total payload bytes of the matching calls (see CommEvent.nbytes)."""
        return sum(ev.nbytes for ev in self.select(op, group, phase))

    def unwaited(self) -> int:
        """How many asynchronous calls no handle's wait() followed: a result read before its
        wait() returned is whatever the buffer held then. A blocking call waits inside torch,
        so each one accounts for one of the waits recorded."""
        blocking = sum(not ev.async_op for ev in self.events)
        return max(0, sum(ev.async_op for ev in self.events) - (len(self.waits) - blocking))

    def written_in_flight(self) -> list[CommEvent]:
        """The asynchronous calls whose tensor the code changed in place before the first
        Work.wait() after the call (so before its own wait too): the communication may read or
        write that tensor until its wait() returns, so the result depends on timing. Tensors
        handed over as views are not followed (a write elsewhere in their storage is no race)."""
        return [self.events[i] for i in self.written]

    def per_group(self) -> dict[Any, dict[str, int]]:
        """{group: {op: calls}}, groups by name ("dp") when they have one, else by ranks."""
        out: dict[Any, Counter] = {}
        for ev in self.events:
            out.setdefault(ev.group_label, Counter())[ev.op] += 1
        return {g: dict(c) for g, c in out.items()}

    def summary(self) -> Table:
        """Calls and bytes per (op, group, phase): HTML in a notebook, text elsewhere."""
        rows: dict[tuple, list[int]] = {}
        for ev in self.events:
            row = rows.setdefault((ev.op, ev.group_label, ev.phase), [0, 0])
            row[0] += 1
            row[1] += ev.nbytes
        who = (_("rank {rank}").format(rank=self.rank) if self.rank is not None
               else _("this process"))
        return Table([_("op"), _("group"), _("phase"), _("calls"), _("bytes")],
                     [[*k, n, human_bytes(b)] for k, (n, b) in rows.items()],
                     title=_("communication issued by {who}").format(who=who))

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        counts = Counter(ev.op for ev in self.events)
        what = ", ".join(f"{n} {op}" for op, n in counts.items()) or "no communication"
        who = f"rank {self.rank}: " if self.rank is not None else ""
        return f"<Trace {who}{what}>"

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()


def trace(gradients_of: torch.nn.Module | None = None) -> Trace:
    """Start recording this rank's communication: `with dl.trace() as t: ...`; with
    `gradients_of=model`, also when each gradient is computed (for `t.overlap()`)."""
    return Trace(gradients_of)


def name_group(group: Any, name: str) -> None:
    """Show `group` as `name` in traces and tables (ProcessGrid names its groups dp/tp/pp)."""
    _labels[group.group_name] = name


@contextlib.contextmanager
def watch_calls(fn: Callable[[str, list[torch.Tensor]], None]) -> Iterator[None]:
    """Call `fn(op, tensors)` before every collective or p2p op this process issues, while
    inside; `fn` may refuse the call by raising (the device audit does)."""
    _recorder.watch(fn)
    try:
        yield
    finally:
        _recorder.unwatch(fn)


def traces_of(obj: Any) -> list[Trace]:
    """The per-rank traces of a LaunchResult, a list of traces, or one Trace, as a list."""
    if isinstance(obj, Trace):
        return [obj]
    traces = getattr(obj, "traces", obj)
    if traces is None or isinstance(traces, (str, bytes)) or not isinstance(traces, Iterable):
        raise ValueError(_("no traces: launch with trace=True (or record with `with "
                           "dl.trace()`)"))
    traces = list(traces)
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise ValueError(_("no traces: launch with trace=True (or record with `with "
                           "dl.trace()`)"))
    return traces


# -- filters --------------------------------------------------------------------------------------


def matcher(op: str | None, group: Any, phase: str | None) -> Callable[[CommEvent], bool]:
    """The test `Trace.select` applies: does an event match op, group and phase (None: any)?
    Checks the names at once, so a typo fails where it was written."""
    if op is not None and op not in OPS:
        raise ValueError(_("unknown op {op!r}{guess}; ops are: {ops}").format(
            op=op, guess=_did_you_mean(op), ops=", ".join(OPS)))
    if phase is not None and phase not in ("forward", "backward", "none"):
        raise ValueError(_("phase must be 'forward', 'backward' or 'none', not {phase!r}").format(
            phase=phase))
    want_phase = None if phase == "none" else phase
    group_test = _group_test(group)

    def match(ev: CommEvent) -> bool:
        return ((op is None or ev.op == op)
                and (phase is None or ev.phase == want_phase)
                and group_test(ev))
    return match


def _group_test(group: Any):
    if group is None:
        return lambda ev: True
    if isinstance(group, str):
        return lambda ev: ev.label == group
    if isinstance(group, torch.distributed.ProcessGroup):
        group = torch.distributed.get_process_group_ranks(group)
    if isinstance(group, Iterable):
        ranks = tuple(sorted(int(r) for r in group))
        return lambda ev: ev.group == ranks
    raise TypeError(_("group must be a name like 'tp', a tuple of ranks or a ProcessGroup, "
                      "not {kind}").format(kind=type(group).__name__))


def _did_you_mean(op: str) -> str:
    squashed = op.replace("_", "").replace("-", "").lower()
    for known in OPS:
        if known.replace("_", "") == squashed.rstrip("s"):
            return _(" (did you mean {known!r}?)").format(known=known)
    return ""


# -- recording ------------------------------------------------------------------------------------

_labels: dict[str, str] = {}   # ProcessGroup.group_name -> "dp" / "tp" / "pp"


class _Recorder:
    """Owns the dispatcher registration: installed while a Trace or a watcher is active."""

    def __init__(self) -> None:
        self.active: list[Trace] = []
        self.watchers: list[Callable[[str, list[torch.Tensor]], None]] = []
        self.lock = threading.Lock()
        self.library: Any = None
        self.groups: dict[str, tuple[int, ...]] = {}
        self.module_hooks: list[Any] = []
        self.wait: Any = None   # torch's Work.wait, while ours records

    def start(self, t: Trace) -> None:
        with self.lock:
            self._install()
            self.active.append(t)

    def stop(self, t: Trace) -> None:
        with self.lock:
            self.active.remove(t)
            self._uninstall_if_idle()

    def watch(self, fn: Callable[[str, list[torch.Tensor]], None]) -> None:
        with self.lock:
            self._install()
            self.watchers.append(fn)

    def unwatch(self, fn: Callable[[str, list[torch.Tensor]], None]) -> None:
        with self.lock:
            self.watchers.remove(fn)
            self._uninstall_if_idle()

    def _install(self) -> None:
        if self.library is None:
            self.groups = {}   # group names can be reused after a group is destroyed
            self.library = _install_kernels(self)
            self.module_hooks = _install_module_hooks()
            self.wait = _install_wait_record(self)

    def _uninstall_if_idle(self) -> None:
        if not self.active and not self.watchers and self.library is not None:
            self.library._destroy()
            self.library = None
            for handle in self.module_hooks:
                handle.remove()
            self.module_hooks = []
            torch.distributed.Work.wait = self.wait   # torch's own again

    def on_wait(self) -> None:
        """A Work handle is being waited on: the time goes to every active trace, and each
        asynchronous call issued since the last wait is checked for a tensor changed in place
        meanwhile (its version counter moved: c10d's own writes do not move it)."""
        now = time.perf_counter()
        for t in list(self.active):
            t.waits.append(now)
            for index, tensors in t._pending:
                if any((x := ref()) is not None and x._version != version
                       for ref, version in tensors):
                    t.written.append(index)
            t._pending = []

    def on_call(self, name: str, schema_args: list[str], args: tuple, kwargs: dict) -> None:
        """Every c10d op passes here before it runs: watchers first (they may refuse the call
        by raising), then the record of every active trace."""
        if self.watchers:
            _refuse_peer_outside_group(name, schema_args, args, kwargs)
            tensors = list(tensors_in(list(args) + list(kwargs.values())))
            for watcher in list(self.watchers):
                watcher(_C10D_OPS[name][0], tensors)
        if self.active:
            self.record(name, schema_args, args, kwargs)

    def record(self, name: str, schema_args: list[str], args: tuple, kwargs: dict) -> None:
        try:
            event = self._event(name, schema_args, args, kwargs)
        except Exception as exc:  # never break the user's collective because of the tracer
            for t in list(self.active):
                t.problems.append(f"{name}: {type(exc).__name__}: {exc}")
            event = CommEvent(_C10D_OPS[name][0], (), 0, None, None, None, False)
        if event is not None:
            followed = _followed(name, schema_args, args, kwargs) if event.async_op else []
            for t in list(self.active):
                t.events.append(event)
                if followed:
                    t._pending.append((len(t.events) - 1, followed))

    def _event(self, name: str, schema_args: list[str], args: tuple,
               kwargs: dict) -> CommEvent | None:
        op, payload_arg, peer_arg = _C10D_OPS[name]

        def arg(key: str) -> Any:
            return _call_arg(name, schema_args, args, kwargs, key)

        tensors = list(tensors_in(arg(payload_arg))) if payload_arg else []
        if any(t.device.type == "meta" for t in tensors):
            return None   # shape propagation (fake/meta tensors), not real communication
        group = self._ranks(arg("process_group"))
        peer = arg(peer_arg) if peer_arg else None
        if peer is not None and 0 <= peer < len(group):
            peer = group[peer]   # c10d ops take group-local ranks
        if "async_op" in schema_args:
            async_op = bool(arg("async_op"))
        else:
            async_op = op in ("send", "recv") and not _blocking_p2p()
        first = tensors[0] if tensors else None
        task = torch._C._current_graph_task_id()
        return CommEvent(
            op=op,
            group=tuple(sorted(group)),
            nbytes=sum(t.numel() * t.element_size() for t in tensors),
            dtype=str(first.dtype).removeprefix("torch.") if first is not None else None,
            shape=tuple(first.shape) if first is not None else None,
            phase=_phase(tensors),
            async_op=async_op,
            label=_labels.get(self._name(arg("process_group"))),
            peer=peer,
            time=time.perf_counter(),
            backward_pass=task if task != -1 else None,
        )

    def _name(self, boxed: Any) -> str:
        return _unbox(boxed).group_name

    def _ranks(self, boxed: Any) -> tuple[int, ...]:
        pg = _unbox(boxed)
        name = pg.group_name
        if name not in self.groups:
            try:
                self.groups[name] = tuple(torch.distributed.get_process_group_ranks(pg))
            except (KeyError, ValueError, RuntimeError):
                # a group torch.distributed does not know (made outside it): ranks unknown
                self.groups[name] = tuple(range(pg.size()))
        return self.groups[name]


_recorder = _Recorder()
_DEFAULTS: dict[str, dict[str, Any]] = {}


def _followed(name: str, schema_args: list[str], args: tuple,
              kwargs: dict) -> list[tuple[Any, int]]:
    """(weak reference, version) of an asynchronous call's tensors that are not views: what it
    sends and what it fills (a reduce-scatter's or an all-gather's output buffer as well)."""
    try:
        tensors = tensors_in(list(args) + list(kwargs.values()))
        return [(weakref.ref(t), t._version) for t in tensors if t._base is None]
    except Exception:  # never break the user's collective because of the tracer
        return []


def _install_wait_record(recorder: _Recorder) -> Any:
    """Work.wait records when it is called (the one handle a caller has of an asynchronous
    call: waiting on it at once, in the hook that issued the call, holds backward as a blocking
    call does); torch's wait, to put back."""
    original = torch.distributed.Work.wait

    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.on_wait()
        return original(work, *args, **kwargs)

    wait.__doc__ = original.__doc__
    torch.distributed.Work.wait = wait
    return original


def _install_kernels(recorder: _Recorder) -> Any:
    from torch._C import DispatchKey

    library = torch.library.Library("c10d", "IMPL")
    for name in _C10D_OPS:
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None:   # an op this torch version does not have
            continue
        overload = packet.default
        schema_args = [a.name for a in overload._schema.arguments]
        _DEFAULTS[name] = {a.name: a.default_value for a in overload._schema.arguments
                           if a.has_default_value()}

        def kernel(keyset, *args, _name=name, _overload=overload, _schema_args=schema_args,
                   **kwargs):
            recorder.on_call(_name, _schema_args, args, kwargs)
            return _overload.redispatch(keyset.remove(DispatchKey.BackendSelect), *args,
                                        **kwargs)

        library.impl(name, kernel, "BackendSelect", with_keyset=True)
    return library


def _unbox(boxed: Any) -> Any:
    if isinstance(boxed, torch.distributed.ProcessGroup):
        return boxed
    return torch.distributed.ProcessGroup.unbox(boxed)


# -- phase ----------------------------------------------------------------------------------------

_APPLY_CODE = torch.autograd.function.Function.apply.__func__.__code__
_in_module = threading.local()   # .depth: how many nn.Module forwards run now, in this thread


def _install_module_hooks() -> list[Any]:
    """Global hooks that count running module forwards. Global pre-hooks run before a module's
    own (FSDP's all-gather lives there) and global forward hooks before its own post-hooks;
    always_call keeps the count right when a forward raises."""
    def enter(module: torch.nn.Module, args: Any) -> None:
        _in_module.depth = getattr(_in_module, "depth", 0) + 1

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        # max: a trace started inside a forward sees that forward end, never its start
        _in_module.depth = max(getattr(_in_module, "depth", 0) - 1, 0)

    _in_module.depth = 0
    return [torch.nn.modules.module.register_module_forward_pre_hook(enter),
            torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]


def _call_arg(name: str, schema_args: list[str], args: tuple, kwargs: dict, key: str) -> Any:
    """The argument `key` of a c10d op call, positional, keyword or the schema's default."""
    i = schema_args.index(key)
    return args[i] if i < len(args) else kwargs.get(key, _DEFAULTS[name].get(key))


def _refuse_peer_outside_group(name: str, schema_args: list[str], args: tuple,
                               kwargs: dict) -> None:
    """A send, recv, broadcast, reduce, gather or scatter whose peer is not a rank of its group
    never completes on gloo (it waits for a rank that does not exist): say so at once, while a
    rank is watched (every rank dl.launch starts is)."""
    op, _payload, peer_arg = _C10D_OPS[name]
    if peer_arg is None or peer_arg not in schema_args or "process_group" not in schema_args:
        return
    peer = _call_arg(name, schema_args, args, kwargs, peer_arg)
    size = _unbox(_call_arg(name, schema_args, args, kwargs, "process_group")).size()
    if isinstance(peer, int) and not 0 <= peer < size:
        role = {"send": _("destination"), "recv": _("source")}.get(op, _("root"))
        raise ValueError(_(
            "{op} with {role} rank {peer} in a group of {size} ranks (0 to {last}): there is no "
            "such rank, so the call would wait for it forever. The first and the last rank of a "
            "chain have one neighbour only. [hint: comm.peer_outside_group]").format(
                op=op, role=role, peer=peer, size=size, last=size - 1))


def _phase(tensors: list[torch.Tensor]) -> str | None:
    if torch._C._current_graph_task_id() != -1:
        return "backward"
    if getattr(_in_module, "depth", 0) > 0:
        return "forward"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "forward"
    if _in_recording_function():
        return "forward"
    return None


def _in_recording_function() -> bool:
    """Inside an autograd.Function's forward that autograd will record (Megatron's f and g,
    DTensor's redistribution): grad mode is off there, but the call is part of forward."""
    frame = sys._getframe(2)
    callee = None
    while frame is not None:
        if frame.f_code is _APPLY_CODE:
            ctx = callee.f_locals.get("ctx") if callee is not None else None
            needs = getattr(ctx, "needs_input_grad", None)
            if needs is not None:
                return any(needs)
            inputs = frame.f_locals.get("args", ())
            return any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)
        callee, frame = frame, frame.f_back
    return False


def _blocking_p2p() -> bool:
    """dist.send/recv are isend/irecv plus a wait; tell them apart by who called."""
    frame = sys._getframe(3)
    for _hop in range(12):   # a dispatch mode (CommDebugMode) may sit in between
        if frame is None:
            return False
        if frame.f_code.co_name in ("send", "recv") and "distributed_c10d" in \
                frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False
