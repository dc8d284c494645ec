"""Cross entropy over vocab-sharded logits, without ever gathering the (N, V) logits.

    loss = tp.vocab_parallel_cross_entropy(logits_shard, targets, group)   # = F.cross_entropy

What a ColumnParallelLinear head without gather_output leaves on each rank is a (..., V/tp)
slice of the logits; gathering them would move the largest activation of the model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dpmp_lab._torch_helpers import tensor_arg
from dpmp_lab.i18n.messages import _
from dpmp_lab.tp.mappings import check_ids, tp_all_reduce, tp_size

__all__ = ["vocab_parallel_cross_entropy"]


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
        global_max = tp_all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - global_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = tp_all_reduce(exp.sum(dim=-1), group)
        local = targets - start
        mine = (local >= 0) & (local < per_rank)
        local = local.masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0)
        target_logit = tp_all_reduce(target_logit, group)
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
    logits_shard = tensor_arg(logits_shard, "logits_shard")
    targets = tensor_arg(targets, "targets")
    if logits_shard.dim() < 1 or logits_shard.shape[:-1] != targets.shape:
        raise ValueError(_("logits_shard (..., V/tp) and targets (...) must agree on the "
                           "leading dims, got {logits} and {targets}").format(
            logits=tuple(logits_shard.shape), targets=tuple(targets.shape)))
    tp = tp_size(group)
    check_ids(targets, logits_shard.shape[-1] * tp, "targets")
    logits = logits_shard.reshape(-1, logits_shard.shape[-1])
    targets = targets.reshape(-1)
    if tp == 1:
        return F.cross_entropy(logits, targets)
    return _VocabParallelCrossEntropy.apply(logits, targets, group)
