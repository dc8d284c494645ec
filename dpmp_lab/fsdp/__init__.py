"""Fully sharded data parallelism (ZeRO stage 3, FSDP): each rank stores 1/N of every weight.

    model = FullyShardedDataParallel(TinyGPT(cfg), compute_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # this rank's fp32 shards
    loss_fn(model(x_shard), y_shard).backward()
    model.finish_gradient_sync()                            # replicated params' all-reduce
    opt.step()

The mechanism is fully_sharded.py, to read top to bottom (the unit, _GatherShards, the
hooks); bookkeeping.py serves it (which parameters make which unit, tied and frozen ones,
prefetch's order, the memory reports, argument checks).

A unit is a sub-module whose parameters are flattened into one vector, padded to a multiple of
the group size N and cut into N shards; rank r keeps shard r (the master copy, an
nn.Parameter of this wrapper, so any torch optimizer steps on shards and keeps state for 1/N).
Around each use of a unit:
- before its forward: all-gather the shards into the full flat parameter (in compute_dtype),
  and point the module's weights at views of it;
- after its forward: free the full parameter (its storage shrinks to nothing) unless
  reshard_after_forward=False;
- before its backward (a hook on its outputs' gradients): all-gather it again if it was freed;
- after its backward: reduce-scatter the full gradient (SUM, then / N) so each rank adds the
  averaged gradient of its shard only, and free the full parameter again.
The all-gather and the reduce-scatter are one autograd function, _GatherShards: the backward of
an all-gather is a reduce-scatter, the whole of ZeRO-3 in one line.

Mixed precision (compute_dtype=torch.bfloat16 or float16): the shards stay in the master dtype
(fp32) and so does the optimizer state; the all-gather sends the shard cast to compute_dtype,
so forward and backward compute in it. Gradients are reduced in reduce_dtype: by default the
master dtype (cast up first, then SUM and / N); reduce_dtype=compute_dtype halves the
traffic, and then each rank divides by N *before* the SUM, because a SUM of N fp16 gradients
can overflow where their mean does not (dividing first trades that for underflow of small
gradients; torch's FSDP1 splits the division into pre- and post-divide factors of about sqrt N,
and fp16 training needs loss scaling besides). These are FSDP2's
MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype).

Parameters outside every unit (by default those of modules without a weight matrix, such as
norms) stay whole on every rank in their own dtype; finish_gradient_sync() all-reduces their
gradients (SUM, then / N). Frozen parameters (requires_grad=False) stay whole too: they need no
gradient and no optimizer state; under compute_dtype they are cast to it once. A parameter tied
between modules (an embedding and an output head) lives in the first unit holding it; the
other module gathers that unit too, so a tied unit is gathered in forward and reduce-scattered
once per use (in backward it is gathered again only if a reduce-scatter freed it meanwhile).

prefetch=True issues the next unit's all-gather (async) as soon as the current one is done, in
forward order in forward and reversed in backward (the order of the first forward), so it
travels while the current unit computes. It changes when calls are issued, not how many.
"""

from dpmp_lab.fsdp.fully_sharded import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]
