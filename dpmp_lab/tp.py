"""Tensor parallelism as Megatron-LM does it: split every big matmul over the ranks of a tp group.

    group = dl.ProcessGrid(tp=4).tp_group                  # inside a rank
    mlp = tp.ParallelMLP.from_dense(dense_mlp, group)      # this rank's quarter of the weights
    model = tp.parallelize_gpt(dl.models.TinyGPT(), group)
    loss = tp.tp_lm_loss(model(idx), targets, group)

The idea. A linear layer y = x A^T can be split two ways. Split A by rows (output features,
"column parallel" in the paper's X A notation): every rank needs all of x and computes a slice
of y. Split A by columns (input features, "row parallel"): every rank needs only its slice of
x and computes a partial sum of the whole y, which an all-reduce completes. Put a column layer
first and a row layer second (MLP: fc1 then fc2; attention: q/k/v then the output projection)
and the slice that comes out of the first is exactly the slice the second needs: one
all-reduce in forward, one in backward, per block.

Where the communication lives: two tiny autograd functions, Megatron's f and g.
    copy_to_tp_region     (f)  forward: identity        backward: all-reduce the gradient
    reduce_from_tp_region (g)  forward: all-reduce      backward: identity
f sits where a replicated tensor enters the parallel region (each rank's slice contributes a
part of the input's gradient, so the parts are summed); g where partial sums leave it. Their
relatives gather or split along the last dim (gather_from / scatter_to_tp_region) or, for
sequence parallelism, along the sequence dim (gather_from_sequence_region /
reduce_scatter_to_sequence_region).

The words "replicated" and "parallel" follow Megatron: a tensor in the replicated region is the
same on every rank of the group, and so is its gradient; a tensor in the parallel region is this
rank's slice or partial sum. The group rank is the shard index: rank r owns slice r.

Every layer takes an explicit tp process group and has `from_dense(module, group)`, which keeps
this rank's shard of an existing dense module, so a parallel model can be checked number for
number against the single-process one. Built from scratch, a layer draws the whole dense weight
(as nn.Linear / nn.Embedding would, from torch's RNG) and keeps its shard: seed every rank of
the group alike, as the replicated parameters (layer norms, biases after g) need anyway.

With a group of one rank every region op is the identity and nothing is communicated.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dpmp_lab import models

# -- the tp group and splitting along a dim --------------------------------------------------------


def _check_group(group: object) -> dist.ProcessGroup:
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError("group must be the tensor-parallel torch.distributed ProcessGroup (e.g. "
                        f"dl.ProcessGrid(tp=...).tp_group or dist.group.WORLD), not "
                        f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the tp group "
                         f"{dist.get_process_group_ranks(group)} it was given")
    return group


def _tp_size(group: dist.ProcessGroup) -> int:
    return dist.get_world_size(_check_group(group))


def _check_tensor(x: object, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(x).__name__}")
    return x


def _normalise_dim(x: torch.Tensor, dim: int) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def _check_divisible(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ValueError(f"{what} = {size} does not split evenly over {tp} tensor-parallel "
                         f"ranks ({size} % {tp} = {size % tp}): choose a size divisible by {tp}")
    return size // tp


def shard(tensor: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """This rank's contiguous slice of `tensor` along `dim` (rank r of the group gets slice r).

    What from_dense keeps of a dense weight, and what a test compares a shard's gradient with.
    """
    tensor = _check_tensor(tensor, "tensor")
    tp, dim = _tp_size(group), _normalise_dim(tensor, dim)
    size = _check_divisible(tensor.shape[dim], tp, f"size of dim {dim}")
    return tensor.narrow(dim, dist.get_rank(group) * size, size).contiguous()


# -- the communication itself (no autograd here) ---------------------------------------------------


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup,
                op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    # a contiguous copy: gloo needs contiguous memory, and a gradient handed to backward may
    # be shared with other nodes or be an expanded view (x.sum().backward() gives one)
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=op, group=group)
    return out


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    # all_gather_into_tensor concatenates along dim 0, so bring `dim` to the front and back
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((_tp_size(group) * front.shape[0], *front.shape[1:]))
    dist.all_gather_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    front = x.movedim(dim, 0).contiguous()
    size = _check_divisible(front.shape[0], _tp_size(group), f"size of dim {dim}")
    out = front.new_empty((size, *front.shape[1:]))
    dist.reduce_scatter_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


# -- the region ops: Megatron's f and g and their relatives ----------------------------------------


class _CopyToTPRegion(torch.autograd.Function):
    """f: identity forward; backward all-reduces, since every rank's slice used the whole x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: forward all-reduces the partial sums; backward passes the (replicated) gradient on."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTPRegion(torch.autograd.Function):
    """Forward all-gathers the slices along the last dim; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_gather(x, group, x.dim() - 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return shard(grad, ctx.group, -1), None


class _ScatterToTPRegion(torch.autograd.Function):
    """Forward keeps this rank's slice of the last dim; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return shard(x, group, -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.group, grad.dim() - 1), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Forward all-gathers the sequence; backward reduce-scatters: the gathered sequence feeds
    tensor-parallel layers, so each rank holds a partial gradient of the whole sequence."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Forward sums the partial outputs and keeps this rank's part of the sequence; backward
    all-gathers the gradient, because every rank's partial output touched the whole sequence."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.group, ctx.dim), None, None


def _region(fn: type[torch.autograd.Function], x: torch.Tensor, group: dist.ProcessGroup,
            *extra: int) -> torch.Tensor:
    x = _check_tensor(x, "x")
    if _tp_size(group) == 1:
        return x
    return fn.apply(x, group, *extra)


def copy_to_tp_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """f. Forward: x unchanged, no communication. Backward: 1 all_reduce (SUM) of the gradient."""
    return _region(_CopyToTPRegion, x, group)


def reduce_from_tp_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """g. Forward: 1 all_reduce (SUM) of the partial sums. Backward: identity, no communication."""
    return _region(_ReduceFromTPRegion, x, group)


def gather_from_tp_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward: 1 all_gather along the last dim (every rank's slice has the same shape).
    Backward: keep this rank's slice, no communication."""
    return _region(_GatherFromTPRegion, x, group)


def scatter_to_tp_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward: keep this rank's slice of the last dim, no communication (ValueError when it
    does not split evenly). Backward: 1 all_gather along the last dim."""
    x = _check_tensor(x, "x")
    if x.dim() == 0:
        raise ValueError("scatter_to_tp_region needs a tensor with at least one dim")
    _check_divisible(x.shape[-1], _tp_size(group), "size of the last dim")
    return _region(_ScatterToTPRegion, x, group)


def gather_from_sequence_region(x: torch.Tensor, group: dist.ProcessGroup,
                                dim: int = 1) -> torch.Tensor:
    """Sequence parallel: forward 1 all_gather of the sequence along `dim` (default 1, as in
    (batch, seq, hidden); every rank's part has the same shape); backward 1 reduce_scatter of
    the gradient along `dim`."""
    x = _check_tensor(x, "x")
    return _region(_GatherFromSequenceRegion, x, group, _normalise_dim(x, dim))


def reduce_scatter_to_sequence_region(x: torch.Tensor, group: dist.ProcessGroup,
                                      dim: int = 1) -> torch.Tensor:
    """Sequence parallel: forward 1 reduce_scatter along `dim` (sum the partial outputs, keep
    this rank's part of the sequence; ValueError when it does not split evenly); backward
    1 all_gather of the gradient along `dim`."""
    x = _check_tensor(x, "x")
    dim = _normalise_dim(x, dim)
    _check_divisible(x.shape[dim], _tp_size(group), f"size of dim {dim} (the sequence)")
    return _region(_ReduceScatterToSequenceRegion, x, group, dim)


# -- sharded layers --------------------------------------------------------------------------------


class _HoldsGroup(nn.Module):
    """A module that keeps its tp group in `self.group`. A copy (copy.deepcopy) shares the
    group: a process group is a connection to the other ranks, not data to duplicate."""

    group: dist.ProcessGroup

    def __deepcopy__(self, memo: dict) -> nn.Module:
        memo[id(self.group)] = self.group
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new


class _Sharded(_HoldsGroup):
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
                piece = full if dim is None else shard(full, self.group, dim)
                if piece.shape != param.shape:
                    raise ValueError(f"{type(self).__name__}: the dense {name} of shape "
                                     f"{tuple(full.shape)} does not fit this layer's "
                                     f"{tuple(param.shape)}")
                param.copy_(piece)

    def _materialise(self, dense: nn.Module) -> None:
        """Turn a layer built on the meta device (no init, no RNG drawn) into dense's shard."""
        self.to_empty(device=next(dense.parameters()).device)
        self.load_dense(dense)


def _check_type(module: object, expected: type, cls: type) -> None:
    if not isinstance(module, expected):
        where = "nn" if expected.__module__.startswith("torch.nn") else expected.__module__
        raise TypeError(f"{cls.__name__}.from_dense needs a {where}.{expected.__name__}, not "
                        f"{type(module).__name__}")


def _check_features(x: torch.Tensor, expected: int, who: str, hint: str = "") -> None:
    if x.dim() == 0 or x.shape[-1] != expected:
        raise ValueError(f"{who} expects inputs whose last dim is {expected}, got shape "
                         f"{tuple(x.shape)}{hint}")


class ColumnParallelLinear(_Sharded):
    """y = x A^T + b with A split by rows (output features): rank r computes its slice of y.

    Weight shard (out_features/tp, in_features), bias shard (out_features/tp,).
    Forward:  copy_to_tp_region (nothing), local matmul; with gather_output, 1 all_gather.
    Backward: 1 all_reduce of the input gradient (copy_to); gather's backward sends nothing.
    Without gather_output the output stays sliced: the input a RowParallelLinear expects.
    """

    split_dims = {"weight": 0, "bias": 0}

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup,
                 bias: bool = True, gather_output: bool = False, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.group = _check_group(group)
        local_out = _check_divisible(out_features, _tp_size(group), "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.weight = nn.Parameter(torch.empty(local_out, in_features, device=device,
                                               dtype=dtype))
        self.bias = nn.Parameter(torch.empty(local_out, device=device, dtype=dtype)) \
            if bias else None
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the dense nn.Linear from torch's RNG and keep this rank's rows."""
        self.load_dense(nn.Linear(self.in_features, self.out_features, self.bias is not None,
                                  device=self.weight.device, dtype=self.weight.dtype))

    @classmethod
    def from_dense(cls, dense: nn.Linear, group: dist.ProcessGroup,
                   gather_output: bool = False) -> ColumnParallelLinear:
        """This rank's rows of `dense` (an nn.Linear), as a ColumnParallelLinear."""
        _check_type(dense, nn.Linear, cls)
        layer = cls(dense.in_features, dense.out_features, group, dense.bias is not None,
                    gather_output, device="meta", dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(_check_tensor(x, "x"), self.in_features, "ColumnParallelLinear")
        y = F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)
        return gather_from_tp_region(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (this rank: "
                f"{self.weight.shape[0]}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}")


class RowParallelLinear(_Sharded):
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
        self.group = _check_group(group)
        self.local_in = _check_divisible(in_features, _tp_size(group), "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in, device=device,
                                               dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) \
            if bias else None
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the dense nn.Linear from torch's RNG and keep this rank's columns."""
        self.load_dense(nn.Linear(self.in_features, self.out_features, self.bias is not None,
                                  device=self.weight.device, dtype=self.weight.dtype))

    @classmethod
    def from_dense(cls, dense: nn.Linear, group: dist.ProcessGroup,
                   input_is_parallel: bool = True) -> RowParallelLinear:
        """This rank's columns of `dense` (an nn.Linear), as a RowParallelLinear."""
        _check_type(dense, nn.Linear, cls)
        layer = cls(dense.in_features, dense.out_features, group, dense.bias is not None,
                    input_is_parallel, device="meta", dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_tensor(x, "x")
        if not self.input_is_parallel:
            _check_features(x, self.in_features, "RowParallelLinear(input_is_parallel=False)")
            x = scatter_to_tp_region(x, self.group)
        _check_features(x, self.local_in, "RowParallelLinear",
                        f": this rank's slice of the {self.in_features} input features (pass "
                        "input_is_parallel=False to give it the whole input)")
        y = reduce_from_tp_region(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.local_in}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(_Sharded):
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
        self.group = _check_group(group)
        self.per_rank = _check_divisible(num_embeddings, _tp_size(group), "num_embeddings")
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
        _check_type(dense, nn.Embedding, cls)
        if dense.padding_idx is not None or dense.max_norm is not None:
            raise ValueError("VocabParallelEmbedding.from_dense supports a plain nn.Embedding "
                             "(no padding_idx, no max_norm)")
        layer = cls(dense.num_embeddings, dense.embedding_dim, group, device="meta",
                    dtype=dense.weight.dtype)
        layer._materialise(dense)
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        _check_ids(_check_tensor(ids, "token ids"), self.num_embeddings, "token ids")
        local = ids - self.start
        elsewhere = (local < 0) | (local >= self.per_rank)
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        rows = rows.masked_fill(elsewhere.unsqueeze(-1), 0.0)
        return reduce_from_tp_region(rows, self.group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim} (this rank: ids {self.start}.."
                f"{self.start + self.per_rank - 1})")


def _check_ids(ids: torch.Tensor, vocab: int, what: str) -> None:
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{what} must be an integer tensor (torch.long), not {ids.dtype}")
    # every rank checks the same ids, so all raise together and nobody waits in a collective
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"{what} must lie in [0, {vocab}), got values from {int(ids.min())} "
                         f"to {int(ids.max())}")


# -- cross entropy over vocab-sharded logits -------------------------------------------------------


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of (N, V/tp) logit shards, without ever gathering the (N, V) logits.

    log-softmax needs three numbers per token that span the whole vocabulary: the max logit
    (for stability), the sum of exp, and the target's logit (owned by one rank). Each is a
    local reduction plus one all-reduce. Backward needs no communication: the gradient of a
    rank's logits is softmax - one_hot restricted to its own vocabulary slice.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor,
                group: dist.ProcessGroup) -> torch.Tensor:
        per_rank = logits.shape[-1]
        start = dist.get_rank(group) * per_rank
        global_max = _all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - global_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group)
        local = targets - start
        mine = (local >= 0) & (local < per_rank)
        local = local.masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0)
        target_logit = _all_reduce(target_logit, group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, mine)
        return (sum_exp.log() - target_logit).mean()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, local, mine = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)[mine]
        grad[rows, local[mine]] -= 1.0
        return grad * (grad_loss / grad.shape[0]), None, None


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, targets: torch.Tensor,
                                 group: dist.ProcessGroup) -> torch.Tensor:
    """Mean cross entropy over all tokens when the vocab (last) dim of the logits is split over
    the group; equals F.cross_entropy on the gathered logits, on every rank.

    logits_shard (..., V/tp), targets (...) with ids in [0, V).
    Forward:  3 all_reduce of one number per token (max with ReduceOp.MAX, sum of exp, target
              logit). Backward: nothing.
    """
    logits_shard = _check_tensor(logits_shard, "logits_shard")
    targets = _check_tensor(targets, "targets")
    if logits_shard.dim() < 1 or logits_shard.shape[:-1] != targets.shape:
        raise ValueError(f"logits_shard (..., V/tp) and targets (...) must agree on the leading "
                         f"dims, got {tuple(logits_shard.shape)} and {tuple(targets.shape)}")
    tp = _tp_size(group)
    _check_ids(targets, logits_shard.shape[-1] * tp, "targets")
    logits = logits_shard.reshape(-1, logits_shard.shape[-1])
    targets = targets.reshape(-1)
    if tp == 1:
        return F.cross_entropy(logits, targets)
    return _VocabParallelCrossEntropy.apply(logits, targets, group)


def tp_lm_loss(logits_shard: torch.Tensor, targets: torch.Tensor,
               group: dist.ProcessGroup) -> torch.Tensor:
    """models.lm_loss for the vocab-sharded logits of a parallelize_gpt model: mean next-token
    cross entropy over every position (3 all_reduce forward, nothing backward)."""
    return vocab_parallel_cross_entropy(logits_shard, targets, group)


# -- transformer blocks ----------------------------------------------------------------------------


class ParallelMLP(nn.Module):
    """fc1 column-parallel -> GELU (on this rank's slice of d_ff) -> fc2 row-parallel.

    Forward: 1 all_reduce (fc2's g). Backward: 1 all_reduce (fc1's f), issued when the input
    requires grad, as it does inside a model.
    """

    def __init__(self, d_model: int, d_ff: int, group: dist.ProcessGroup, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.fc1 = ColumnParallelLinear(d_model, d_ff, group, device=device, dtype=dtype)
        self.fc2 = RowParallelLinear(d_ff, d_model, group, device=device, dtype=dtype)

    @classmethod
    def from_dense(cls, mlp: models.MLP, group: dist.ProcessGroup) -> ParallelMLP:
        """This rank's shard of a dpmp_lab.models.MLP."""
        _check_type(mlp, models.MLP, cls)
        layer = cls(mlp.fc1.in_features, mlp.fc1.out_features, group, device="meta",
                    dtype=mlp.fc1.weight.dtype)
        layer.fc1._materialise(mlp.fc1)
        layer.fc2._materialise(mlp.fc2)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelSelfAttention(_HoldsGroup):
    """Causal self-attention split by heads: rank r owns n_heads/tp whole heads.

    q, k, v are column-parallel (their output features are the heads, packed head after head,
    so a rank's rows are its heads), attention runs on the local heads with no communication,
    and the output projection is row-parallel.
    Forward: 1 all_reduce (o's g). Backward: 1 all_reduce: q, k and v read the same input, so
    one f covers all three (Megatron fuses them into one qkv matmul for the same reason).
    """

    def __init__(self, d_model: int, n_heads: int, group: dist.ProcessGroup, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        tp = _tp_size(group)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % tp:
            raise ValueError(f"n_heads={n_heads} does not split over tp={tp} ranks: each rank "
                             f"must own whole heads, so n_heads must be a multiple of {tp}")
        self.group = group
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.local_heads = n_heads // tp
        factory = {"device": device, "dtype": dtype}
        self.q = ColumnParallelLinear(d_model, d_model, group, **factory)
        self.k = ColumnParallelLinear(d_model, d_model, group, **factory)
        self.v = ColumnParallelLinear(d_model, d_model, group, **factory)
        self.o = RowParallelLinear(d_model, d_model, group, **factory)

    @classmethod
    def from_dense(cls, attn: models.CausalSelfAttention,
                   group: dist.ProcessGroup) -> ParallelSelfAttention:
        """This rank's heads of a dpmp_lab.models.CausalSelfAttention."""
        _check_type(attn, models.CausalSelfAttention, cls)
        layer = cls(attn.q.in_features, attn.n_heads, group, device="meta",
                    dtype=attn.q.weight.dtype)
        for name in ("q", "k", "v", "o"):
            getattr(layer, name)._materialise(getattr(attn, name))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(_check_tensor(x, "x"), self.q.in_features, "ParallelSelfAttention")
        x = copy_to_tp_region(x, self.group)
        q, k, v = (F.linear(x, lin.weight, lin.bias) for lin in (self.q, self.k, self.v))
        return self.o(models.attend(q, k, v, self.head_dim))


# -- a whole model ---------------------------------------------------------------------------------


def parallelize_gpt(model: models.TinyGPT, group: dist.ProcessGroup,
                    vocab_parallel: bool = True) -> nn.Module:
    """Make `model` tensor parallel over `group`, in place, keeping this rank's shards.

    Every block's attention and MLP become ParallelSelfAttention / ParallelMLP. With
    vocab_parallel, the token embedding becomes a VocabParallelEmbedding and the head's
    projection a ColumnParallelLinear without gather, so the model returns (B, T, V/tp) logit
    shards: use tp_lm_loss. Without it, embedding and head stay replicated and the model
    returns full logits (models.lm_loss). Layer norms and the position embedding stay
    replicated. Communication per step, vocab_parallel: forward 2 * n_layers + 1 all_reduce
    (+ 3 in tp_lm_loss), backward 2 * n_layers + 1.
    """
    if not isinstance(model, models.TinyGPT):
        raise TypeError(f"parallelize_gpt needs a dpmp_lab.models.TinyGPT, not "
                        f"{type(model).__name__}")
    # build every replacement before swapping any, so bad sizes leave the model untouched
    blocks = [(ParallelSelfAttention.from_dense(b.attn, group),
               ParallelMLP.from_dense(b.mlp, group)) for b in model.blocks]
    if vocab_parallel:
        tok = VocabParallelEmbedding.from_dense(model.embed.tok, group)
        proj = ColumnParallelLinear.from_dense(model.head.proj, group, gather_output=False)
    for block, (attn, mlp) in zip(model.blocks, blocks, strict=True):
        block.attn, block.mlp = attn, mlp
    if vocab_parallel:
        model.embed.tok, model.head.proj = tok, proj
    return model


def sharding(model: nn.Module) -> dict[str, int | None]:
    """{parameter name: the dim it is split along over the tp group, or None if replicated}.

    With shard(): `shard(dense_param, group, dim)` is what this rank holds of a dense model.
    """
    dims: dict[str, int | None] = {}
    for prefix, module in model.named_modules():
        split = getattr(module, "split_dims", {}) if isinstance(module, _Sharded) else {}
        for name, _ in module.named_parameters(recurse=False):
            dims[f"{prefix}.{name}" if prefix else name] = split.get(name)
    return dims


__all__ = ["ColumnParallelLinear", "ParallelMLP", "ParallelSelfAttention", "RowParallelLinear",
           "VocabParallelEmbedding", "copy_to_tp_region", "gather_from_sequence_region",
           "gather_from_tp_region", "parallelize_gpt", "reduce_from_tp_region",
           "reduce_scatter_to_sequence_region", "scatter_to_tp_region", "shard", "sharding",
           "tp_lm_loss", "vocab_parallel_cross_entropy"]
