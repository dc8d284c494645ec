"""The harness's side: the kernel where a graded notebook's test cells run, and where no code of
the submission ever runs.

The grader starts this kernel beside the learner's and calls `install` in it. From then on:

- Before each cell, the learner's names the tests read (`names`: the plan's, plan.py) are asked
  for and bound here: data as data (codec.py: numbers, strings, lists, tensors, the library's
  data classes), anything else as a `Remote`, a stand-in that holds only a number.
- Calling a `Remote`, or reading one of its attributes, is a request: the grader relays it to
  the learner's kernel, where agent.py does it, and the answer comes back as data (or as another
  `Remote`). What the learner's code printed meanwhile is printed here, in the test's cell; the
  tensors it changed in place are copied into the harness's own; what it raised is raised here
  as the same builtin exception, a LaunchError as a LaunchError (rebuilt from its data), anything
  else as `LearnerError`.
- `dl.launch` of a function or arguments that hold a `Remote` (the learner's function, or a
  test's helper that calls it in the ranks) is such a call of `dl.launch` in the learner's
  kernel: its ranks run in the learner's sandbox. A launch that holds none (a reference the
  tests compute) runs here, in the harness's own ranks.

What reaches the learner's kernel from here: the functions and arguments of those calls, pickled
(a test's rank-side helper travels by value: its code object and the names it uses, not the
cell's source), the library's references a test switched off (dl.check.references_off) and the
library's versions standing in for earlier answers (dl.check.stand_ins).
"""

from __future__ import annotations

import builtins
import io
import json
import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any

import torch

from dpmp_lab._torch_helpers import tensors_in
from dpmp_lab.check import sides
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.check.references import ReferenceSwitchedOff, standing_in, switched_off
from dpmp_lab.harness.allowed import ALLOWED
from dpmp_lab.harness.codec import NotData, decode
from dpmp_lab.i18n.messages import _
from dpmp_lab.integrity import TamperingDetected
from dpmp_lab.launcher import launch as launch_module
from dpmp_lab.launcher.failures import LaunchError, LaunchTimeout
from dpmp_lab.launcher.serialize import Pickler

FRAME = struct.Struct(">Q")
# exceptions of the learner's code that the harness raises as themselves: the builtins' and the
# library's own; anything else is a LearnerError naming its class
REBUILT = {f"builtins.{name}": value for name, value in vars(builtins).items()
           if isinstance(value, type) and issubclass(value, Exception) and value is not Exception}
REBUILT.update({f"{c.__module__}.{c.__qualname__}": c
                for c in (CheckFailed, ReferenceSwitchedOff, TamperingDetected)})


class LearnerError(RuntimeError):
    """The learner's code raised an exception of its own class, or the learner's side failed."""


class HarnessError(RuntimeError):
    """The learner's kernel could not answer: it died, hung past its time, or its answer was not
    data (the grader says which)."""


class Remote:
    """A learner's object the harness cannot hold as data: a function, a class, an object."""

    __slots__ = ("_link", "_number", "_kind", "_label")

    def __init__(self, link: Link, number: int, kind: str, label: str) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_label", label)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{self!r} has no {name} the harness can read")
        return self._link.ask({"op": "getattr", "of": self, "name": name})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self!r} is the learner's: the harness does not change it")

    @property
    def __name__(self) -> str:   # noqa: PLW3201 - what a test prints of a function
        return self._label.rpartition(".")[2]

    def __repr__(self) -> str:
        return f"<your {self._kind} {self._label}>"

    def __copy__(self) -> Remote:
        return self

    def __deepcopy__(self, memo: dict) -> Remote:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} exists only in the learner's kernel: it crosses to the ranks "
                        "through dl.launch, not by pickling")


class _Request(Pickler):
    """A request for the learner's kernel: every Remote in it becomes a reference there."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.remotes = 0

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Remote:
            self.remotes += 1
            return ("handle", obj._number)
        return None


def pickled(obj: Any) -> tuple[bytes, int]:
    """(the request's bytes, how many learner's objects it holds)."""
    buf = io.BytesIO()
    pickler = _Request(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.remotes


class Link:
    """The harness's socket to the grader, which relays each request to the learner's kernel."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def _exchange(self, data: bytes) -> tuple[dict, bytes]:
        sys.stdout.flush()
        sys.stderr.flush()
        self.sock.sendall(FRAME.pack(len(data)) + data)
        header = self._read(self._read(FRAME.size, unpack=True))
        answer = self._read(self._read(FRAME.size, unpack=True))
        return json.loads(header), answer

    def _read(self, n: int | bytes, unpack: bool = False) -> Any:
        size = n if isinstance(n, int) else FRAME.unpack(n)[0]
        chunks, got = [], 0
        while got < size:
            chunk = self.sock.recv(min(size - got, 1 << 20))
            if not chunk:
                raise HarnessError(_("the grader closed the harness's link"))
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        return FRAME.unpack(data)[0] if unpack else data

    def ask(self, request: dict, what: str | None = None) -> Any:
        """Send one request; replay what the learner's kernel printed meanwhile; the value it
        answered, decoded (what it raised is raised here)."""
        return self._reply(request, what or _("your kernel")).get("value")

    def call(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """fn(*args, **kwargs) in the learner's kernel; the tensors among the arguments that it
        changed in place are changed here too."""
        reply = self._reply({"op": "call", "fn": fn, "args": args, "kwargs": kwargs,
                             "off": switched_off(), "names": standing_in()}, _name(fn))
        _write_back(list(tensors_in((args, kwargs))), reply.get("changed"))
        return reply.get("value")

    def _reply(self, request: dict, what: str) -> dict:
        data, _ = pickled(request)
        header, answer = self._exchange(data)
        _replay(header.get("outputs", []))
        if not header.get("ok"):
            raise HarnessError(_said(header))
        try:
            reply = decode(answer, ALLOWED, self.remote)
        except NotData as exc:
            raise HarnessError(_("{what} gave the grader something it cannot read ({why}): "
                                 "answers are numbers, strings, lists, tuples, dicts or "
                                 "tensors").format(what=what, why=exc)) from None
        if type(reply) is not dict:
            raise HarnessError(_("your kernel's answer to the grader is not one it sends"))
        if "raised" in reply:
            raise rebuilt(reply["raised"])
        return reply

    def remote(self, body: list) -> Remote:
        if not (len(body) == 3 and type(body[0]) is int and body[1] in (
                "function", "class", "module", "object") and type(body[2]) is str):
            raise NotData("a malformed handle")
        return Remote(self, body[0], body[1], body[2])


def _said(header: dict) -> str:
    """A failed request's message in the language of the moment: the grader sends it as an
    English template and its fields (two_kernels._error)."""
    template = header.get("error")
    if not isinstance(template, str) or not template:
        return _("your kernel did not answer the grader")
    fields = header.get("fields") if isinstance(header.get("fields"), dict) else {}
    for text in (_(template), template):   # a translation that lost a field: the English
        try:
            return text.format(**fields)
        except (KeyError, IndexError, ValueError):
            continue
    return template


def _name(fn: Any) -> str:
    return repr(fn) if type(fn) is Remote else getattr(fn, "__qualname__", _("the function"))


def _write_back(mine: list[torch.Tensor], changed: Any) -> None:
    """Copy into the harness's tensors what the learner's code changed in its copies."""
    if not changed:
        return
    if type(changed) is not list:
        raise HarnessError(_("your kernel's answer to the grader is not one it sends"))
    with torch.no_grad():
        for item in changed:
            if not (type(item) is tuple and len(item) == 2 and type(item[0]) is int
                    and 0 <= item[0] < len(mine) and isinstance(item[1], torch.Tensor)):
                raise HarnessError(_("your kernel's answer to the grader is not one it sends"))
            target, new = mine[item[0]], item[1]
            if target.shape != new.shape:
                target.resize_(new.shape)
            target.copy_(new.to(target.dtype))


def _replay(outputs: Iterable[Any]) -> None:
    """Print here what the learner's kernel printed during a request (the grader kept only text)."""
    from IPython.display import publish_display_data  # noqa: PLC0415 - a kernel's

    for out in outputs:
        if not isinstance(out, dict):
            continue
        if out.get("kind") == "stream":
            stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
            stream.write(str(out.get("text", "")))
            stream.flush()
        elif out.get("kind") == "display":
            publish_display_data({"text/plain": str(out.get("text", ""))})


def rebuilt(info: Any) -> BaseException:
    """The exception an answer says the learner's code raised."""
    if type(info) is not dict:
        return HarnessError(_("your kernel's answer to the grader is not one it sends"))
    message = str(info.get("message", ""))
    where = str(info.get("traceback", "")).rstrip()
    launch = info.get("launch")
    if type(launch) is dict:
        try:
            cls = LaunchTimeout if launch.pop("timeout", False) else LaunchError
            failures = launch.pop("failures")
            return cls(failures, **launch)
        except Exception as exc:   # noqa: BLE001 - a LaunchError's data that does not fit
            return HarnessError(_("the learner's launch failed, and its report could not be "
                                  "read: {what}: {why}").format(what=type(exc).__name__, why=exc))
    types_ = [t for t in info.get("types", []) if type(t) is str]
    for name in types_:
        cls = REBUILT.get(name)
        if cls is not None:
            try:
                exc = cls(message)
            except Exception:   # noqa: BLE001 - a builtin needing other arguments
                continue
            break
    else:
        exc = LearnerError(f"{types_[0] if types_ else 'an exception'}: {message}")
    if where:
        exc.add_note("In the learner's code:\n" + where)
    return exc


class _Names:
    """The learner's names bound in the harness's namespace before each cell."""

    def __init__(self, link: Link, namespace: dict[str, Any], names: Iterable[str]) -> None:
        self.link, self.namespace = link, namespace
        self.names = sorted(n for n in set(names) if n not in namespace
                            and not hasattr(builtins, n))

    def refresh(self, *_: Any) -> None:
        values = self.link.ask({"op": "export", "names": self.names})
        values = values if type(values) is dict else {}
        for name in self.names:
            self.namespace.pop(name, None)
        for name, data in values.items():
            if name in self.names and type(data) is bytes:
                try:
                    self.namespace[name] = decode(data, ALLOWED, self.link.remote)
                except NotData as exc:
                    print(f"[harness] your {name} could not be read: {exc}", file=sys.stderr)


def launch_route(link: Link) -> Any:
    """Where the harness's launches go (launch.route_launches): one that holds the learner's
    objects to the learner's kernel over `link`, fn's keywords apart from the options."""
    def route(fn: Any, args: tuple, kwargs: dict, options: dict) -> Any:
        _, remotes = pickled((fn, args, kwargs))
        if not remotes:
            return None   # nothing of the learner's: the harness's own ranks
        options = {**options, "progress": False}   # fn's own keywords apart: never an option
        if options.get("device_audit") is None:   # the grader's choice, read here: the learner's
            options["device_audit"] = launch_module.audit_requested()   # kernel could unset it
        return link.call(launch_module.launch, (fn, *args), {**options, "fn_kwargs": kwargs})
    return route


def install(shell: Any, path: str, names: Iterable[str]) -> None:
    """Make this kernel the harness: connect to the grader at `path`, bind the learner's `names`
    before each cell, route launches that hold the learner's objects to the learner's kernel."""
    link = Link(path)
    learner = _Names(link, shell.user_ns, names)
    shell.events.register("pre_run_cell", learner.refresh)
    launch_module.route_launches(launch_route(link))
    sides.route_calls(link.call)


__all__ = ["HarnessError", "LearnerError", "Link", "Remote", "install", "launch_route", "pickled",
           "rebuilt"]
