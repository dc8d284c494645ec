"""Device audit: find, on a CPU, the code that would put data on the wrong device on a GPU server.

On a GPU server every rank computes on `cuda:<local rank>` and nccl moves GPU memory only. Code
that makes a tensor without a device (it lands on the CPU), never moves a model, or hands a CPU
buffer to a collective works on a laptop and breaks on the server. This module makes those
mistakes fail on the laptop too, with a message that names the line and says what to write.

How: during an audited launch each rank pretends to have a second device. `dl.device()` returns
`cpu:0`, the audit's stand-in for the GPU (torch accepts it and stores the tensor on the CPU,
but `t.to("cpu:0")` makes a copy, as a move to a GPU does). A TorchFunctionMode watches every
torch call the rank's code makes and keeps, per tensor, where it would live on a GPU server:

    "host"     made without a device (or with "cpu"), or sent by value from the notebook
    "device"   made with device=dl.device(), moved there, or computed from such tensors

It then applies torch's own rules for CUDA tensors:
  * an op that mixes a host tensor (not a 0-dim scalar) with a device tensor fails, as CUDA's
    "Expected all tensors to be on the same device" does (copies and indexing are allowed);
  * a collective or send/recv that gets a host tensor fails (seen at the c10d dispatcher ops,
    through dl.trace's hook, so torch's DDP and DTensor calls are checked as well);
  * drawing random numbers on the device from a CPU generator fails, as it does on CUDA.
`t.device` says `cpu:0` for device tensors, so `torch.zeros(n, device=p.device)` is right.
Gradient hooks and custom backward functions run under the mode too. Tensors whose place is
unknown (the gradients autograd's engine makes, until read as `p.grad`) are never blamed.
Tensors made by torch.distributed's own code are left unmarked: under "cpu:gloo,cuda:nccl" torch
itself moves objects through gloo on the CPU (all_gather_object), which is correct there.

Why it stays whole: the marks, the mode that keeps them and the checks on collectives are one
mechanism, and it finds the learner's line by skipping its own frames (`_caller_file` compares
against this file); integrity guards the module and the launcher hides its frames from a
rank's traceback, both by this one name.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import os
import pickle
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from dpmp_lab._torch_helpers import tensors_in
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.trace import watch_calls

# The audit's stand-in for this rank's GPU. A torch.device with an index is kept by the factory
# calls and by .to() (which copies, since "cpu" != "cpu:0"), so the audit can tell it from "cpu".
AUDIT_DEVICE = torch.device("cpu", 0)

HOST, DEVICE = "host", "device"

_FIX = N_("On a GPU server each rank computes on its GPU (dl.device() is cuda:<rank>) and nccl "
          "moves GPU memory only: create tensors with device=dl.device() (or torch.zeros_like / "
          "x.new_zeros(...) of a tensor already there), move data with .to(dl.device()), and "
          "move a model once with model.to(dl.device()).")


class DeviceAuditError(RuntimeError):
    """Code inside a rank would put data on the wrong device on a GPU server."""


# Where a host tensor came from, kept as data: its words are made only when a message says
# them (`_origin`), in the language of that moment. A site is the file, line and source of the
# learner's line that made it (`_site`; () where none was found); _SENT: it arrived by value
# from the notebook; "": not known.
_Site = tuple
_SENT = "sent"


@dataclass(frozen=True)
class _Mark:
    where: str                # HOST or DEVICE
    born: _Site | str = ""    # for a host tensor: a site, _SENT or ""


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_DIST_DIR = os.path.join(_TORCH_DIR, "distributed") + os.sep
_C10D_MODULE = "torch.distributed.distributed_c10d"

# Ops that may take tensors on both devices under CUDA: copies, moves and indexing.
_MIXING_ALLOWED = {"copy_", "to", "cpu", "__setitem__", "__getitem__", "index_put_", "set_",
                   "__set__", "__get__", "new_tensor", "__deepcopy__", "__reduce_ex__",
                   "detach", "numpy", "tolist", "item", "__repr__", "__format__", "__str__",
                   "__len__", "__bool__", "__float__", "__int__", "__index__", "__array__",
                   "_has_compatible_shallow_copy_type", "is_same_size", "is_set_to"}
_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
           "normal", "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial",
           "exponential_", "geometric_", "log_normal_", "cauchy_", "random_"}


class _Audit:
    """Where each storage would live on a GPU server, the mode that keeps it, and the problems.

    Marks belong to storages, not tensor objects, because a device is a property of memory:
    views, `p.data`, a Parameter made from a tensor and `p.data = q` then follow by themselves.
    A weak reference tells a live storage from a freed one whose address was reused.
    """

    def __init__(self) -> None:
        self.marks: dict[int, tuple[StorageWeakRef, _Mark]] = {}
        self.problems: list[str] = []
        self.lock = threading.Lock()
        self._since_sweep = 0

    # -- marks --------------------------------------------------------------------------------

    def mark(self, t: torch.Tensor, mark: _Mark) -> None:
        storage = _storage(t)
        if storage is None:
            return
        with self.lock:
            self.marks[storage._cdata] = (StorageWeakRef(storage), mark)
            self._since_sweep += 1
            if self._since_sweep > 20000:
                self._sweep()

    def where(self, t: torch.Tensor) -> _Mark | None:
        storage = _storage(t)
        if storage is None:
            return None
        entry = self.marks.get(storage._cdata)
        if entry is None or entry[0].expired():
            return None
        return entry[1]

    def _sweep(self) -> None:
        self.marks = {k: v for k, v in self.marks.items() if not v[0].expired()}
        self._since_sweep = 0

    # -- failing ------------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        text = _("device audit: {message}").format(message=message)
        with self.lock:
            self.problems.append(text)
        raise DeviceAuditError(text)


_audit: _Audit | None = None


def active() -> bool:
    """True inside an audited rank."""
    return _audit is not None


def mark_host(obj: Any) -> Any:
    """Mark every tensor in obj as living on the CPU (what arrives by value from the notebook)."""
    if _audit is not None:
        for t in tensors_in(obj, levels=8, modules=True):
            _audit.mark(t, _Mark(HOST, _SENT))
    return obj


@contextlib.contextmanager
def auditing() -> Iterator[None]:
    """Audit the code run inside: the mode, the collective check, and a final report."""
    global _audit
    if _audit is not None:
        yield
        return
    _audit = _Audit()
    audit = _audit
    try:
        with watch_calls(_check_collective), _hooks_audited(audit), _Mode(audit):
            yield
        if audit.problems:   # raised where it happened, but caught by the code in between
            raise DeviceAuditError(audit.problems[0] + "\n" + (
                _("({n} such problems; the code caught the first error)").format(
                    n=len(audit.problems))
                if len(audit.problems) > 1 else _("(the code caught this error and went on)")))
    finally:
        _audit = None


# Code that autograd's engine calls back during backward. A mode handles `loss.backward()` as
# one call, with the mode itself switched off inside, so the learner's gradient hooks (where
# overlapped data parallelism sends its buckets) and custom Functions' backward would go
# unseen: they get the mode back around each call.
_BACKWARD_CALLBACKS = [
    (torch.Tensor, "register_hook"),
    (torch.Tensor, "register_post_accumulate_grad_hook"),
    (torch.nn.Module, "register_full_backward_hook"),
    (torch.nn.Module, "register_full_backward_pre_hook"),
]


@contextlib.contextmanager
def _hooks_audited(audit: _Audit) -> Iterator[None]:
    from torch.autograd.function import BackwardCFunction

    def registering(original):
        def register(self, hook, *args, **kwargs):
            def audited_hook(*hook_args, **hook_kwargs):
                with _Mode(audit):
                    return hook(*hook_args, **hook_kwargs)
            return original(self, audited_hook, *args, **kwargs)
        return register

    original_apply = BackwardCFunction.apply

    def audited_apply(self, *args):
        with _Mode(audit):
            return original_apply(self, *args)

    saved = [(owner, name, getattr(owner, name)) for owner, name in _BACKWARD_CALLBACKS]
    try:
        for owner, name, original in saved:
            setattr(owner, name, registering(original))
        BackwardCFunction.apply = audited_apply
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        BackwardCFunction.apply = original_apply


def loads(data: bytes) -> Any:
    """Unpickle what the notebook sent, every tensor marked as living on the CPU."""
    return _MarkingUnpickler(io.BytesIO(data)).load()


class _MarkingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if module.startswith("torch") and name.startswith("_rebuild") and callable(found):
            def rebuild(*args, _found=found, **kwargs):
                return mark_host(_found(*args, **kwargs))
            return rebuild
        return found


# -- the mode ---------------------------------------------------------------------------------


class _Mode(TorchFunctionMode):
    def __init__(self, audit: _Audit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            return self._get(func, args)
        if name == "__set__":
            return self._set(func, args, kwargs)
        if _caller_file().startswith(_DIST_DIR):
            # torch.distributed's own code (objects through gloo on the CPU, which
            # "cpu:gloo,cuda:nccl" serves; DTensor and FSDP internals): trusted, not marked.
            return func(*args, **kwargs)
        if name in ("to", "cpu", "cuda"):
            return self._move(func, name, args, kwargs)
        return self._op(func, name, args, kwargs)

    # t.device, t.grad, t.data
    def _get(self, func, args):
        value = func(*args)
        prop = func.__self__.__name__
        tensor = args[0]
        if prop == "device":
            mark = self.audit.where(tensor)
            if mark is not None and mark.where == DEVICE and value.type == "cpu":
                return AUDIT_DEVICE
        elif prop in ("grad", "data") and isinstance(value, torch.Tensor):
            if self.audit.where(value) is None:   # a gradient lives where its parameter does
                self._copy_mark(tensor, value)
        return value

    # t.data = ..., p.grad = ...
    def _set(self, func, args, kwargs):
        target, value = args[0], args[1]
        prop = func.__self__.__name__
        if prop == "grad" and isinstance(value, torch.Tensor):
            mine, theirs = self.audit.where(target), self.audit.where(value)
            if mine is not None and theirs is not None and mine.where != theirs.where:
                self.audit.fail(_(
                    N_("a gradient on the CPU is assigned to a parameter on the device ({where}): "
                       "on a GPU server a gradient must live where its parameter does. {fix}")
                    if theirs.where == HOST else
                    N_("a gradient on the device is assigned to a parameter on the CPU ({where}): "
                       "on a GPU server a gradient must live where its parameter does. {fix}")
                ).format(where=_where_used(), fix=_(_FIX)))
        result = func(*args, **kwargs)
        if prop == "data" and isinstance(value, torch.Tensor):
            self._copy_mark(value, target)
        return result

    # t.to(...), t.cpu()
    def _move(self, func, name, args, kwargs):
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if source is None:
            return self._op(func, name, args, kwargs)
        before = self.audit.where(source)
        target = self._target_of_move(name, args, kwargs, before)
        if target is not None and before is not None and target.where == before.where \
                and not _changes_dtype(name, args, kwargs, source):
            return source                 # already there: torch returns the tensor itself
        result = func(*args, **kwargs)
        if result is source and target is not None and before is not None:
            result = source.clone()       # a move between devices always makes a new tensor
        if target is not None and isinstance(result, torch.Tensor):
            self.audit.mark(result, target)
        return result

    def _target_of_move(self, name, args, kwargs, before):
        if name == "cpu":
            return _Mark(HOST, _born())
        if name == "cuda":
            return None
        if len(args) > 1 and isinstance(args[1], torch.Tensor):   # t.to(other)
            return self.audit.where(args[1])
        try:
            dev = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
        except Exception:
            return None
        if dev is None:
            return before
        return _mark_for_device(dev)

    # every other torch function
    def _op(self, func, name, args, kwargs):
        inputs = _inputs(args, kwargs)
        device_kw = kwargs.get("device")
        marks = [(t, self.audit.where(t)) for t in inputs]
        host = [(t, m) for t, m in marks if m is not None and m.where == HOST]
        on_device = [t for t, m in marks if m is not None and m.where == DEVICE]
        # collectives are checked where they reach c10d (_check_collective), with their message
        if on_device and name not in _MIXING_ALLOWED and \
                getattr(func, "__module__", "") != _C10D_MODULE:
            big_host = [(t, m) for t, m in host if t.dim() > 0]
            if big_host:
                self._mixing(name, big_host[0], on_device[0])
        if name in _RANDOM:
            self._check_generator(name, args, kwargs, inputs, device_kw)
        if name in ("numpy", "__array__") and on_device:
            self.audit.fail(_(
                "{name}() of a tensor on this rank's device ({where}): on a GPU this fails "
                "(numpy lives on the CPU); call .cpu() first, or .tolist() / .item().").format(
                    name=name, where=_where_used()))
        result = func(*args, **kwargs)
        outputs = [t for t in tensors_in(result, levels=2) if not any(t is i for i in inputs)]
        if not outputs:
            return result
        if device_kw is not None:
            mark = _mark_for_device(torch.device(device_kw))
        elif on_device:
            mark = _Mark(DEVICE)
        elif host:
            mark = host[0][1]
        elif not inputs:
            mark = _Mark(HOST, _born())
        else:
            mark = None
        if mark is not None:
            for t in outputs:
                self.audit.mark(t, mark)
        return result

    def _check_generator(self, name, args, kwargs, inputs, device_kw) -> None:
        gen = kwargs.get("generator")
        if gen is None or gen.device.type != "cpu":
            return
        if device_kw is not None:
            target = _mark_for_device(torch.device(device_kw))
        elif inputs:
            target = self.audit.where(inputs[0])
        else:
            return
        if target is not None and target.where == DEVICE:
            self.audit.fail(_(
                "{name}(..., generator=g) draws on this rank's device with a CPU generator "
                "({where}). On a GPU that is an error, and a GPU generator would draw other "
                "numbers than the notebook's reference: draw on the CPU with the seeded "
                "generator, then move the result with .to(dl.device()).").format(
                    name=name, where=_where_used()))

    def _mixing(self, name, host, device_tensor) -> None:
        t, mark = host
        self.audit.fail(_(
            "{name}() mixes a tensor on this rank's device with a CPU tensor of shape {shape} "
            "({where}).\n  That CPU tensor {origin}.\n  On a GPU server this fails with "
            "\"Expected all tensors to be on the same device\". {fix}").format(
                name=name, shape=list(t.shape), where=_where_used(), origin=_origin(mark),
                fix=_(_FIX)))

    def _copy_mark(self, source: torch.Tensor, target: torch.Tensor) -> None:
        mark = self.audit.where(source)
        if mark is not None:
            self.audit.mark(target, mark)


def _check_collective(op: str, tensors: list[torch.Tensor]) -> None:
    audit = _audit
    if audit is None:
        return
    for t in tensors:
        mark = audit.where(t)
        if mark is not None and mark.where == HOST:
            what = {"send": "dist.send", "recv": "dist.recv"}.get(op) or _(
                N_("an {op}") if op[0] in "aeiou" else N_("a {op}")).format(op=op)
            audit.fail(_(
                "{what} was handed a CPU tensor of shape {shape} ({where}).\n"
                "  That tensor {origin}.\n  {fix}").format(
                    what=what, shape=list(t.shape), where=_where_used(), origin=_origin(mark),
                    fix=_(_FIX)))


# -- helpers -----------------------------------------------------------------------------------


def _storage(t: torch.Tensor) -> Any:
    try:
        with torch._C.DisableTorchFunction():
            return t.untyped_storage()
    except Exception:   # wrapper subclasses such as DTensor have no storage of their own
        return None


def _mark_for_device(dev: torch.device) -> _Mark | None:
    if dev.type == "cpu":
        return _Mark(DEVICE) if dev.index is not None else _Mark(HOST, _born())
    return None   # meta (shapes only), or a real accelerator


def _changes_dtype(name, args, kwargs, source) -> bool:
    if name != "to":
        return False
    try:
        dtype = torch._C._nn._parse_to(*args[1:], **kwargs)[1]
    except Exception:
        return True
    return dtype is not None and dtype != source.dtype


def _inputs(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a torch call gets: arguments, and lists of tensors (torch.cat's) in them.

    Flat on purpose, not `tensors_in`: this runs on every torch call of an audited rank."""
    found = []
    for values in (args, kwargs.values()):
        for v in values:
            if isinstance(v, torch.Tensor):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


def _caller_file() -> str:
    """The file of the code that called the torch function being handled."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in (__file__, torch.overrides.__file__):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


# modules whose frames only pass a call on: a context manager's, and the wrapper of a function
# torch deprecated (typing_extensions.deprecated: reduce_scatter_tensor in torch 2.13)
_PASSING_ON = ("contextlib", "typing_extensions", "warnings")


def _user_frame():
    """The innermost frame of the learner's code: not torch's, not dpmp_lab's."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        module = frame.f_globals.get("__name__", "")
        ours = module == "dpmp_lab" or module.startswith("dpmp_lab.")   # by package, any folder
        if not (path.startswith(_TORCH_DIR) or ours or module in _PASSING_ON):
            return frame
        frame = frame.f_back
    return None


def _site(frame) -> _Site:
    """The file, line and source of a frame of the learner's, kept until a message says them."""
    if frame is None:
        return ()
    path, line = frame.f_code.co_filename, frame.f_lineno
    return path, line, linecache.getline(path, line).strip()


def _describe(site: _Site) -> str:
    if not site:
        return _("in dpmp_lab's or torch's code")
    path, line, source = site
    if source:
        return _("{file}, line {line}: `{source}`").format(
            file=_short(path), line=line, source=source)
    return _("{file}, line {line}").format(file=_short(path), line=line)


def _born() -> _Site:
    return _site(_user_frame())


def _where_used() -> str:
    return _("at {where}").format(where=_describe(_site(_user_frame())))


def _origin(mark: _Mark) -> str:
    if mark.born == _SENT:
        return _("was sent from the notebook, so it arrives on the CPU")
    if isinstance(mark.born, tuple):
        return _("was made at {where}, without device=dl.device()").format(
            where=_describe(mark.born))
    return _("lives on the CPU")


def _short(path: str) -> str:
    """A notebook cell's file is a temporary path: say "the cell" with its line instead."""
    if "ipykernel" in path or path.startswith("<"):
        return _("cell")
    return path
