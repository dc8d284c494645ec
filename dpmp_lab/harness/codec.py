"""Values that cross from the learner's side to the harness: plain data, decoded by an allowlist.

The learner's kernel (and every rank it launches) runs code the grader did not write, so what it
hands over is read here as data and nothing else: no pickle, no class named by the sender, no
method of the sender's run while decoding. What can cross:

    None, bool, int, float, complex, str, bytes       exactly those types, never a subclass
    list, tuple, dict, set, frozenset, range          of values that can cross
    torch.Tensor (dense, strided; nn.Parameter)       its dtype, shape, values, requires_grad
    torch.Size, torch.dtype, torch.device
    an instance of a class the receiver allows        rebuilt by the receiver's own constructor
    (`Allowed`: the library's data classes such       from its fields, which must cross too
    as a Trace or a LaunchResult), an allowed enum
    a handle                                          an opaque number the sender made for a
                                                      value that is not data (a function)

The bytes: MAGIC, the length of a JSON tree (8 bytes, big-endian), the tree, then the contents of
tensors and bytes, which the tree points into. Each node of the tree is a JSON scalar or an
object with one key that says what it is (see `_decode`). Decoding is bounded: the whole input
(`max_bytes`), the nodes (`MAX_NODES`) and the nesting (`MAX_DEPTH`); anything else is a
`NotData` error that says where. Nothing is shared: a value reached twice is encoded twice, so a
decoded value holds no more than its bytes say.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable
from typing import Any

import numpy
import torch

from dpmp_lab.harness.exchange import MAX_BYTES

MAGIC = b"DPMPdata1\n"
MAX_DEPTH = 64
MAX_NODES = 1_000_000
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool)}
_SCALARS = (type(None), bool, int, str)
_NUMPY_SCALAR = (numpy.bool_, numpy.integer, numpy.floating, numpy.complexfloating)


class NotData(ValueError):
    """A value that cannot cross as data, or bytes that are not a value: says what and where."""


@dataclasses.dataclass(frozen=True)
class Record:
    """How one allowed class crosses: its fields out of an instance, and the instance back."""

    name: str
    cls: type
    fields: Callable[[Any], dict[str, Any]]
    build: Callable[[dict[str, Any]], Any]


class Allowed:
    """The classes and enums a receiver rebuilds: nothing else with a name crosses."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.by_class: dict[type, Record] = {}
        self.enums: dict[str, type[enum.Enum]] = {}

    @staticmethod
    def name_of(cls: type) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    def add(self, cls: type, fields: Callable[[Any], dict[str, Any]] | None = None,
            build: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Allow `cls`: a dataclass by its init fields and constructor, any other class by the
        `fields` and `build` given."""
        if issubclass(cls, enum.Enum):
            self.enums[self.name_of(cls)] = cls
            return
        if fields is None or build is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"{cls.__qualname__} is not a dataclass: say how it crosses")
            names = [f.name for f in dataclasses.fields(cls) if f.init]
            fields = fields or (lambda obj: {n: getattr(obj, n) for n in names})
            build = build or (lambda values: cls(**values))
        record = Record(self.name_of(cls), cls, fields, build)
        self.records[record.name] = record
        self.by_class[cls] = record


NOTHING_ALLOWED = Allowed()


# -- encoding (the sender's side) ------------------------------------------------------------------


class _Encoder:
    def __init__(self, allowed: Allowed, handle: Callable[[Any], list] | None) -> None:
        self.allowed, self.handle = allowed, handle
        self.blobs: list[bytes] = []
        self.size = 0
        self.nodes = 0
        self.path: list[int] = []   # ids of the containers being encoded: a cycle is not data

    def blob(self, data: bytes) -> list[int]:
        at = self.size
        self.blobs.append(data)
        self.size += len(data)
        if self.size > MAX_BYTES:
            raise NotData(f"more than {MAX_BYTES // 2**20} MiB")
        return [at, len(data)]

    def encode(self, value: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise NotData(f"more than {MAX_NODES} values or nested deeper than {MAX_DEPTH}")
        kind = type(value)
        if isinstance(value, _NUMPY_SCALAR):   # np.float64(9.0) crosses as the number it holds
            value = value.item()
            kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is float:
            return value if math.isfinite(value) else {"x": repr(value)}
        if kind is complex:
            return {"c": [self.encode(value.real, depth + 1), self.encode(value.imag, depth + 1)]}
        if kind is bytes:
            return {"b": self.blob(value)}
        if kind is range:
            return {"r": [value.start, value.stop, value.step]}
        if kind is torch.Size:
            return {"z": list(value)}
        if kind is torch.dtype:
            return {"y": str(value).removeprefix("torch.")}
        if kind is torch.device:
            return {"v": str(value)}
        if kind in (torch.Tensor, torch.nn.Parameter):
            return self.tensor(value)
        if kind in (list, tuple, set, frozenset, dict):
            if id(value) in self.path:
                return self.opaque(value, "it contains itself")
            self.path.append(id(value))
            try:
                if kind is dict:
                    return {"d": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                  for k, v in value.items()]}
                tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}[kind]
                return {tag: [self.encode(v, depth + 1) for v in value]}
            finally:
                self.path.pop()
        if isinstance(value, enum.Enum) and self.allowed.name_of(kind) in self.allowed.enums:
            return {"e": [self.allowed.name_of(kind), value.name]}
        record = self.allowed.by_class.get(kind)
        if record is not None:
            fields = record.fields(value)
            return {"o": [record.name, {k: self.encode(v, depth + 1) for k, v in fields.items()}]}
        return self.opaque(value, f"a {kind.__module__}.{kind.__qualname__} is not data")

    def tensor(self, t: torch.Tensor) -> Any:
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES or t.layout != torch.strided or t.is_quantized or t.is_meta:
            return self.opaque(t, f"a {t.dtype} {t.layout} tensor is not data")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return {"T": {"dtype": name, "shape": list(t.shape), "at": self.blob(raw),
                      "grad": bool(t.requires_grad),
                      "param": type(t) is torch.nn.Parameter}}

    def opaque(self, value: Any, why: str) -> Any:
        if self.handle is None:
            raise NotData(why)
        return {"h": self.handle(value)}


def encode(value: Any, allowed: Allowed = NOTHING_ALLOWED,
           handle: Callable[[Any], list] | None = None) -> bytes:
    """`value` as bytes that `decode` reads. What is not data becomes `{"h": handle(value)}`
    where `handle` is given (a JSON list the receiver's handle maker reads), else NotData."""
    enc = _Encoder(allowed, handle)
    tree = json.dumps(enc.encode(value), allow_nan=False, separators=(",", ":")).encode()
    return MAGIC + len(tree).to_bytes(8, "big") + tree + b"".join(enc.blobs)


# -- decoding (the receiver's side) ----------------------------------------------------------------


class _Decoder:
    def __init__(self, blobs: memoryview, allowed: Allowed,
                 handle: Callable[[list], Any] | None) -> None:
        self.blobs, self.allowed, self.handle = blobs, allowed, handle
        self.nodes = 0

    def decode(self, node: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise NotData(f"more than {MAX_NODES} values or nested deeper than {MAX_DEPTH}")
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is not dict or len(node) != 1:
            raise NotData(f"not a node: a {type(node).__name__}")
        ((tag, body),) = node.items()
        sub = depth + 1
        if tag in ("l", "t", "s", "f"):
            items = [self.decode(v, sub) for v in _list(body, tag)]
            return {"l": list, "t": tuple, "s": _hashed(set), "f": _hashed(frozenset)}[tag](items)
        if tag == "d":
            out = {}
            for pair in _list(body, tag):
                if type(pair) is not list or len(pair) != 2:
                    raise NotData("a dict item is not a [key, value] pair")
                key, value = self.decode(pair[0], sub), self.decode(pair[1], sub)
                try:
                    out[key] = value
                except TypeError:
                    raise NotData(f"a dict key of type {type(key).__name__}") from None
            return out
        if tag == "x":
            if body not in ("nan", "inf", "-inf"):
                raise NotData(f"not a float: {body!r:.40}")
            return float(body)
        if tag == "c":
            re_, im = (self.decode(v, sub) for v in _list(body, tag, 2))
            if type(re_) is not float or type(im) is not float:
                raise NotData("a complex number of non-floats")
            return complex(re_, im)
        if tag == "b":
            return bytes(self.blob(body))
        if tag == "r":
            parts = _list(body, tag, 3)
            if not all(type(p) is int for p in parts) or parts[2] == 0:
                raise NotData("not a range")
            return range(*parts)
        if tag == "z":
            dims = _list(body, tag)
            if not all(type(d) is int and d >= 0 for d in dims):
                raise NotData("not a torch.Size")
            return torch.Size(dims)
        if tag == "y":
            if body not in DTYPES:
                raise NotData(f"not a dtype: {body!r:.40}")
            return DTYPES[body]
        if tag == "v":
            if type(body) is not str or len(body) > 32:
                raise NotData("not a device")
            try:
                return torch.device(body)
            except (RuntimeError, ValueError):
                raise NotData(f"not a device: {body!r:.40}") from None
        if tag == "T":
            return self.tensor(body)
        if tag == "e":
            name, member = _list(body, tag, 2)
            cls = self.allowed.enums.get(name) if type(name) is str else None
            if cls is None or type(member) is not str or member not in cls.__members__:
                raise NotData(f"not an allowed enum member: {name!r:.80}")
            return cls[member]
        if tag == "o":
            name, fields = _list(body, tag, 2)
            record = self.allowed.records.get(name) if type(name) is str else None
            if record is None:
                raise NotData(f"{name!r:.80} is not a class the harness accepts")
            if type(fields) is not dict:
                raise NotData(f"{name}'s fields are not a mapping")
            values = {k: self.decode(v, sub) for k, v in fields.items()}
            try:
                return record.build(values)
            except Exception as exc:   # noqa: BLE001 - a constructor refusing what was sent
                raise NotData(f"{name} could not be rebuilt: {type(exc).__name__}: "
                              f"{str(exc)[:200]}") from None
        if tag == "h":
            if self.handle is None or type(body) is not list:
                raise NotData("a handle, where only data is accepted")
            return self.handle(body)
        raise NotData(f"unknown node {tag!r:.20}")

    def blob(self, at: Any) -> memoryview:
        start, length = _list(at, "at", 2)
        if not (type(start) is int and type(length) is int and 0 <= start
                and 0 <= length and start + length <= len(self.blobs)):
            raise NotData("points outside its bytes")
        return self.blobs[start:start + length]

    def tensor(self, body: Any) -> torch.Tensor:
        if type(body) is not dict or set(body) != {"dtype", "shape", "at", "grad", "param"}:
            raise NotData("not a tensor")
        dtype = DTYPES.get(body["dtype"]) if type(body["dtype"]) is str else None
        shape = body["shape"]
        if dtype is None or type(shape) is not list or not all(
                type(d) is int and d >= 0 for d in shape) or len(shape) > 16:
            raise NotData("a tensor of an unknown dtype or shape")
        raw = self.blob(body["at"])
        numel = math.prod(shape)
        if numel * dtype.itemsize != len(raw):
            raise NotData(f"a tensor of shape {shape} holds {len(raw)} bytes")
        flat = (torch.frombuffer(bytearray(raw), dtype=dtype) if numel
                else torch.empty(0, dtype=dtype))
        t = flat.reshape(shape)
        if body["param"] is True:
            return torch.nn.Parameter(t, requires_grad=body["grad"] is True)
        return t.requires_grad_(body["grad"] is True and (dtype.is_floating_point
                                                          or dtype.is_complex))


def _list(body: Any, tag: str, length: int | None = None) -> list:
    if type(body) is not list or (length is not None and len(body) != length):
        raise NotData(f"a malformed {tag!r} node")
    return body


def _hashed(kind: type) -> Callable[[list], Any]:
    def make(items: list) -> Any:
        try:
            return kind(items)
        except TypeError:
            raise NotData(f"a {kind.__name__} of unhashable items") from None
    return make


def decode(data: bytes, allowed: Allowed = NOTHING_ALLOWED,
           handle: Callable[[list], Any] | None = None, max_bytes: int = MAX_BYTES) -> Any:
    """The value `encode` wrote; NotData for anything else. `handle` makes the receiver's object
    for a handle node (none: a handle is refused)."""
    if len(data) > max_bytes:
        raise NotData(f"{len(data)} bytes, over the limit of {max_bytes}")
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise NotData("not the harness's data format")
    view = memoryview(data)
    start = len(MAGIC) + 8
    length = int.from_bytes(data[len(MAGIC):start], "big")
    if length > len(data) - start:
        raise NotData("truncated")
    try:
        tree = json.loads(bytes(view[start:start + length]))
    except (ValueError, RecursionError) as exc:
        raise NotData(f"not a JSON tree: {type(exc).__name__}") from None
    return _Decoder(view[start + length:], allowed, handle).decode(tree)


__all__ = ["DTYPES", "MAGIC", "MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "NOTHING_ALLOWED",
           "Allowed", "NotData", "Record", "decode", "encode"]
