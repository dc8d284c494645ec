"""Data parallelism: every rank holds the whole model, trains on its own slice of the batch, and
the ranks average their gradients so that every replica takes the same step.

    model = DataParallel(TinyMLP(), bucket_mb=1.0, overlap=True)
    loss_fn(model(x_shard), y_shard).backward()   # buckets are all-reduced while backward runs
    model.finish_gradient_sync()                  # wait, divide by the group size, write p.grad
    opt.step()

Why averaging is enough: the loss of the full batch is the mean of the per-rank mean losses
(when every rank has as many samples), so its gradient is the mean of the per-rank gradients.
The mean is an all-reduce with SUM followed by a division by the group size: the portable
form, since older torch refuses ReduceOp.AVG on gloo (torch 2.13 averages correctly there:
its silent bug, pytorch/pytorch#162338, was fixed in December 2025).

Two ways to hold the replicas, each in its module: dp.data_parallel's DataParallel (what
torch's DistributedDataParallel does: bucketed all-reduces overlapping backward) and
dp.zero's ZeRO1Optimizer and ZeRO2Optimizer (ZeRO stages 1 and 2: the optimizer state, and
then the gradients too, split over the ranks; ShardedOptimizer(stage=...) makes either). Both
start from dp.replicas: the group to average over and identical replicas.
"""

from dpmp_lab.dp.data_parallel import DataParallel, GradientsNotAveraged
from dpmp_lab.dp.zero import ShardedOptimizer, ZeRO1Optimizer, ZeRO2Optimizer

__all__ = ["DataParallel", "GradientsNotAveraged", "ShardedOptimizer", "ZeRO1Optimizer",
           "ZeRO2Optimizer"]
