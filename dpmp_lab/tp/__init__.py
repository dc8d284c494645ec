"""Tensor parallelism as Megatron-LM does it: split every big matmul over the ranks of a tp group.

    group = dl.ProcessGrid(tp=4).tp_group                  # inside a rank
    mlp = tp.ParallelMLP.from_dense(dense_mlp, group)      # this rank's quarter of the weights
    model = tp.parallelize_gpt(dl.models.TinyGPT(), group)
    loss = tp.vocab_parallel_cross_entropy(model(idx), targets, group)

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

The modules, in reading order (the first three named as in Megatron-LM's tensor_parallel):
tp.mappings (the tp group, shard_tensor() and the region ops: all the communication), tp.layers
(the sharded linear and embedding layers), tp.cross_entropy (the loss over vocab-sharded
logits) and tp.gpt (Megatron's MLP and attention blocks, and parallelize_gpt for TinyGPT).
"""

from dpmp_lab.tp.cross_entropy import vocab_parallel_cross_entropy
from dpmp_lab.tp.gpt import (
    ParallelMLP,
    ParallelSelfAttention,
    parallelize_gpt,
    sharding,
    tp_lm_loss,
)
from dpmp_lab.tp.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from dpmp_lab.tp.mappings import (
    copy_to_tp_region,
    gather_from_sequence_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_region,
    scatter_to_tp_region,
    shard_tensor,
)

__all__ = ["ColumnParallelLinear", "ParallelMLP", "ParallelSelfAttention", "RowParallelLinear",
           "VocabParallelEmbedding", "copy_to_tp_region", "gather_from_sequence_region",
           "gather_from_tp_region", "parallelize_gpt", "reduce_from_tp_region",
           "reduce_scatter_to_sequence_region", "scatter_to_tp_region", "shard_tensor", "sharding",
           "tp_lm_loss", "vocab_parallel_cross_entropy"]
