"""The learner's side of the harness: what the grader asks of the learner's kernel while the tests
run in a process of their own.

The grader runs one line in the learner's kernel per request, `serve(folder, n)`: it reads the
request the harness wrote (`folder/in-n`, pickled by the harness, which is trusted), does it in
this kernel, and writes the answer (`folder/out-n`) as plain data (codec.py). Three requests:

    export  the values of some of the notebook's names: data where a value is data, else a
            handle (a number this agent keeps the object under)
    call    call a function (a handle, or one the harness sent by value, such as dl.launch or a
            test's rank-side helper) on arguments, with some of the notebook's names standing
            for other values (a test's "the library's version stands in for yours") and the
            library's references the test switched off switched off here too
    getattr an attribute of a handle

A call's answer is its value, the tensor arguments it changed in place (their new contents, which
the harness copies into its own), or what it raised. Everything here runs in the learner's
process, so a learner can change what it answers: that is no more than writing their functions
to return it, which the tests judge.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import traceback
import types
from collections.abc import Iterator
from typing import Any

from dpmp_lab._torch_helpers import tensors_in
from dpmp_lab.check.references import references_off
from dpmp_lab.harness.allowed import ALLOWED
from dpmp_lab.harness.codec import NotData, encode
from dpmp_lab.harness.exchange import ANSWER, MAX_BYTES, REQUEST
from dpmp_lab.launcher.failures import LaunchError, LaunchTimeout

MAX_TEXT = 20_000   # characters of an error's message or traceback that cross


class Agent:
    """The objects the harness holds handles to, in the namespace of one kernel."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.objects: dict[int, Any] = {}
        self.ids: dict[int, int] = {}       # id(object) -> its handle

    def handle(self, value: Any) -> list:
        """[number, kind, label]: what the harness makes its stand-in from."""
        if isinstance(value, _Opaque):
            value = value.value
        number = self.ids.get(id(value))
        if number is None:
            number = len(self.objects) + 1
            self.objects[number] = value
            self.ids[id(value)] = number
        if isinstance(value, type):
            kind = "class"
        elif isinstance(value, types.ModuleType):
            kind = "module"
        elif callable(value):
            kind = "function"
        else:
            kind = "object"
        label = getattr(value, "__qualname__", None) if kind != "object" else None
        if not isinstance(label, str):
            label = f"{type(value).__qualname__} object"
        return [number, kind, label[:200]]

    def answer(self, value: Any) -> bytes:
        try:
            return encode(value, ALLOWED, self.handle)
        except NotData as exc:
            return encode({"raised": _raised(exc)}, ALLOWED, self.handle)

    def answer_request(self, data: bytes) -> bytes:
        """The answer, as bytes, to a request as the harness pickled it."""
        try:
            request = _Requests(data, self).load()
        except Exception as exc:   # noqa: BLE001 - a handle the learner's kernel lost, say
            return self.answer({"raised": _raised(exc)})
        answer = self.serve(request)
        if len(answer) > MAX_BYTES:
            return self.answer({"raised": _raised(NotData(
                f"the answer is {len(answer) // 2**20} MiB, over {MAX_BYTES // 2**20} MiB"))})
        return answer

    def serve(self, request: dict) -> bytes:
        op = request.get("op")
        try:
            if op == "export":
                found = [name for name in request["names"] if name in self.namespace]
                return self.answer({"value": {name: self.one(self.namespace[name])
                                              for name in found}})
            if op == "call":
                return self.answer(self.call(request))
            if op == "getattr":
                return self.answer({"value": getattr(request["of"], request["name"])})
            raise ValueError(f"the harness asked for {op!r}, which this agent does not do")
        except Exception as exc:   # noqa: BLE001 - whatever the learner's code raised
            return self.answer({"raised": _raised(exc)})

    def one(self, value: Any) -> bytes:
        """One exported value on its own, so that one too large or too odd costs only itself."""
        try:
            return encode(value, ALLOWED, self.handle)
        except NotData:
            return encode(_Opaque(value), ALLOWED, self.handle)

    def call(self, request: dict) -> dict:
        fn, args, kwargs = request["fn"], request["args"], request["kwargs"]
        tensors = list(tensors_in((args, kwargs)))
        versions = [t._version for t in tensors]
        with self.names(request.get("names") or {}), references_off(*request.get("off", ())):
            value = fn(*args, **kwargs)
        changed = [(i, t) for i, (t, v) in enumerate(zip(tensors, versions, strict=True))
                   if t._version != v]
        return {"value": value, "changed": changed}

    @contextlib.contextmanager
    def names(self, values: dict[str, Any]) -> Iterator[None]:
        """The notebook's `values` names bound to these values while inside."""
        missing = object()
        saved = {name: self.namespace.get(name, missing) for name in values}
        self.namespace.update(values)
        try:
            yield
        finally:
            for name, old in saved.items():
                if old is missing:
                    self.namespace.pop(name, None)
                else:
                    self.namespace[name] = old


class _Opaque:
    """A value too large or too deep to cross: it crosses as a handle."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _text(make: Any) -> str:
    try:
        return str(make())[:MAX_TEXT]
    except Exception:   # noqa: BLE001 - an exception whose __str__ raises
        return "(its message could not be read)"


def _raised(exc: BaseException) -> dict:
    """What an exception says, as data: its classes' names (the harness raises the first it
    knows), its message and the learner's part of its traceback; a LaunchError's failures."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename) != os.path.abspath(__file__)]
    info = {"types": [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__],
            "message": _text(lambda: exc),
            "traceback": _text(lambda: "".join(traceback.format_list(frames)))}
    if isinstance(exc, LaunchError):
        info["launch"] = {"failures": dict(exc.failures), "output": list(exc.output),
                          "finished": list(exc.finished), "stopped": list(exc.stopped),
                          "world_size": exc.world_size, "summary": exc.summary,
                          "hint": exc.hint, "flight_records": dict(exc.flight_records),
                          "timeout": isinstance(exc, LaunchTimeout)}
    return info


class _Requests(pickle.Unpickler):
    """The harness's request: its handles turned back into this agent's objects."""

    def __init__(self, data: bytes, agent: Agent) -> None:
        super().__init__(io.BytesIO(data))
        self.agent = agent

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "handle":
            try:
                return self.agent.objects[pid[1]]
            except KeyError:
                raise pickle.UnpicklingError(
                    f"no object {pid[1]} in the learner's kernel") from None
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


_agents: dict[int, Agent] = {}


def agent_for(namespace: dict[str, Any]) -> Agent:
    """The agent of this namespace (one per kernel)."""
    return _agents.setdefault(id(namespace), Agent(namespace))


def serve(folder: str, n: int) -> None:
    """Answer request `n` of `folder` (the grader runs this line in the learner's kernel)."""
    from IPython import get_ipython  # only ever called in a kernel

    agent = agent_for(get_ipython().user_ns)
    with open(os.path.join(folder, REQUEST.format(n)), "rb") as f:
        data = f.read()
    try:
        request = _Requests(data, agent).load()
    except Exception as exc:   # noqa: BLE001 - a handle the learner's kernel lost, say
        answer = agent.answer({"raised": _raised(exc)})
    else:
        answer = agent.serve(request)
    if len(answer) > MAX_BYTES:
        answer = agent.answer({"raised": _raised(NotData(
            f"the answer is {len(answer) // 2**20} MiB, over {MAX_BYTES // 2**20} MiB"))})
    path = os.path.join(folder, ANSWER.format(n))
    with open(path + ".tmp", "wb") as f:
        f.write(answer)
    os.replace(path + ".tmp", path)


__all__ = ["Agent", "agent_for", "serve"]
