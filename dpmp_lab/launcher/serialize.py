"""Pickling between the notebook and its ranks.

cloudpickle carries functions and classes defined in a notebook by value. Two changes:
  * code objects keep their file name (cloudpickle replaces it with "<dynamic-code>"), so a
    traceback from a rank points at the notebook cell that raised;
  * tensors on an accelerator travel as CPU tensors, so the notebook kernel never initialises
    CUDA by unpickling a rank's result.
"""

from __future__ import annotations

import io
import marshal
import types
from typing import Any

import cloudpickle
import torch


def _identity(x: Any) -> Any:
    return x


class Pickler(cloudpickle.Pickler):
    """cloudpickle's, with code objects whole and accelerator tensors moved to the CPU."""

    def reducer_override(self, obj):
        if isinstance(obj, types.CodeType):
            # marshal is how .pyc files store code: exact, file name and line numbers included.
            return marshal.loads, (marshal.dumps(obj),)
        if isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            return _identity, (obj.detach().cpu(),)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    Pickler(buf).dump(obj)
    return buf.getvalue()


loads = cloudpickle.loads
