"""Sharded layers: each rank holds its slice of a dense layer's weight.

    fc1 = tp.ColumnParallelLinear.from_dense(dense.fc1, group)   # this rank's rows of A
    fc2 = tp.RowParallelLinear.from_dense(dense.fc2, group)      # this rank's columns of A

A ColumnParallelLinear followed by a RowParallelLinear communicates once per direction (the
pair Megatron builds its MLP and attention from); VocabParallelEmbedding splits an embedding
table by vocabulary rows. Built from scratch, a layer draws the whole dense weight from
torch's RNG and keeps its shard; `from_dense` keeps the shard of an existing module.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dpmp_lab.i18n.messages import _
from dpmp_lab.tp.mappings import (
    check_divisible,
    check_group,
    check_ids,
    copy_to_tp_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    scatter_to_tp_region,
    shard_tensor,
    tensor_arg,
    tp_size,
)

__all__ = ["ColumnParallelLinear", "HoldsGroup", "RowParallelLinear", "Sharded",
           "VocabParallelEmbedding", "check_features", "check_type"]


class HoldsGroup(nn.Module):
    """A module that keeps its tp group in `self.group`. A copy (copy.deepcopy) shares the
    group: a process group is a connection to the other ranks, not data to duplicate."""

    group: dist.ProcessGroup

    def __deepcopy__(self, memo: dict) -> nn.Module:
        memo[id(self.group)] = self.group
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new


class Sharded(HoldsGroup):
    """A layer holding this rank's shard of a dense module's parameters.

    `split_dims` names the parameters that are split, and along which dim; every other
    parameter is replicated on all ranks of the group.
    """

    split_dims: dict[str, int] = {}

    def load_dense(self, dense: nn.Module) -> None:
        """Copy this rank's shard of every parameter of `dense` (same names) into this layer."""
        with torch.no_grad():
            for name, param in self.named_parameters(recurse=False):
                full = getattr(dense, name)
                dim = self.split_dims.get(name)
                piece = full if dim is None else shard_tensor(full, self.group, dim)
                if piece.shape != param.shape:
                    raise ValueError(_("{layer}: the dense {name} of shape {shape} does not "
                                       "fit this layer's {mine}").format(
                        layer=type(self).__name__, name=name, shape=tuple(full.shape),
                        mine=tuple(param.shape)))
                param.copy_(piece)

    def _materialise(self, dense: nn.Module) -> None:
        """Turn a layer built on the meta device (no init, no RNG drawn) into dense's shard."""
        self.to_empty(device=next(dense.parameters()).device)
        self.load_dense(dense)


def check_type(module: object, expected: type, cls: type) -> None:
    if not isinstance(module, expected):
        where = "nn" if expected.__module__.startswith("torch.nn") else expected.__module__
        raise TypeError(_("{cls}.from_dense needs a {where}.{expected}, not {kind}").format(
            cls=cls.__name__, where=where, expected=expected.__name__,
            kind=type(module).__name__))


def check_features(x: torch.Tensor, expected: int, who: str, hint: str = "") -> None:
    if x.dim() == 0 or x.shape[-1] != expected:
        raise ValueError(_("{who} expects inputs whose last dim is {expected}, got shape "
                           "{shape}{hint}").format(who=who, expected=expected,
                                                   shape=tuple(x.shape), hint=hint))


class _ParallelLinear(Sharded):
    """What column- and row-parallel layers share: their shard is cut from a dense nn.Linear."""

    def reset_parameters(self) -> None:
        """Draw the dense nn.Linear from torch's RNG and keep this rank's shard (its rows when
        column-parallel, its columns when row-parallel)."""
        self.load_dense(nn.Linear(self.in_features, self.out_features, self.bias is not None,
                                  device=self.weight.device, dtype=self.weight.dtype))


class ColumnParallelLinear(_ParallelLinear):
    """y = x A^T + b with A split by rows (output features): rank r computes its slice of y.

    Weight shard (out_features/tp, in_features), bias shard (out_features/tp,).
    Forward:  copy_to_tp_region (nothing), local matmul; with gather_output, 1 all_gather.
    Backward: 1 all_reduce of the input gradient (copy_to); gather's backward sends nothing.
    Without gather_output the output stays sliced: the input a RowParallelLinear expects.
    With copy_input=False the caller has put x through copy_to_tp_region already, as attention
    does once for q, k and v: their input gradients add up before that one f all-reduces them.
    """

    split_dims = {"weight": 0, "bias": 0}

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup,
                 bias: bool = True, gather_output: bool = False, *, copy_input: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.group = check_group(group)
        local_out = check_divisible(out_features, tp_size(group), "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.copy_input = gather_output, copy_input
        self.weight = nn.Parameter(torch.empty(local_out, in_features, device=device,
                                               dtype=dtype))
        self.bias = nn.Parameter(torch.empty(local_out, device=device, dtype=dtype)) \
            if bias else None
        if self.weight.device.type != "meta":
            self.reset_parameters()

    @classmethod
    def from_dense(cls, dense: nn.Linear, group: dist.ProcessGroup, gather_output: bool = False,
                   *, copy_input: bool = True) -> ColumnParallelLinear:
        """This rank's rows of `dense` (an nn.Linear), as a ColumnParallelLinear."""
        check_type(dense, nn.Linear, cls)
        layer = cls(dense.in_features, dense.out_features, group, dense.bias is not None,
                    gather_output, copy_input=copy_input, device="meta",
                    dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features(tensor_arg(x, "x"), self.in_features, "ColumnParallelLinear")
        if self.copy_input:
            x = copy_to_tp_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tp_region(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (this rank: "
                f"{self.weight.shape[0]}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}"
                + ("" if self.copy_input else ", copy_input=False"))


class RowParallelLinear(_ParallelLinear):
    """y = x A^T + b with A split by columns (input features): rank r multiplies its slice of x
    by its columns, giving a partial sum of the whole y.

    Weight shard (out_features, in_features/tp); the bias is NOT split: it is added once, after
    the partial sums are reduced, and is replicated (same value and gradient on every rank).
    Forward:  [scatter_to_tp_region (nothing) unless input_is_parallel], local matmul,
              1 all_reduce (reduce_from), + bias.
    Backward: nothing with input_is_parallel; else 1 all_gather of the input gradient.
    """

    split_dims = {"weight": 1}

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup,
                 bias: bool = True, input_is_parallel: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.group = check_group(group)
        self.local_in = check_divisible(in_features, tp_size(group), "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in, device=device,
                                               dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) \
            if bias else None
        if self.weight.device.type != "meta":
            self.reset_parameters()

    @classmethod
    def from_dense(cls, dense: nn.Linear, group: dist.ProcessGroup,
                   input_is_parallel: bool = True) -> RowParallelLinear:
        """This rank's columns of `dense` (an nn.Linear), as a RowParallelLinear."""
        check_type(dense, nn.Linear, cls)
        layer = cls(dense.in_features, dense.out_features, group, dense.bias is not None,
                    input_is_parallel, device="meta", dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = tensor_arg(x, "x")
        if not self.input_is_parallel:
            check_features(x, self.in_features, "RowParallelLinear(input_is_parallel=False)")
            x = scatter_to_tp_region(x, self.group)
        check_features(x, self.local_in, "RowParallelLinear",
                       _(": this rank's slice of the {n} input features (pass "
                         "input_is_parallel=False to give it the whole input)").format(
                           n=self.in_features))
        y = reduce_from_tp_region(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.local_in}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(Sharded):
    """An embedding table split by vocabulary rows: rank r owns token ids
    [r * V/tp, (r + 1) * V/tp). Each rank looks up the ids it owns, writes zeros for the others,
    and the all-reduce fills in every row from the rank that owns it.

    Forward:  1 all_reduce (reduce_from) of the (..., dim) output.
    Backward: nothing; a rank's gradient reaches only the rows it owns.
    """

    split_dims = {"weight": 0}

    def __init__(self, num_embeddings: int, embedding_dim: int, group: dist.ProcessGroup, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.group = check_group(group)
        self.per_rank = check_divisible(num_embeddings, tp_size(group), "num_embeddings")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.start = dist.get_rank(group) * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim, device=device,
                                               dtype=dtype))
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the dense nn.Embedding from torch's RNG and keep this rank's rows."""
        self.load_dense(nn.Embedding(self.num_embeddings, self.embedding_dim,
                                     device=self.weight.device, dtype=self.weight.dtype))

    @classmethod
    def from_dense(cls, dense: nn.Embedding, group: dist.ProcessGroup) -> VocabParallelEmbedding:
        """This rank's vocabulary rows of `dense` (a plain nn.Embedding)."""
        check_type(dense, nn.Embedding, cls)
        if dense.padding_idx is not None or dense.max_norm is not None:
            raise ValueError(_("VocabParallelEmbedding.from_dense supports a plain "
                               "nn.Embedding (no padding_idx, no max_norm)"))
        layer = cls(dense.num_embeddings, dense.embedding_dim, group, device="meta",
                    dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        what = _("token ids")
        check_ids(tensor_arg(ids, what), self.num_embeddings, what)
        local = ids - self.start
        elsewhere = (local < 0) | (local >= self.per_rank)
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        rows = rows.masked_fill(elsewhere.unsqueeze(-1), 0.0)
        return reduce_from_tp_region(rows, self.group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim} (this rank: ids {self.start}.."
                f"{self.start + self.per_rank - 1})")
