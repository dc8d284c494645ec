"""TinyGPT made tensor parallel: Megatron's MLP and attention blocks, and parallelize_gpt.

    model = tp.parallelize_gpt(dl.models.TinyGPT(), group)   # in place, this rank's shards
    loss = tp.vocab_parallel_cross_entropy(model(idx), targets, group)   # vocab-sharded logits

Each block pairs a column-parallel layer with a row-parallel one, so a block communicates
once in forward and once in backward.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dpmp_lab.models as models
from dpmp_lab._torch_helpers import tensor_arg
from dpmp_lab.i18n.messages import _
from dpmp_lab.tp.cross_entropy import vocab_parallel_cross_entropy
from dpmp_lab.tp.layers import (
    ColumnParallelLinear,
    HoldsGroup,
    RowParallelLinear,
    Sharded,
    VocabParallelEmbedding,
    check_features,
    check_type,
)
from dpmp_lab.tp.mappings import copy_to_tp_region, tp_size

__all__ = ["ParallelMLP", "ParallelSelfAttention", "parallelize_gpt", "sharding", "tp_lm_loss"]

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
        check_type(mlp, models.MLP, cls)
        layer = cls(mlp.fc1.in_features, mlp.fc1.out_features, group, device="meta",
                    dtype=mlp.fc1.weight.dtype)
        layer.fc1._materialise(mlp.fc1)
        layer.fc2._materialise(mlp.fc2)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelSelfAttention(HoldsGroup):
    """Causal self-attention split by heads: rank r owns n_heads/tp whole heads.

    q, k, v are column-parallel (their output features are the heads, packed head after head,
    so a rank's rows are its heads), attention runs on the local heads with no communication,
    and the output projection is row-parallel.
    Forward: 1 all_reduce (o's g). Backward: 1 all_reduce: q, k and v read the same input, so
    one f covers all three (Megatron fuses them into one qkv matmul for the same reason). That
    shared f is why this block has a forward of its own: the dense block's, with its layers
    swapped for column-parallel ones, would all-reduce three input gradients.
    """

    def __init__(self, d_model: int, n_heads: int, group: dist.ProcessGroup, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        tp = tp_size(group)
        if d_model % n_heads:
            raise ValueError(_("d_model={d_model} is not divisible by n_heads={n_heads}").format(
                d_model=d_model, n_heads=n_heads))
        if n_heads % tp:
            raise ValueError(_("n_heads={n_heads} does not split over tp={tp} ranks: each rank "
                               "must own whole heads, so n_heads must be a multiple of "
                               "{tp}").format(n_heads=n_heads, tp=tp))
        self.group = group
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.local_heads = n_heads // tp
        factory = {"device": device, "dtype": dtype}
        self.q, self.k, self.v = (ColumnParallelLinear(d_model, d_model, group, copy_input=False,
                                                       **factory) for _ in "qkv")
        self.o = RowParallelLinear(d_model, d_model, group, **factory)

    @classmethod
    def from_dense(cls, attn: models.CausalSelfAttention,
                   group: dist.ProcessGroup) -> ParallelSelfAttention:
        """This rank's heads of a dpmp_lab.models.CausalSelfAttention."""
        check_type(attn, models.CausalSelfAttention, cls)
        layer = cls(attn.q.in_features, attn.n_heads, group, device="meta",
                    dtype=attn.q.weight.dtype)
        for name in ("q", "k", "v", "o"):
            getattr(layer, name)._materialise(getattr(attn, name))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features(tensor_arg(x, "x"), self.q.in_features, "ParallelSelfAttention")
        x = copy_to_tp_region(x, self.group)                    # the one f of q, k and v
        return self.o(models.attend(self.q(x), self.k(x), self.v(x), self.head_dim))


# -- a whole model ---------------------------------------------------------------------------------


def parallelize_gpt(model: models.TinyGPT, group: dist.ProcessGroup,
                    vocab_parallel: bool = True) -> nn.Module:
    """Make `model` tensor parallel over `group`, in place, keeping this rank's shards.

    Each block's MLP keeps its own forward, its fc1 and fc2 swapped for their column- and
    row-parallel shards; its attention becomes a ParallelSelfAttention, whose q, k and v share
    one f. With vocab_parallel, the token embedding becomes a VocabParallelEmbedding and the
    head's projection a ColumnParallelLinear without gather, so the model returns (B, T, V/tp)
    logit shards: use vocab_parallel_cross_entropy. Without it, embedding and head stay
    replicated and the model returns full logits (models.lm_loss). Layer norms and the position
    embedding stay replicated. Communication per step, vocab_parallel: forward 2 * n_layers + 1
    all_reduce (+ 3 in the loss), backward 2 * n_layers + 1.
    """
    if not isinstance(model, models.TinyGPT):
        raise TypeError(_("parallelize_gpt needs a dpmp_lab.models.TinyGPT, not "
                          "{kind}").format(kind=type(model).__name__))
    # build every replacement before swapping any, so bad sizes leave the model untouched
    blocks = [(ParallelSelfAttention.from_dense(b.attn, group),
               ColumnParallelLinear.from_dense(b.mlp.fc1, group),
               RowParallelLinear.from_dense(b.mlp.fc2, group)) for b in model.blocks]
    if vocab_parallel:
        tok = VocabParallelEmbedding.from_dense(model.embed.tok, group)
        proj = ColumnParallelLinear.from_dense(model.head.proj, group, gather_output=False)
    for block, (attn, fc1, fc2) in zip(model.blocks, blocks, strict=True):
        block.attn, block.mlp.fc1, block.mlp.fc2 = attn, fc1, fc2
    if vocab_parallel:
        model.embed.tok, model.head.proj = tok, proj
    return model


def sharding(model: nn.Module) -> dict[str, int | None]:
    """{parameter name: the dim it is split along over the tp group, or None if replicated}.

    With shard_tensor(): `shard_tensor(dense_param, group, dim)` is what this rank holds of a dense model.
    """
    dims: dict[str, int | None] = {}
    for prefix, module in model.named_modules():
        split = getattr(module, "split_dims", {}) if isinstance(module, Sharded) else {}
        for name, _param in module.named_parameters(recurse=False):
            dims[f"{prefix}.{name}" if prefix else name] = split.get(name)
    return dims


# -- an older name ---------------------------------------------------------------------------------


def tp_lm_loss(logits_shard: torch.Tensor, targets: torch.Tensor,
               group: dist.ProcessGroup) -> torch.Tensor:
    """Deprecated: vocab_parallel_cross_entropy under the name it had before, kept so that a
    notebook written with it still runs, and says which name to use."""
    warnings.warn("dl.tp.tp_lm_loss is dl.tp.vocab_parallel_cross_entropy under an older name "
                  "and will be removed: call vocab_parallel_cross_entropy(logits_shard, targets, "
                  "group)", FutureWarning, stacklevel=2)
    return vocab_parallel_cross_entropy(logits_shard, targets, group)
