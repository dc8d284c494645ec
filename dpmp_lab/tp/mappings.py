"""Where tensor parallelism communicates: Megatron's region ops (its mappings.py), and shard_tensor().

    y = reduce_from_tp_region(partial_y, group)    # g: all-reduce forward, identity backward
    x = copy_to_tp_region(x, group)                # f: identity forward, all-reduce backward

Every op is a tiny autograd function whose forward and backward are each either nothing or
one collective over the tp group; the layers in tp.layers never call torch.distributed
themselves. The checks here (a real tp group, a size that splits evenly) are shared by every
tp module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dpmp_lab._torch_helpers import member_group, tensor_arg
from dpmp_lab.i18n.messages import N_, _

__all__ = ["check_divisible", "check_group", "check_ids", "copy_to_tp_region",
           "gather_from_sequence_region", "gather_from_tp_region", "reduce_from_tp_region",
           "reduce_scatter_to_sequence_region", "scatter_to_tp_region", "shard_tensor",
           "tp_all_gather", "tp_all_reduce", "tp_reduce_scatter", "tp_size"]

# -- the tp group and splitting along a dim --------------------------------------------------------


def check_group(group: object) -> dist.ProcessGroup:
    return member_group(group, "tp", N_("tensor-parallel"),
                        "dl.ProcessGrid(tp=...).tp_group or dist.group.WORLD")


def tp_size(group: dist.ProcessGroup) -> int:
    return dist.get_world_size(check_group(group))


def _normalise_dim(x: torch.Tensor, dim: int) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(_("dim={dim} is out of range for a tensor of shape {shape}").format(
            dim=dim, shape=tuple(x.shape)))
    return dim % x.dim()


def check_divisible(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ValueError(_("{what} = {size} does not split evenly over {tp} tensor-parallel "
                           "ranks ({size} % {tp} = {rest}): choose a size divisible by "
                           "{tp}").format(what=what, size=size, tp=tp, rest=size % tp))
    return size // tp


def check_ids(ids: torch.Tensor, vocab: int, what: str) -> None:
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(_("{what} must be an integer tensor (torch.long), not {dtype}").format(
            what=what, dtype=ids.dtype))
    # every rank checks the same ids, so all raise together and nobody waits in a collective
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(_("{what} must lie in [0, {vocab}), got values from {low} to "
                           "{high}").format(what=what, vocab=vocab, low=int(ids.min()),
                                            high=int(ids.max())))


def shard_tensor(tensor: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """This rank's contiguous slice of `tensor` along `dim` (rank r of the group gets slice r).

    What from_dense keeps of a dense weight, and what a test compares a shard's gradient with.
    """
    tensor = tensor_arg(tensor, "tensor")
    tp, dim = tp_size(group), _normalise_dim(tensor, dim)
    size = check_divisible(tensor.shape[dim], tp, _("size of dim {dim}").format(dim=dim))
    return tensor.narrow(dim, dist.get_rank(group) * size, size).contiguous()


# -- the communication itself (no autograd here) ---------------------------------------------------


def tp_all_reduce(x: torch.Tensor, group: dist.ProcessGroup,
                  op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    # a contiguous copy: gloo needs contiguous memory, and a gradient handed to backward may
    # be shared with other nodes or be an expanded view (x.sum().backward() gives one)
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=op, group=group)
    return out


def tp_all_gather(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    # all_gather_single concatenates along dim 0, so bring `dim` to the front and back
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((tp_size(group) * front.shape[0], *front.shape[1:]))
    dist.all_gather_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def tp_reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    front = x.movedim(dim, 0).contiguous()
    size = check_divisible(front.shape[0], tp_size(group),
                           _("size of dim {dim}").format(dim=dim))
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
        return tp_all_reduce(grad, ctx.group), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: forward all-reduces the partial sums; backward passes the (replicated) gradient on."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return tp_all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTPRegion(torch.autograd.Function):
    """Forward all-gathers the slices along the last dim; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return tp_all_gather(x, group, x.dim() - 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return shard_tensor(grad, ctx.group, -1), None


class _ScatterToTPRegion(torch.autograd.Function):
    """Forward keeps this rank's slice of the last dim; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return shard_tensor(x, group, -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tp_all_gather(grad, ctx.group, grad.dim() - 1), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Forward all-gathers the sequence; backward reduce-scatters: the gathered sequence feeds
    tensor-parallel layers, so each rank holds a partial gradient of the whole sequence."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return tp_all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return tp_reduce_scatter(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Forward sums the partial outputs and keeps this rank's part of the sequence; backward
    all-gathers the gradient, because every rank's partial output touched the whole sequence."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return tp_reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return tp_all_gather(grad, ctx.group, ctx.dim), None, None


def _region(fn: type[torch.autograd.Function], x: torch.Tensor, group: dist.ProcessGroup,
            *extra: int) -> torch.Tensor:
    x = tensor_arg(x, "x")
    if tp_size(group) == 1:
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
    x = tensor_arg(x, "x")
    if x.dim() == 0:
        raise ValueError(_("scatter_to_tp_region needs a tensor with at least one dim"))
    check_divisible(x.shape[-1], tp_size(group), _("size of the last dim"))
    return _region(_ScatterToTPRegion, x, group)


def gather_from_sequence_region(x: torch.Tensor, group: dist.ProcessGroup,
                                dim: int = 1) -> torch.Tensor:
    """Sequence parallel: forward 1 all_gather of the sequence along `dim` (default 1, as in
    (batch, seq, hidden); every rank's part has the same shape); backward 1 reduce_scatter of
    the gradient along `dim`."""
    x = tensor_arg(x, "x")
    return _region(_GatherFromSequenceRegion, x, group, _normalise_dim(x, dim))


def reduce_scatter_to_sequence_region(x: torch.Tensor, group: dist.ProcessGroup,
                                      dim: int = 1) -> torch.Tensor:
    """Sequence parallel: forward 1 reduce_scatter along `dim` (sum the partial outputs, keep
    this rank's part of the sequence; ValueError when it does not split evenly); backward
    1 all_gather of the gradient along `dim`."""
    x = tensor_arg(x, "x")
    dim = _normalise_dim(x, dim)
    check_divisible(x.shape[dim], tp_size(group),
                    _("size of dim {dim} (the sequence)").format(dim=dim))
    return _region(_ReduceScatterToSequenceRegion, x, group, dim)
