"""Broken variants of 07_sharding: classic mistakes of ZeRO-2, FSDP units, fp16 reduction and
activation checkpointing that the grader must catch.

Each variant is the solution cell with one mistake written in, as an exact edit of the solution
notebook's own source (see tests/course_variants/__init__.py). `loses` lists exactly the graded
cells that must score zero; `visible` + `visible_says`: the learner's visible test already fails
with the grader's hint. Every exercise is graded on its own (the FSDP unit does its own
reduce-scatter; nothing later calls an earlier exercise), so each mistake costs its own cell.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("07_sharding")

_RS = ["reduce_scatter_mean_tests"]
_UNIT = ["sharded_linear_tests"]
_FP16 = ["reduce_scatter_fp16_tests"]
_CKPT = ["checkpoint_tests"]


def _seen(variant: dict) -> dict:
    return {**variant, "visible": variant.get("visible", variant["loses"])}


VARIANTS = [
    # -- 1 ZeRO-2's reduce-scatter ----------------------------------------------------------------
    _seen({"name": "sum over the ranks not divided by their number",
           "replace": _edit("reduce_scatter_mean", ("return out / world", "return out")),
           "loses": _RS, "visible_says": ["divided by the number of ranks"]}),
    _seen({"name": "an all-reduce and a slice where a reduce-scatter belongs",
           "replace": _edit("reduce_scatter_mean", (
               "    out = torch.empty(size, dtype=flat.dtype, device=flat.device)\n"
               "    dist.reduce_scatter_single(out, padded, op=dist.ReduceOp.SUM)\n"
               "    return out / world",
               "    dist.all_reduce(padded, op=dist.ReduceOp.SUM)\n"
               "    rank = dist.get_rank()\n"
               "    return padded[rank * size:(rank + 1) * size] / world")),
           "loses": _RS, "visible_says": ["an all-reduce where a reduce-scatter belongs"]}),
    _seen({"name": "every rank keeps the first shard",
           "replace": _edit("reduce_scatter_mean", (
               "    out = torch.empty(size, dtype=flat.dtype, device=flat.device)\n"
               "    dist.reduce_scatter_single(out, padded, op=dist.ReduceOp.SUM)\n"
               "    return out / world",
               "    dist.all_reduce(padded, op=dist.ReduceOp.SUM)\n"
               "    return padded[:size] / world")),
           "loses": _RS, "visible_says": ["rank r keeps shard r"]}),
    {"name": "right: the list form of reduce_scatter",
     "replace": _edit("reduce_scatter_mean", (
         "    dist.reduce_scatter_single(out, padded, op=dist.ReduceOp.SUM)\n",
         "    dist.reduce_scatter(out, list(padded.chunk(world)), op=dist.ReduceOp.SUM)\n")),
     "loses": []},
    # -- 2 the FSDP unit --------------------------------------------------------------------------
    _seen({"name": "forgetting to free: the gathered weight saved for backward",
           "replace": _edit("sharded_linear", (
               "ctx.save_for_backward(x, shard)          # not `full`: it is freed when we return",
               "ctx.save_for_backward(x, shard, full)"), (
               "        x, shard = ctx.saved_tensors\n", "        x, shard, full = ctx.saved_tensors\n"), (
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, "
               "device=shard.device)\n"
               "        dist.all_gather_single(full, shard.detach())      # gathered again\n", "")),
           "loses": _UNIT, "visible_says": ["forward must free the gathered weight"]}),
    _seen({"name": "an all-reduce of the weight gradient where a reduce-scatter belongs",
           "replace": _edit("sharded_linear", (
               "        grad_shard = torch.empty_like(shard)\n"
               "        dist.reduce_scatter_single(grad_shard, flat, op=dist.ReduceOp.SUM)\n",
               "        dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n"
               "        size = shard.numel()\n"
               "        grad_shard = flat[dist.get_rank() * size:(dist.get_rank() + 1) * size]\n")),
           "loses": _UNIT, "visible_says": ["an all-reduce where a reduce-scatter belongs"]}),
    _seen({"name": "the reduce-scattered gradient not divided by N",
           "replace": _edit("sharded_linear", ("return grad_x, grad_shard / world, None, None",
                                                "return grad_x, grad_shard, None, None")),
           "loses": _UNIT, "visible_says": ["divided by 2"]}),
    _seen({"name": "weight gradient transposed: x.T @ grad_out",
           "replace": _edit("sharded_linear", ("grad_w = grad_out.T @ x", "grad_w = x.T @ grad_out")),
           "loses": _UNIT, "visible_says": ["grad_w = grad_out.T @ x"]}),
    {"name": "right: the list form of all_gather in forward",
     "replace": _edit("sharded_linear", (
         "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)\n"
         "        dist.all_gather_single(full, shard.detach())\n",
         "        parts = [torch.empty_like(shard) for _ in range(world)]\n"
         "        dist.all_gather(parts, shard.detach())\n"
         "        full = torch.cat(parts)\n")),
     "loses": []},
    # -- 3 fp16 reduction ------------------------------------------------------------------------
    _seen({"name": "reducing before dividing in fp16",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    dist.reduce_scatter_single(out, grad16, op=dist.ReduceOp.SUM)\n"
               "    return out.float() / world")),
           "loses": _FP16, "visible_says": ["reducing before dividing in fp16"]}),
    _seen({"name": "the shard returned in fp16, not for the fp32 master weights",
           "replace": _edit("reduce_scatter_fp16", ("    return out.float()", "    return out")),
           "loses": _FP16, "visible_says": ["as float32"]}),
    _seen({"name": "reduced in fp32: right numbers, twice the bytes",
           "replace": _edit("reduce_scatter_fp16", (
               "dtype=torch.float16, device=grad16.device)", "dtype=torch.float32, "
               "device=grad16.device)"), (
               "dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)",
               "dist.reduce_scatter_single(out, grad16.float() / world, op=dist.ReduceOp.SUM)")),
           "loses": _FP16, "visible_says": ["reduce in fp16"]}),
    # -- 4 activation checkpointing ----------------------------------------------------------------
    _seen({"name": "the block's output saved as well: nothing is saved by checkpointing",
           "replace": _edit("checkpoint", (
               "        ctx.save_for_backward(x)\n"
               "        return block(x)          # grad mode is off inside forward: nothing recorded",
               "        y = block(x)\n        ctx.save_for_backward(x, y)\n        return y"), (
               "        (x,) = ctx.saved_tensors\n", "        x, _ = ctx.saved_tensors\n")),
           "loses": _CKPT, "visible_says": ["keeps only its input"]}),
    _seen({"name": "backward recomputes without recording, so nothing can be backpropagated",
           "replace": _edit("checkpoint", (
               "        with torch.enable_grad():\n            y = ctx.block(x)\n",
               "        y = ctx.block(x)\n")),
           "loses": _CKPT}),
    _seen({"name": "only x's gradient computed: the block's parameters get none",
           "replace": _edit("checkpoint", (
               "        torch.autograd.backward(y, grad_y)\n        return None, x.grad",
               "        (grad_x,) = torch.autograd.grad(y, (x,), grad_y)\n"
               "        return None, grad_x")),
           "loses": _CKPT, "visible_says": ["got no gradient"]}),
    {"name": "right: a fresh leaf by clone, and y.backward",
     "replace": _edit("checkpoint", (
         "x = x.detach().requires_grad_(True)", "x = x.clone().requires_grad_(True)"), (
         "torch.autograd.backward(y, grad_y)", "y.backward(grad_y)")),
     "loses": []},
    # -- predictions and recall (their visible tests check the format only) ------------------------
    {"name": "prediction: only the shards, as dl.cost.memory(zero=3) counts",
     "replace": {"predict_peak": "peak_param_bytes = 3728"}, "loses": ["predict_peak_tests"]},
    {"name": "prediction: the whole model gathered at once",
     "replace": {"predict_peak": "peak_param_bytes = 3728 + 7456"},
     "loses": ["predict_peak_tests"]},
    {"name": "prediction: fully_shard's forward gathers not seen (no_grad)",
     "replace": {"predict_fully_shard": "fully_shard_calls = (0, 3, 3)"},
     "loses": ["predict_fully_shard_tests"]},
    {"name": "prediction: no gather in backward",
     "replace": {"predict_fully_shard": "fully_shard_calls = (3, 0, 3)"},
     "loses": ["predict_fully_shard_tests"]},
    {"name": "recall 1: ZeRO-2 sends half",
     "replace": {"recall_zero2": 'answer_1 = "b"'}, "loses": ["recall_zero2_tests"]},
    {"name": "recall 2: FSDP costs what data parallel costs",
     "replace": {"recall_fsdp_traffic": 'answer_2 = "b"'}, "loses": ["recall_fsdp_traffic_tests"]},
    {"name": "recall 3: bf16 overflows",
     "replace": {"recall_master": 'answer_3 = "b"'}, "loses": ["recall_master_tests"]},
    {"name": "recall 4: checkpointing doubles the compute",
     "replace": {"recall_checkpoint": "checkpoint_factor = 2"},
     "loses": ["recall_checkpoint_tests"]},
    {"name": "right: 4/3 written as 1.33",
     "replace": {"recall_checkpoint": "checkpoint_factor = 1.33"}, "loses": []},
]
