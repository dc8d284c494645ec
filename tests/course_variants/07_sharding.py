"""Broken variants of 07_sharding: classic mistakes of ZeRO-2's gradient hooks, FSDP units, fp16
reduction and activation checkpointing that the grader must catch.

Each variant is the solution cell with one mistake written in, as an exact edit of the solution
notebook's own source (see tests/course_variants/__init__.py). `loses` lists exactly the graded
cells that must score zero; `visible` + `visible_says`: the learner's visible test already fails
with the grader's hint. Every exercise is graded on its own (the FSDP unit does its own
reduce-scatter; nothing later calls an earlier exercise), so each mistake costs its own cell.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("07_sharding")

_Z2 = ["zero2_hooks_tests"]
_UNIT = ["sharded_linear_tests"]
_FP16 = ["reduce_scatter_fp16_tests"]
_CKPT = ["checkpoint_tests"]


def _seen(variant: dict) -> dict:
    return {**variant, "visible": variant.get("visible", variant["loses"])}


# a good-faith learner's wrong versions (third pass), written into the solution
CKPT_INPUT_ON_THE_CLASS = _edit("checkpoint", (
    "        ctx.save_for_backward(x)\n", "        CheckpointFunction.saved_input = x.detach()\n"), (
    "        (x,) = ctx.saved_tensors\n", "        x = CheckpointFunction.saved_input\n"))
CKPT_RNG_ON_THE_CLASS = _edit("checkpoint", (
    "        ctx.rng = torch.get_rng_state()\n",
    "        CheckpointFunction.rng = torch.get_rng_state()\n"), (
    "torch.set_rng_state(ctx.rng)", "torch.set_rng_state(CheckpointFunction.rng)"))
# the fourth pass's: per block rather than per call, right until one block is applied twice
CKPT_RNG_ON_THE_BLOCK = _edit("checkpoint", (
    "        ctx.rng = torch.get_rng_state()\n", "        block.saved_rng = torch.get_rng_state()\n"), (
    "torch.set_rng_state(ctx.rng)", "torch.set_rng_state(ctx.block.saved_rng)"))
# the fifth pass's: the input and the random state on a stack every call shares
CKPT_ON_A_MODULE_STACK = _edit("checkpoint", (
    "class CheckpointFunction(", "_SAVED = []\n\n\nclass CheckpointFunction("), (
    "        ctx.rng = torch.get_rng_state()\n        ctx.save_for_backward(x)\n",
    "        _SAVED.append((x, torch.get_rng_state()))\n"), (
    "        (x,) = ctx.saved_tensors\n", "        x, rng = _SAVED.pop()\n"), (
    "torch.set_rng_state(ctx.rng)", "torch.set_rng_state(rng)"))
# the sixth pass's: right on TinyMLP, whose units differ in shape and whose gradients take one
# path; wrong where two units have the same shape, or a residual path shares a unit's gradient
FSDP_SHARD_FOUND_BY_SHAPE = _edit("sharded_linear", (
    "class ShardedLinearFunction(", "_SHARDS = {}\n\n\nclass ShardedLinearFunction("), (
    "        ctx.save_for_backward(x, shard)          # not `full`: it is freed when we return\n",
    "        _SHARDS[(out_features, in_features)] = shard\n"
    "        ctx.save_for_backward(x)\n"), (
    "        x, shard = ctx.saved_tensors\n",
    "        (x,) = ctx.saved_tensors\n"
    "        shard = _SHARDS[(ctx.sizes)]\n"))
FSDP_GRAD_OUT_DIVIDED_IN_PLACE = _edit("sharded_linear", (
    "        grad_x = grad_out @ w\n",
    "        grad_x = grad_out @ w\n"
    "        grad_out.div_(world)             # divided before the SUM: one buffer fewer\n"), (
    "return grad_x, grad_shard / world, None, None", "return grad_x, grad_shard, None, None"))
FSDP_WHOLE_GRADIENTS_CACHED = _edit("sharded_linear", (
    "class ShardedLinearFunction(", "_GRAD_BUFFERS = {}\n\n\nclass ShardedLinearFunction("), (
    "        flat = pack_weight_bias(grad_w, grad_b, full)\n",
    "        flat = pack_weight_bias(grad_w, grad_b, full)\n"
    "        _GRAD_BUFFERS[(out_features, in_features)] = flat\n"))
FSDP_SHARD_GRAD_A_VIEW = _edit("sharded_linear", (
    "        grad_shard = torch.empty_like(shard)\n",
    "        flat /= world\n"
    "        grad_shard = torch.empty_like(flat).view(world, -1)[dist.get_rank()]\n"), (
    "return grad_x, grad_shard / world, None, None", "return grad_x, grad_shard, None, None"))


# the sixth pass's: every whole gradient held back and reduce-scattered from the last hook, still
# in backward (right calls, phase and memory after backward; ZeRO-1's memory during it)
ZERO2_REDUCED_FROM_THE_LAST_HOOK = {"zero2_hooks": '''
def zero2_hooks(model: nn.Module) -> dict[str, torch.Tensor]:
    shards: dict[str, torch.Tensor] = {}
    world = dist.get_world_size()
    pending = []
    n_params = len(list(model.parameters()))

    def make_hook(name):
        def hook(p):
            pending.append((name, p.grad.reshape(-1)))
            p.grad = None
            if len(pending) == n_params:
                for nm, g in pending:
                    c = -(-g.numel() // world)
                    padded = F.pad(g, (0, c * world - g.numel()))
                    chunk = torch.empty(c, dtype=g.dtype, device=g.device)
                    dist.reduce_scatter_tensor(chunk, padded)
                    shards[nm] = chunk / world
                pending.clear()
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(make_hook(name))
    return shards
'''}


# a good-faith learner's wrong versions (fourth pass): buffers made when the hooks are
# registered (before backward), numbers through the default dtype, a collective per chunk
ZERO2_FULL_BUFFERS_AT_REGISTRATION = {"zero2_hooks": '''
def zero2_hooks(model: nn.Module) -> dict[str, torch.Tensor]:
    """ZeRO-2's gradient path: from a hook on every parameter, keep this rank's chunk of the
    averaged gradient and drop the full one, while backward runs. Returns {name: chunk},
    filled by the hooks during backward."""
    shards: dict[str, torch.Tensor] = {}
    world = dist.get_world_size()
    buffers = {}
    for name, p in model.named_parameters():
        c = -(-p.numel() // world)
        buffers[name] = torch.zeros(c * world, dtype=p.dtype, device=p.device)

    def make_hook(name):
        def hook(p):
            buf = buffers[name]
            buf[:p.numel()].copy_(p.grad.reshape(-1))
            p.grad = None
            chunk = torch.empty(buf.numel() // world, dtype=buf.dtype, device=buf.device)
            dist.reduce_scatter_tensor(chunk, buf)
            shards[name] = chunk.div_(world)
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(make_hook(name))
    return shards
'''}

ZERO2_CHUNK_A_VIEW_OF_A_REGISTERED_BUFFER = {"zero2_hooks": '''
def zero2_hooks(model: nn.Module) -> dict[str, torch.Tensor]:
    """ZeRO-2's gradient path: from a hook on every parameter, keep this rank's chunk of the
    averaged gradient and drop the full one, while backward runs. Returns {name: chunk},
    filled by the hooks during backward."""
    shards: dict[str, torch.Tensor] = {}
    world, rank = dist.get_world_size(), dist.get_rank()
    buffers = {}
    for name, p in model.named_parameters():
        c = -(-p.numel() // world)
        buffers[name] = torch.zeros(c * world, dtype=p.dtype, device=p.device)

    def make_hook(name):
        def hook(p):
            buf = buffers[name]
            c = buf.numel() // world
            buf[:p.numel()].copy_(p.grad.reshape(-1)).div_(world)
            p.grad = None
            out = torch.empty(c, dtype=buf.dtype, device=buf.device)
            dist.reduce_scatter_tensor(out, buf)
            buf[rank * c:(rank + 1) * c].copy_(out)
            shards[name] = buf[rank * c:(rank + 1) * c]
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(make_hook(name))
    return shards
'''}

ZERO2_THROUGH_FLOAT32 = {"zero2_hooks": '''
def zero2_hooks(model: nn.Module) -> dict[str, torch.Tensor]:
    """ZeRO-2's gradient path: from a hook on every parameter, keep this rank's chunk of the
    averaged gradient and drop the full one, while backward runs. Returns {name: chunk},
    filled by the hooks during backward."""
    shards: dict[str, torch.Tensor] = {}
    world = dist.get_world_size()

    def make_hook(name):
        def hook(p):
            g = p.grad.reshape(-1)
            c = -(-g.numel() // world)
            padded = torch.zeros(c * world, device=g.device)
            padded[:g.numel()] = g
            chunk = torch.empty(c, device=g.device)
            dist.reduce_scatter_tensor(chunk, padded)
            shards[name] = (chunk / world).to(g.dtype)
            p.grad = None
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(make_hook(name))
    return shards
'''}

ZERO2_A_REDUCE_PER_RANK = {"zero2_hooks": '''
def zero2_hooks(model: nn.Module) -> dict[str, torch.Tensor]:
    """ZeRO-2's gradient path: from a hook on every parameter, keep this rank's chunk of the
    averaged gradient and drop the full one, while backward runs. Returns {name: chunk},
    filled by the hooks during backward."""
    shards: dict[str, torch.Tensor] = {}
    world, rank = dist.get_world_size(), dist.get_rank()

    def make_hook(name):
        def hook(p):
            g = p.grad.reshape(-1)
            c = -(-g.numel() // world)
            padded = F.pad(g, (0, c * world - g.numel()))
            p.grad = None
            for j, piece in enumerate(padded.chunk(world)):
                piece = piece.clone()
                dist.reduce(piece, dst=j)
                if j == rank:
                    shards[name] = piece / world
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(make_hook(name))
    return shards
'''}


FP16_FACTOR_BY_RANK = {"reduce_scatter_fp16": '''
def reduce_scatter_mean_fp16(grad16: torch.Tensor) -> torch.Tensor:
    """This rank's shard of the average of `grad16` (fp16, length divisible by N) over the
    ranks, for fp32 master weights: reduced in fp16 (half the bytes of fp32), finite wherever
    the average is."""
    world = dist.get_world_size()
    shard = torch.empty(grad16.numel() // world, dtype=torch.float16, device=grad16.device)
    risky = grad16.abs().max().item() * world > 65504
    dist.reduce_scatter_tensor(shard, grad16 / world if risky else grad16)
    return shard.float() if risky else shard.float() / world
'''}


# a module-level workspace made once, filled by every forward (fourth pass)
FSDP_WORKSPACE_NOT_GATHERED_AGAIN = {"sharded_linear": '''
_WORKSPACE = torch.empty(1 << 15, dtype=torch.float64)   # one preallocated buffer, reused every step
_SLOT = {}                                                # shard -> (offset, length) in it


def _slot(shard, world):
    if id(shard) not in _SLOT:
        start = sum(n for _, n in _SLOT.values())
        _SLOT[id(shard)] = (start, world * shard.numel())
    off, n = _SLOT[id(shard)]
    return _WORKSPACE[off:off + n]


class ShardedLinearFunction(torch.autograd.Function):
    """One FSDP unit: the whole weight exists only while forward or backward computes with
    it; the shard's gradient is this rank's part of the averaged weight gradient."""

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        world = dist.get_world_size()
        full = _slot(shard, world)
        dist.all_gather_into_tensor(full, shard)
        w, b = split_weight_bias(full, out_features, in_features)
        y = F.linear(x, w, b)
        ctx.save_for_backward(x, shard)
        ctx.sizes = (out_features, in_features)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.sizes
        world = dist.get_world_size()
        full = _slot(shard, world)
        w, _ = split_weight_bias(full, out_features, in_features)
        grad_x = grad_out @ w
        g2 = grad_out.reshape(-1, out_features)
        flat = pack_weight_bias(g2.t() @ x.reshape(-1, in_features), g2.sum(0), full)
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, flat)
        grad_shard /= world
        return grad_x, grad_shard, None, None
'''}

# the same workspace, gathered again in backward: every layer keeps its slot filled between steps
FSDP_WORKSPACE_SLOT_PER_LAYER = {"sharded_linear": FSDP_WORKSPACE_NOT_GATHERED_AGAIN[
    "sharded_linear"].replace(
        "        full = _slot(shard, world)\n        w, _ = split_weight_bias(",
        "        full = _slot(shard, world)\n        dist.all_gather_into_tensor(full, shard)\n"
        "        w, _ = split_weight_bias(")}


# the seventh pass's (a good-faith learner on the release): what passed every visible check
ZERO2_PADDING_UNFILLED = _edit("zero2_hooks", (
    "            padded = F.pad(p.grad.reshape(-1), (0, size * world - p.numel()))\n",
    "            padded = torch.empty(size * world, dtype=p.grad.dtype, device=p.grad.device)\n"
    "            padded[:p.numel()] = p.grad.reshape(-1)\n"))

FSDP_PADDING_UNFILLED = _edit("sharded_linear", (
    "        flat = pack_weight_bias(grad_w, grad_b, full)\n",
    "        flat = torch.empty_like(full)\n"
    "        n = grad_w.numel() + grad_b.numel()\n"
    "        flat[:n] = torch.cat([grad_w.reshape(-1), grad_b])\n"))

FSDP_INPUT_DIVIDED_IN_PLACE = _edit("sharded_linear", (
    "        rows_in = x.reshape(-1, in_features)\n",
    "        x.div_(world)                                     # the average, once, here\n"
    "        rows_in = x.reshape(-1, in_features)\n"), (
    "        grad_b = rows_out.sum(0)\n", "        grad_b = rows_out.sum(0) / world\n"), (
    "        return grad_x, grad_shard / world, None, None\n",
    "        return grad_x, grad_shard, None, None\n"))

FP16_ONE_RESULT_BUFFER = _edit("reduce_scatter_fp16", (
    "def reduce_scatter_mean_fp16(",
    "_RESULTS = {}   # one fp32 result buffer per size, made once\n\n\n"
    "def reduce_scatter_mean_fp16("), (
    "    return out.float()\n",
    "    if out.numel() not in _RESULTS:\n"
    "        _RESULTS[out.numel()] = torch.empty(out.numel(), device=out.device)\n"
    "    return _RESULTS[out.numel()].copy_(out)\n"))

ZERO2_DIVIDED_ON_THE_WIRE = _edit("zero2_hooks", (
    "            dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.SUM)\n"
    "            shards[name] = mine / world\n",
    "            work = dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.SUM,\n"
    "                                              async_op=True)\n"
    "            mine /= world                     # while the sum is still on its way\n"
    "            work.wait()\n"
    "            shards[name] = mine\n"))

FSDP_WEIGHT_READ_BEFORE_ITS_WAIT = _edit("sharded_linear", (
    "        dist.all_gather_single(full, shard.detach())\n        w, b = split_weight_bias",
    "        work = dist.all_gather_single(full, shard.detach(), async_op=True)\n"
    "        w, b = split_weight_bias"), (
    "        return F.linear(x, w, b)\n",
    "        out = F.linear(x, w, b)\n        work.wait()\n        return out\n"))

# the seventh pass's two checkpoints share the learner's forward and the backward's RNG replay
_LEARNER_CKPT_HEAD = '''class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, block, x):
        ctx.block = block
        ctx.rng = torch.get_rng_state()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return block(x)

    @staticmethod
    def backward(ctx, grad_y):
        x, = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)
'''

CKPT_RECOMPUTED_KEPT_AFTER_BACKWARD = {"checkpoint": _LEARNER_CKPT_HEAD + '''            xd = x.detach().requires_grad_(True)
            with torch.enable_grad():
                y = ctx.block(xd)
        torch.autograd.backward(y, grad_y, retain_graph=True)
        ctx.block.last_recompute = y          # "for debugging"
        return None, xd.grad
'''}

CKPT_GRADS_SET_BY_HAND = {"checkpoint": _LEARNER_CKPT_HEAD + '''            with torch.enable_grad():
                y = ctx.block(x)
        grads = torch.autograd.grad(y, [x, *ctx.block.parameters()], grad_y)
        for p, g in zip(ctx.block.parameters(), grads[1:]):
            p.grad = g if p.grad is None else p.grad + g
        return None, grads[0]
'''}


VARIANTS = [
    # -- 1 ZeRO-2 from gradient hooks ------------------------------------------------------------
    _seen({"name": "the chunk is the SUM over the ranks, not divided by their number",
           "replace": _edit("zero2_hooks", ("shards[name] = mine / world", "shards[name] = mine")),
           "loses": _Z2, "visible_says": ["divided by their number"]}),
    _seen({"name": "an all-reduce and a slice where a reduce-scatter belongs",
           "replace": _edit("zero2_hooks", (
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n"
               "            dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.SUM)\n"
               "            shards[name] = mine / world\n",
               "            dist.all_reduce(padded, op=dist.ReduceOp.SUM)\n"
               "            r = dist.get_rank()\n"
               "            shards[name] = padded[r * size:(r + 1) * size] / world\n")),
           "loses": _Z2, "visible_says": ["sharding.zero2_budget"]}),
    _seen({"name": "the chunk's buffer made without the gradient's dtype (float32 for float64)",
           "replace": _edit("zero2_hooks", (
               "mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)",
               "mine = torch.empty(size, device=p.grad.device)")),
           "loses": _Z2, "visible_says": ["sharding.zero2_dtype"]}),
    _seen({"name": "int() where the chunk size needs ceil: the last numbers are cut off",
           "replace": _edit("zero2_hooks", ("size = -(-p.numel() // world)",
                                            "size = p.numel() // world")),
           "loses": _Z2, "visible_says": ["padded with zeros"]}),
    _seen({"name": "the world size hard-coded to 3, the visible check's first size",
           "replace": _edit("zero2_hooks", ("    world = dist.get_world_size()\n",
                                            "    world = 3\n")),
           "loses": _Z2, "visible_says": ["sharding.zero2_sizes"]}),
    _seen({"name": "chunks of numel // N + 1: one too many where N divides the parameter",
           "replace": _edit("zero2_hooks", ("size = -(-p.numel() // world)",
                                            "size = p.numel() // world + 1")),
           "loses": _Z2, "visible_says": ["on 2 ranks", "sharding.zero2_chunk"]}),
    _seen({"name": "the full gradient kept: p.grad not dropped in the hook",
           "replace": _edit("zero2_hooks", (
               "            p.grad = None                  # the full gradient is gone: only the "
               "chunk stays\n", "")),
           "loses": _Z2, "visible_says": ["still holds the full gradient"]}),
    _seen({"name": "the chunk a view of a full-size buffer, which stays alive",
           "replace": _edit("zero2_hooks", (
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n",
               "            mine = torch.empty_like(padded)[:size]\n"), (
               "shards[name] = mine / world", "shards[name] = mine.div_(world)")),
           "loses": _Z2, "visible_says": ["the base of a view", "sharding.zero2_peak"]}),
    _seen({"name": "each padded full-size gradient kept in a list the hooks share",
           "replace": _edit("zero2_hooks", (
               "    world = dist.get_world_size()\n",
               "    world = dist.get_world_size()\n    buffers = []\n"), (
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n",
               "            buffers.append(padded)          # reused next step\n"
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n")),
           "loses": _Z2, "visible_says": ["wherever a tensor is kept"]}),
    _seen({"name": "the padded gradient kept as an attribute of its parameter",
           "replace": _edit("zero2_hooks", (
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n",
               "            p.padded_grad = padded\n"
               "            mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)\n")),
           "loses": _Z2, "visible_says": ["wherever a tensor is kept"]}),
    _seen({"name": "a full-size padded buffer per parameter made at registration, reused",
           "replace": ZERO2_FULL_BUFFERS_AT_REGISTRATION,
           "loses": _Z2, "visible_says": ["wherever a tensor is kept"]}),
    _seen({"name": "the chunk a view into a buffer made at registration",
           "replace": ZERO2_CHUNK_A_VIEW_OF_A_REGISTERED_BUFFER,
           "loses": _Z2, "visible_says": ["keeps that whole tensor alive"]}),
    _seen({"name": "reduced through a float32 buffer, the chunk cast back to float64",
           "replace": ZERO2_THROUGH_FLOAT32,
           "loses": _Z2, "visible_says": ["sharding.zero2_dtype"]}),
    _seen({"name": "a dist.reduce per chunk: N calls where one collective does it",
           "replace": ZERO2_A_REDUCE_PER_RANK,
           "loses": _Z2, "visible_says": ["N times the calls"]}),
    {"name": "right: the list form of reduce_scatter, divided in place",
     "replace": _edit("zero2_hooks", (
         "            dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.SUM)\n"
         "            shards[name] = mine / world\n",
         "            dist.reduce_scatter(mine, list(padded.chunk(world)), op=dist.ReduceOp.SUM)\n"
         "            shards[name] = mine.div_(world)\n")),
     "loses": []},
    {"name": "right: ReduceOp.AVG (torch 2.13's gloo averages correctly)",
     "replace": _edit("zero2_hooks", (
         "            dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.SUM)\n"
         "            shards[name] = mine / world\n",
         "            dist.reduce_scatter_single(mine, padded, op=dist.ReduceOp.AVG)\n"
         "            shards[name] = mine\n")),
     "loses": []},
    # the fifth pass's: the padding not zero
    _seen({"name": "the padding filled with the gradient's first numbers, not zeros",
           "replace": _edit("zero2_hooks", (
               "            padded = F.pad(p.grad.reshape(-1), (0, size * world - p.numel()))\n",
               "            g = p.grad.reshape(-1)\n"
               "            padded = torch.cat([g, g[:size * world - p.numel()]])\n")),
           "loses": _Z2, "visible_says": ["sharding.zero2_padding"]}),
    _seen({"name": "ZeRO-2: whole gradients held back, all reduce-scattered from the last hook",
           "replace": ZERO2_REDUCED_FROM_THE_LAST_HOOK, "loses": _Z2,
           "visible_says": ["sharding.zero2_peak"]}),
    # -- 2 the FSDP unit --------------------------------------------------------------------------
    _seen({"name": "every whole weight gradient cached in a module dict after its reduce-scatter",
           "replace": FSDP_WHOLE_GRADIENTS_CACHED, "loses": _UNIT,
           "visible_says": ["sharding.fsdp_gradient_kept"]}),
    _seen({"name": "the shard's gradient a view into a whole-size buffer",
           "replace": FSDP_SHARD_GRAD_A_VIEW, "loses": _UNIT,
           "visible_says": ["sharding.fsdp_gradient_kept"]}),
    _seen({"name": "FSDP unit with the world size hard-coded to 3 (the first visible size)",
           "replace": _edit("sharded_linear", (
               "        world = dist.get_world_size()\n"
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)\n"
               "        dist.all_gather_single(full, shard.detach())\n"
               "        w, b = split_weight_bias(full, out_features, in_features)\n"
               "        ctx.save_for_backward(x, shard)",
               "        world = 3\n"
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)\n"
               "        dist.all_gather_single(full, shard.detach())\n"
               "        w, b = split_weight_bias(full, out_features, in_features)\n"
               "        ctx.save_for_backward(x, shard)")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_sizes"]}),
    _seen({"name": "forgetting to free: the gathered weight saved for backward",
           "replace": _edit("sharded_linear", (
               "ctx.save_for_backward(x, shard)          # not `full`: it is freed when we return",
               "ctx.save_for_backward(x, shard, full)"), (
               "        x, shard = ctx.saved_tensors\n", "        x, shard, full = ctx.saved_tensors\n"), (
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, "
               "device=shard.device)\n"
               "        dist.all_gather_single(full, shard.detach())      # gathered again\n", "")),
           "loses": _UNIT, "visible_says": ["forward must free the gathered weight"]}),
    _seen({"name": "the gathered weight saved for backward, and gathered again anyway",
           "replace": _edit("sharded_linear", (
               "ctx.save_for_backward(x, shard)          # not `full`: it is freed when we return",
               "ctx.save_for_backward(x, shard, full)"), (
               "        x, shard = ctx.saved_tensors\n", "        x, shard, _ = ctx.saved_tensors\n")),
           "loses": _UNIT, "visible_says": ["forward must free the gathered weight"]}),
    _seen({"name": "the gathered weight's views kept on ctx, gathered again anyway",
           "replace": _edit("sharded_linear", (
               "        ctx.sizes = (out_features, in_features)\n",
               "        ctx.sizes = (out_features, in_features)\n        ctx.wb = (w, b)\n")),
           "loses": _UNIT, "visible_says": ["forward must free the gathered weight"]}),
    _seen({"name": "every gathered weight kept in a module-level pool, gathered again anyway",
           "replace": _edit("sharded_linear", (
               "class ShardedLinearFunction(torch.autograd.Function):\n",
               "GATHERED = []                # every unit's whole weight, for reuse\n\n\n"
               "class ShardedLinearFunction(torch.autograd.Function):\n"), (
               "        ctx.sizes = (out_features, in_features)\n",
               "        ctx.sizes = (out_features, in_features)\n        GATHERED.append(full)\n")),
           "loses": _UNIT, "visible_says": ["wherever a tensor is kept"]}),
    _seen({"name": "the gathered weight kept as an attribute of its shard, gathered again anyway",
           "replace": _edit("sharded_linear", (
               "        ctx.sizes = (out_features, in_features)\n",
               "        ctx.sizes = (out_features, in_features)\n        shard.whole = full\n")),
           "loses": _UNIT, "visible_says": ["wherever a tensor is kept"]}),
    _seen({"name": "an all-reduce of the weight gradient where a reduce-scatter belongs",
           "replace": _edit("sharded_linear", (
               "        grad_shard = torch.empty_like(shard)\n"
               "        dist.reduce_scatter_single(grad_shard, flat, op=dist.ReduceOp.SUM)\n",
               "        dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n"
               "        size = shard.numel()\n"
               "        grad_shard = flat[dist.get_rank() * size:(dist.get_rank() + 1) * size]\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_budget"]}),
    _seen({"name": "the input's gradient with the weight transposed: a crossed product",
           "replace": _edit("sharded_linear", ("grad_x = grad_out @ w", "grad_x = grad_out @ w.T")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_local_shapes"]}),
    _seen({"name": "the reduce-scattered gradient not divided by N",
           "replace": _edit("sharded_linear", ("return grad_x, grad_shard / world, None, None",
                                               "return grad_x, grad_shard, None, None")),
           "loses": _UNIT, "visible_says": ["divided by 3"]}),
    _seen({"name": "weight gradient transposed: x.T @ grad_out",
           "replace": _edit("sharded_linear", ("grad_w = rows_out.T @ rows_in",
                                               "grad_w = rows_in.T @ rows_out")),
           "loses": _UNIT, "visible_says": ["the weight's shape (out x in)"]}),
    _seen({"name": "FSDP unit: a backward for inputs of two dims only (a Linear takes more)",
           "replace": _edit("sharded_linear", (
               "        rows_out = grad_out.reshape(-1, out_features)     # every leading dim "
               "counts as rows\n"
               "        rows_in = x.reshape(-1, in_features)\n"
               "        grad_w = rows_out.T @ rows_in\n"
               "        grad_b = rows_out.sum(0)\n",
               "        grad_w = grad_out.t() @ x\n"
               "        grad_b = grad_out.sum(0)\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_leading_dims"]}),
    _seen({"name": "FSDP unit: a module-level workspace, backward reusing forward's gather",
           "replace": FSDP_WORKSPACE_NOT_GATHERED_AGAIN,
           "loses": _UNIT, "visible_says": ["made or filled"]}),
    _seen({"name": "FSDP unit: a module-level workspace with a slot per layer",
           "replace": FSDP_WORKSPACE_SLOT_PER_LAYER,
           "loses": _UNIT, "visible_says": ["made or filled"]}),
    _seen({"name": "FSDP unit: x and the shard kept as ctx attributes, not save_for_backward",
           "replace": _edit("sharded_linear", (
               "        ctx.save_for_backward(x, shard)          # not `full`: it is freed when we "
               "return\n", "        ctx.x, ctx.shard = x, shard\n"), (
               "        x, shard = ctx.saved_tensors\n", "        x, shard = ctx.x, ctx.shard\n")),
           "loses": _UNIT, "visible_says": ["sharding.ctx_attribute"]}),
    _seen({"name": "FSDP unit: backward runs the layer's forward again for autograd.grad",
           "replace": _edit("sharded_linear", (
               "        w, _ = split_weight_bias(full, out_features, in_features)\n"
               "        grad_x = grad_out @ w\n"
               "        rows_out = grad_out.reshape(-1, out_features)     # every leading dim "
               "counts as rows\n"
               "        rows_in = x.reshape(-1, in_features)\n"
               "        grad_w = rows_out.T @ rows_in\n"
               "        grad_b = rows_out.sum(0)\n",
               "        w, b = split_weight_bias(full, out_features, in_features)\n"
               "        with torch.enable_grad():\n"
               "            xd = x.detach().requires_grad_()\n"
               "            wd, bd = w.detach().requires_grad_(), b.detach().requires_grad_()\n"
               "            out = F.linear(xd, wd, bd)\n"
               "            grad_x, grad_w, grad_b = torch.autograd.grad(out, (xd, wd, bd), "
               "grad_out)\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_recomputed"]}),
    _seen({"name": "FSDP unit: the gradient's shard made without a dtype (float32)",
           "replace": _edit("sharded_linear", (
               "        grad_shard = torch.empty_like(shard)\n",
               "        grad_shard = torch.zeros(shard.numel(), device=shard.device)\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_dtype"]}),
    _seen({"name": "FSDP unit: the input on a module-level stack, popped in backward",
           "replace": _edit("sharded_linear", (
               "class ShardedLinearFunction(", "_INPUTS = []\n\n\nclass ShardedLinearFunction("), (
               "        ctx.save_for_backward(x, shard)          # not `full`: it is freed when we "
               "return\n", "        _INPUTS.append(x)\n        ctx.save_for_backward(shard)\n"), (
               "        x, shard = ctx.saved_tensors\n",
               "        (shard,) = ctx.saved_tensors\n        x = _INPUTS.pop()\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_saved_elsewhere"]}),
    {"name": "right: the weight's gradient by einsum, the input's skipped where not needed",
     "replace": _edit("sharded_linear", (
         "        grad_x = grad_out @ w\n",
         "        grad_x = grad_out @ w if ctx.needs_input_grad[0] else None\n"), (
         "        grad_w = rows_out.T @ rows_in\n",
         "        grad_w = torch.einsum(\"ro,ri->oi\", rows_out, rows_in)\n")),
     "loses": []},
    {"name": "right: the list form of all_gather in forward",
     "replace": _edit("sharded_linear", (
         "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)\n"
         "        dist.all_gather_single(full, shard.detach())\n",
         "        parts = [torch.empty_like(shard) for _ in range(world)]\n"
         "        dist.all_gather(parts, shard.detach())\n"
         "        full = torch.cat(parts)\n")),
     "loses": []},
    _seen({"name": "FSDP unit: the shard found in backward in a dict keyed by the layer's shape",
           "replace": FSDP_SHARD_FOUND_BY_SHAPE, "loses": _UNIT,
           "visible_says": ["sharding.fsdp_shared_state"]}),
    _seen({"name": "FSDP unit: the incoming gradient divided in place (a residual path shares it)",
           "replace": FSDP_GRAD_OUT_DIVIDED_IN_PLACE, "loses": _UNIT,
           "visible_says": ["sharding.fsdp_shared_state"]}),
    # -- 3 fp16 reduction ------------------------------------------------------------------------
    _seen({"name": "reducing before dividing in fp16",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    dist.reduce_scatter_single(out, grad16, op=dist.ReduceOp.SUM)\n"
               "    return out.float() / world")),
           "loses": _FP16, "visible_says": ["overflowed fp16"]}),
    _seen({"name": "a pre-divide factor of 2 before the SUM, the rest after: overflows on 4 ranks",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    dist.reduce_scatter_single(out, grad16 / 2, op=dist.ReduceOp.SUM)\n"
               "    return out.float() * 2 / world")),
           "loses": _FP16, "visible_says": ["on 4 ranks"]}),
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
    # FSDP1's split keeps small gradients' digits, and lets 4 ranks' gradients of 40000 overflow
    _seen({"name": "pre- and post-divided by sqrt(N): overflows on 4 ranks",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    pre = world ** 0.5\n"
               "    dist.reduce_scatter_single(out, grad16 / pre, op=dist.ReduceOp.SUM)\n"
               "    return out.float() / pre")),
           "loses": _FP16, "visible_says": ["on 4 ranks"]}),
    _seen({"name": "a pre-divide factor of 8 before the SUM, 8 / N after: small gradients underflow",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    dist.reduce_scatter_single(out, grad16 / 8, op=dist.ReduceOp.SUM)\n"
               "    return out.float() * 8 / world")),
           "loses": _FP16, "visible_says": ["sharding.fp16_underflow"]}),
    _seen({"name": "each rank pre-divides only if its own gradients could overflow the SUM",
           "replace": FP16_FACTOR_BY_RANK,
           "loses": _FP16, "visible_says": ["sharding.fp16_same_factor"]}),
    _seen({"name": "the caller's gradient divided in place before the SUM (fifth pass)",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n",
               "    grad16.div_(world)\n"
               "    dist.reduce_scatter_single(out, grad16, op=dist.ReduceOp.SUM)\n")),
           "loses": _FP16, "visible_says": ["sharding.fp16_in_place"]}),
    {"name": "right: divided in place before the SUM, on a copy",
     "replace": _edit("reduce_scatter_fp16", (
         "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n",
         "    scaled = grad16.clone().div_(world)\n"
         "    dist.reduce_scatter_single(out, scaled, op=dist.ReduceOp.SUM)\n")),
     "loses": []},
    _seen({"name": "fp16: pre-divided by the next power of two >= N (right on 2 and 4 ranks)",
           "replace": _edit("reduce_scatter_fp16", (
               "grad16 / world", "grad16 / (1 << (world - 1).bit_length())")),
           "loses": ["reduce_scatter_fp16_tests"], "visible_says": ["0.625x the reference"]}),
    # -- 4 activation checkpointing ----------------------------------------------------------------
    _seen({"name": "the block's output saved as well: nothing is saved by checkpointing",
           "replace": _edit("checkpoint", (
               "        ctx.save_for_backward(x)\n"
               "        return block(x)          # grad mode is off inside forward: nothing recorded",
               "        y = block(x)\n        ctx.save_for_backward(x, y)\n        return y"), (
               "        (x,) = ctx.saved_tensors\n", "        x, _ = ctx.saved_tensors\n")),
           "loses": _CKPT, "visible_says": ["keeps only its input"]}),
    _seen({"name": "the block's output kept on ctx instead of saved: nothing is saved either",
           "replace": _edit("checkpoint", (
               "        return block(x)          # grad mode is off inside forward: nothing recorded",
               "        ctx.y = block(x)\n        return ctx.y")),
           "loses": _CKPT, "visible_says": ["keeps only its input"]}),
    _seen({"name": "checkpoint: the input kept as a ctx attribute, not save_for_backward",
           "replace": _edit("checkpoint", ("        ctx.save_for_backward(x)\n",
                                           "        ctx.x = x\n"), (
               "        (x,) = ctx.saved_tensors\n", "        x = ctx.x\n")),
           "loses": _CKPT, "visible_says": ["sharding.ctx_attribute"]}),
    _seen({"name": "backward recomputes without recording, so nothing can be backpropagated",
           "replace": _edit("checkpoint", (
               "            with torch.enable_grad():\n                y = ctx.block(x)\n",
               "            y = ctx.block(x)\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_no_graph"]}),
    _seen({"name": "a fixed seed in forward and again in backward instead of the saved state",
           "replace": _edit("checkpoint", (
               "        ctx.save_for_backward(x)\n",
               "        torch.manual_seed(0)\n        ctx.save_for_backward(x)\n"), (
               "            torch.set_rng_state(ctx.rng)             # the forward's dropout masks "
               "again\n",
               "            torch.manual_seed(0)\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_forward_rng"],
           "visible_never_says": ["sharding.checkpoint_accumulates"]}),
    _seen({"name": "no RNG replay: the recomputation draws other dropout masks",
           "replace": _edit("checkpoint", (
               "        with torch.random.fork_rng(devices=[]):      # the caller's stream goes on "
               "untouched\n"
               "            torch.set_rng_state(ctx.rng)             # the forward's dropout masks "
               "again\n"
               "            with torch.enable_grad():\n                y = ctx.block(x)\n",
               "        with torch.enable_grad():\n            y = ctx.block(x)\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_rng]"]}),
    _seen({"name": "RNG replayed but the caller's random stream not given back",
           "replace": _edit("checkpoint", (
               "        with torch.random.fork_rng(devices=[]):      # the caller's stream goes on "
               "untouched\n"
               "            torch.set_rng_state(ctx.rng)             # the forward's dropout masks "
               "again\n"
               "            with torch.enable_grad():\n                y = ctx.block(x)\n",
               "        torch.set_rng_state(ctx.rng)\n"
               "        with torch.enable_grad():\n            y = ctx.block(x)\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_rng_after"]}),
    _seen({"name": "only x's gradient computed: the block's parameters get none",
           "replace": _edit("checkpoint", (
               "        torch.autograd.backward(y, grad_y)\n        return None, x.grad",
               "        (grad_x,) = torch.autograd.grad(y, (x,), grad_y)\n"
               "        return None, grad_x")),
           "loses": _CKPT, "visible_says": ["got no gradient"]}),
    _seen({"name": "the activations cached in a module-level dict for backward, beside ctx",
           "replace": _edit("checkpoint", (
               "class CheckpointFunction(torch.autograd.Function):",
               "_ACTIVATIONS = {}\n\n\nclass CheckpointFunction(torch.autograd.Function):"), (
               "        return block(x)          # grad mode is off inside forward: nothing recorded",
               "        h, kept = x, []\n"
               "        for layer in block:\n"
               "            h = layer(h)\n"
               "            kept.append(h)\n"
               "        _ACTIVATIONS[id(block)] = kept\n"
               "        return h")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_kept_elsewhere"]}),
    _seen({"name": "the input kept on the Function's class: two blocks in a row share it",
           "replace": CKPT_INPUT_ON_THE_CLASS, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_per_call"]}),
    _seen({"name": "the RNG state kept on the Function's class: two blocks in a row share it",
           "replace": CKPT_RNG_ON_THE_CLASS, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_per_call"]}),
    _seen({"name": "the RNG state kept on the block: one block checkpointed twice shares it",
           "replace": CKPT_RNG_ON_THE_BLOCK, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_per_call"]}),
    _seen({"name": "the input and the RNG state on a module-level stack, popped in backward",
           "replace": CKPT_ON_A_MODULE_STACK, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_per_call"]}),
    _seen({"name": "the recomputation runs on the saved input itself, not a detached copy",
           "replace": _edit("checkpoint", ("        x = x.detach().requires_grad_(True)\n", "")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_detach"]}),
    _seen({"name": "the parameters' gradients set, not added: the last backward's only",
           "replace": _edit("checkpoint", (
               "        torch.autograd.backward(y, grad_y)\n        return None, x.grad",
               "        params = list(ctx.block.parameters())\n"
               "        grads = torch.autograd.grad(y, [x, *params], grad_y)\n"
               "        for p, g in zip(params, grads[1:]):\n"
               "            p.grad = g\n"
               "        return None, grads[0]")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_hooks"]}),
    {"name": "right: a fresh leaf by clone, and y.backward",
     "replace": _edit("checkpoint", (
         "x = x.detach().requires_grad_(True)", "x = x.clone().requires_grad_(True)"), (
         "torch.autograd.backward(y, grad_y)", "y.backward(grad_y)")),
     "loses": []},
    {"name": "right: the caller's RNG state saved and restored by hand",
     "replace": _edit("checkpoint", (
         "        with torch.random.fork_rng(devices=[]):      # the caller's stream goes on "
         "untouched\n"
         "            torch.set_rng_state(ctx.rng)             # the forward's dropout masks "
         "again\n"
         "            with torch.enable_grad():\n                y = ctx.block(x)\n",
         "        caller = torch.get_rng_state()\n"
         "        torch.set_rng_state(ctx.rng)\n"
         "        with torch.enable_grad():\n            y = ctx.block(x)\n"
         "        torch.set_rng_state(caller)\n")),
     "loses": []},
    # -- predictions and recall (their visible tests check the format only) ------------------------
    {"name": "prediction: only the shards, as dl.cost.memory(zero=3) counts",
     "replace": {"predict_peak": "peak_param_bytes = 4 * (109 + 212 + 53)"},
     "loses": ["predict_peak_tests"]},
    {"name": "prediction: the whole model gathered at once",
     "replace": {"predict_peak": "peak_param_bytes = 4 * (109 + 212 + 53 + 1864)"},
     "loses": ["predict_peak_tests"]},
    {"name": "prediction: the padding left out (1056 gathered, shards of 1864 / 5)",
     "replace": {"predict_peak": "peak_param_bytes = 4 * (1864 // 5 + 1056)"},
     "loses": ["predict_peak_tests"]},
    {"name": "prediction: the 2-rank peak the next cell measures",
     "replace": {"predict_peak": "peak_param_bytes = 7952"}, "loses": ["predict_peak_tests"]},
    {"name": "prediction: one unit per Linear, as in the earlier traces",
     "replace": {"predict_fully_shard": "fully_shard_calls = (3, 3, 3)"},
     "loses": ["predict_fully_shard_tests"]},
    {"name": "prediction: the root taken to own nothing (the last Linear left out)",
     "replace": {"predict_fully_shard": "fully_shard_calls = (2, 2, 2)"},
     "loses": ["predict_fully_shard_tests"]},
    {"name": "prediction: the counts the next cell traces, for its own wrapping",
     "replace": {"predict_fully_shard": "fully_shard_calls = (2, 1, 2)"},
     "loses": ["predict_fully_shard_tests"]},
    {"name": "recall 1: the hook fires once per step",
     "replace": {"recall_zero2": 'answer_1 = "b"'}, "loses": ["recall_zero2_tests"]},
    {"name": "recall 2: FSDP costs what data parallel costs",
     "replace": {"recall_fsdp_traffic": 'answer_2 = "a"'}, "loses": ["recall_fsdp_traffic_tests"]},
    {"name": "recall 3: the same gap on both sides of 1.0",
     "replace": {"recall_master": 'answer_3 = "b"'}, "loses": ["recall_master_tests"]},
    {"name": "recall 4: checkpointing doubles the compute",
     "replace": {"recall_checkpoint": "checkpoint_factor = 2"},
     "loses": ["recall_checkpoint_tests"]},
    {"name": "right: 4/3 written as 1.33",
     "replace": {"recall_checkpoint": "checkpoint_factor = 1.33"}, "loses": []},    # the seventh pass's
    _seen({"name": "ZeRO-2: the padding from torch.empty, never zeroed (fresh CPU memory is zeros)",
           "replace": ZERO2_PADDING_UNFILLED, "loses": _Z2, "visible_says": ["value.unfilled"]}),
    _seen({"name": "FSDP: the gradient's padding from torch.empty, never zeroed",
           "replace": FSDP_PADDING_UNFILLED, "loses": _UNIT, "visible_says": ["value.unfilled"]}),
    _seen({"name": "FSDP: the average taken by dividing the saved input in place",
           "replace": FSDP_INPUT_DIVIDED_IN_PLACE, "loses": _UNIT,
           "visible_says": ["sharding.fsdp_input_in_place"]}),
    _seen({"name": "fp16: one result buffer per size, which the next call overwrites",
           "replace": FP16_ONE_RESULT_BUFFER, "loses": _FP16,
           "visible_says": ["sharding.fp16_shared_buffer"]}),
    _seen({"name": "ZeRO-2: the chunk divided while its reduce-scatter is on the wire",
           "replace": ZERO2_DIVIDED_ON_THE_WIRE, "loses": _Z2,
           "visible_says": ["check.written_in_flight"]}),
    _seen({"name": "FSDP: forward computes with the gathered weight before the gather's wait",
           "replace": FSDP_WEIGHT_READ_BEFORE_ITS_WAIT, "loses": _UNIT,
           "visible_says": ["value.unfilled"]}),
    _seen({"name": "checkpoint: the recomputed output kept on the block, its graph retained",
           "replace": CKPT_RECOMPUTED_KEPT_AFTER_BACKWARD, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_after_backward"]}),
    _seen({"name": "checkpoint: the parameters' .grad set by hand (their hooks never run)",
           "replace": CKPT_GRADS_SET_BY_HAND, "loses": _CKPT,
           "visible_says": ["sharding.checkpoint_hooks"]}),
    # the eighth pass's: each right for the sizes and the dtype the checks used
    _seen({"name": "ZeRO-2: the chunk's buffer made float64, the first check's dtype",
           "replace": _edit("zero2_hooks", (
               "mine = torch.empty(size, dtype=p.grad.dtype, device=p.grad.device)",
               "mine = torch.empty(size, dtype=torch.float64, device=p.grad.device)")),
           "loses": _Z2, "visible_says": ["(float32 here)", "sharding.zero2_dtype"]}),
    _seen({"name": "FSDP: the gathered weight's buffers made float64, the checks' first dtype",
           "replace": _edit("sharded_linear", (
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, "
               "device=shard.device)\n        dist.all_gather_single(full, shard.detach())\n"
               "        w, b = split_weight_bias(",
               "        full = torch.empty(world * shard.numel(), dtype=torch.float64, "
               "device=shard.device)\n        dist.all_gather_single(full, shard.detach())\n"
               "        w, b = split_weight_bias("), (
               "        full = torch.empty(world * shard.numel(), dtype=shard.dtype, "
               "device=shard.device)\n        dist.all_gather_single(full, shard.detach())"
               "      # gathered again",
               "        full = torch.empty(world * shard.numel(), dtype=torch.float64, "
               "device=shard.device)\n        dist.all_gather_single(full, shard.detach())"
               "      # gathered again")),
           "loses": _UNIT, "visible_says": ["on a float32 model", "sharding.fsdp_dtype"]}),
    _seen({"name": "FSDP: leading dims flattened for inputs of three dims only",
           "replace": _edit("sharded_linear", (
               "        rows_out = grad_out.reshape(-1, out_features)     # every leading dim "
               "counts as rows\n"
               "        rows_in = x.reshape(-1, in_features)\n",
               "        if grad_out.dim() == 3:                           # (batch, seq, features)\n"
               "            rows_out, rows_in = grad_out.flatten(0, 1), x.flatten(0, 1)\n"
               "        else:\n"
               "            rows_out, rows_in = grad_out, x\n")),
           "loses": _UNIT,
           "visible_says": ["(batch, 2, 2, features)", "sharding.fsdp_leading_dims"]}),
    _seen({"name": "FSDP: the shard's gradient written into shard.grad by hand (not accumulated)",
           "replace": _edit("sharded_linear", (
               "        return grad_x, grad_shard / world, None, None",
               "        shard.grad = grad_shard / world\n"
               "        return grad_x, None, None, None")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_accumulates"]}),
    _seen({"name": "FSDP: the sizes kept on the class, which every unit shares",
           "replace": _edit("sharded_linear", (
               "        ctx.sizes = (out_features, in_features)\n",
               "        ShardedLinearFunction.sizes = (out_features, in_features)\n"), (
               "        out_features, in_features = ctx.sizes\n",
               "        out_features, in_features = ShardedLinearFunction.sizes\n")),
           "loses": _UNIT, "visible_says": ["kept from another unit's call"]}),
    _seen({"name": "FSDP: a copy of the input saved for backward",
           "replace": _edit("sharded_linear", (
               "        ctx.save_for_backward(x, shard)",
               "        ctx.save_for_backward(x.clone(), shard)")),
           "loses": _UNIT, "visible_says": ["a copy of what backward needs"]}),
    _seen({"name": "fp16: pre-divided by the next power of two >= N, corrected after the SUM",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    p2 = 1 << (world - 1).bit_length()             # exact in fp16\n"
               "    dist.reduce_scatter_single(out, grad16 / p2, op=dist.ReduceOp.SUM)\n"
               "    return out.float() * (p2 / world)")),
           "loses": _FP16, "visible_says": ["on 3 ranks", "sharding.fp16_underflow"]}),
    _seen({"name": "fp16: the pre-divide factor capped at 4, the rest after the SUM",
           "replace": _edit("reduce_scatter_fp16", (
               "    dist.reduce_scatter_single(out, grad16 / world, op=dist.ReduceOp.SUM)\n"
               "    return out.float()",
               "    pre = min(world, 4)                            # spares small gradients\n"
               "    dist.reduce_scatter_single(out, grad16 / pre, op=dist.ReduceOp.SUM)\n"
               "    return out.float() * (pre / world)")),
           "loses": _FP16, "visible_says": ["on 5 ranks", "overflowed fp16"]}),
    _seen({"name": "fp16: the world size taken from the notebook's WORLD",
           "replace": _edit("reduce_scatter_fp16", ("    world = dist.get_world_size()\n",
                                                    "    world = WORLD\n")),
           "loses": _FP16, "visible_says": ["sharding.fp16_sizes"]}),
    _seen({"name": "checkpoint: every output kept in a module-level list (for inspection)",
           "replace": _edit("checkpoint", (
               "class CheckpointFunction(", "_OUTPUTS = []\n\n\nclass CheckpointFunction("), (
               "        return block(x)          # grad mode is off inside forward: nothing "
               "recorded",
               "        y = block(x)\n        _OUTPUTS.append(y)\n        return y")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_output_kept"]}),
    _seen({"name": "checkpoint: the last output kept on the block",
           "replace": _edit("checkpoint", (
               "        return block(x)          # grad mode is off inside forward: nothing "
               "recorded",
               "        block.last_out = block(x)\n        return block.last_out")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_output_kept"]}),
    _seen({"name": "checkpoint: the random state kept only when the block has a dropout module",
           "replace": _edit("checkpoint", (
               "        ctx.rng = torch.get_rng_state()\n",
               "        has_dropout = any(isinstance(m, nn.Dropout) for m in block.modules())\n"
               "        ctx.rng = torch.get_rng_state() if has_dropout else None\n"), (
               "            torch.set_rng_state(ctx.rng)             # the forward's dropout "
               "masks again\n",
               "            if ctx.rng is not None:\n"
               "                torch.set_rng_state(ctx.rng)\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_rng_any"]}),
    _seen({"name": "checkpoint: forward run inside fork_rng, so the stream stays before its masks",
           "replace": _edit("checkpoint", (
               "        return block(x)          # grad mode is off inside forward: nothing "
               "recorded",
               "        with torch.random.fork_rng(devices=[]):\n            return block(x)")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_forward_stream"]}),
    # the ninth pass's: layouts a flat view cannot read, and a checkpoint that keeps a copy
    _seen({"name": "ZeRO-2: the gradient flattened with view(-1) (ninth pass)",
           "replace": _edit("zero2_hooks", ("F.pad(p.grad.reshape(-1),", "F.pad(p.grad.view(-1),")),
           "loses": _Z2, "visible_says": ["sharding.zero2_layout"]}),
    _seen({"name": "FSDP unit: the input's rows taken with view (ninth pass)",
           "replace": _edit("sharded_linear", ("        rows_in = x.reshape(-1, in_features)\n",
                                               "        rows_in = x.view(-1, in_features)\n")),
           "loses": _UNIT, "visible_says": ["sharding.fsdp_layout"]}),
    _seen({"name": "checkpoint: a copy of the input saved, x.detach().clone() (ninth pass)",
           "replace": _edit("checkpoint", ("        ctx.save_for_backward(x)\n",
                                           "        ctx.save_for_backward(x.detach().clone())\n")),
           "loses": _CKPT, "visible_says": ["sharding.checkpoint_input_copy"]}),
]
