"""Broken variants of 02_data_parallel: classic mistakes the grader must catch.

Each variant is the solution cell with one mistake written in, made here as an exact edit of the
solution notebook's own source, so the variants follow the notebook as it changes. An edit that
no longer matches the notebook is an error when this module is imported, never a variant that
silently tests nothing. `loses` lists exactly the graded cells that must score zero.

`visible` names the test cells a learner can run that must already FAIL with the mistake written
in (hidden tests stripped: tests/end_to_end/test_course.py runs the learner's view), and
`visible_says` words that failure must contain: every classic mistake shows before hand-in, with the
grader's hint. A mistake in an earlier piece loses that piece's cells only: later exercises are
graded with the library's version of it (the variants of shard_batch, broadcast_parameters and
OverlappingDP prove it, since their `loses` names nothing later).
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("02_data_parallel")


RECALL_TESTS = [f"recall_{i}_tests" for i in range(1, 6)]
ALL_GRADED = ["shard_batch_tests", "broadcast_tests", "dp_train_step_tests",
              "allreduce_gradients_flat_tests", "overlapping_dp_tests",
              "accumulation_step_tests", "no_sync_prediction_tests", "lr_answer_tests",
              "sharded_momentum_sgd_tests", *RECALL_TESTS]


# a learner's ZeRO-1 that averages the gradient shard-wise, then keeps a full-size momentum
# on every rank with self.momentum a view into it: right numbers, right calls, no saving
FULL_MOMENTUM_KEPT = {"sharded_momentum_sgd": '''
class ShardedMomentumSGD:
    def __init__(self, params, lr: float, momentum: float):
        self.params = list(params)
        self.lr, self.mu = lr, momentum
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.lo = self.rank * self.shard_size
        like = self.params[0]
        self.momentum = torch.zeros(self.shard_size, dtype=like.dtype, device=like.device)

    def flat(self, tensors) -> torch.Tensor:
        out = torch.zeros(self.shard_size * self.world, dtype=self.momentum.dtype,
                          device=self.momentum.device)
        offset = 0
        for p, t in zip(self.params, tensors):
            if t is not None:
                out[offset:offset + p.numel()] = t.reshape(-1)
            offset += p.numel()
        return out

    @torch.no_grad()
    def step(self) -> None:
        grads = self.flat([p.grad for p in self.params])
        g_shard = torch.empty_like(self.momentum)
        dist.reduce_scatter_single(g_shard, grads, op=dist.ReduceOp.SUM)
        g_shard /= self.world
        g_full = torch.empty_like(grads)
        dist.all_gather_single(g_full, g_shard)
        if not hasattr(self, "full_momentum"):
            self.full_momentum = torch.zeros_like(g_full)
        self.full_momentum.mul_(self.mu).add_(g_full)
        self.momentum = self.full_momentum[self.lo:self.lo + self.shard_size]
        offset = 0
        for p in self.params:
            p -= self.lr * self.full_momentum[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
'''}

# a good-faith learner's OverlappingDP: a bucket counts as ready once each of its .grad exists,
# true from the start of a backward whose gradients were set to zero, not None
READY_BY_EXISTING_GRAD = {"overlapping_dp": '''
class OverlappingDP:
    """Average gradients over all ranks while backward runs, one async all-reduce per bucket."""

    def __init__(self, model: torch.nn.Module, cap_bytes: int):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = plan_buckets(self.params, cap_bytes)
        self.world = dist.get_world_size()
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.next_bucket = 0
        self.pending = []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def _grad_ready(self, i: int) -> None:
        while (self.next_bucket < len(self.buckets)
               and all(self.params[j].grad is not None for j in self.buckets[self.next_bucket])):
            b = self.next_bucket
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self.pending.append((b, flat, work))
            self.next_bucket += 1

    def finish(self) -> None:
        for b, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for j in self.buckets[b]:
                p = self.params[j]
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
        self.pending = []
        self.next_bucket = 0
'''}


# the fifth learner pass's: the caller's p.grad divided by N in place before flattening
ZERO1_GRADS_DIVIDED_IN_PLACE = {"sharded_momentum_sgd": '''\
class ShardedMomentumSGD:
    """SGD with momentum whose momentum buffer is sharded over the ranks (ZeRO stage 1)."""

    def __init__(self, params, lr: float, momentum: float):
        self.params = list(params)
        self.lr, self.mu = lr, momentum
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.lo = self.rank * self.shard_size          # this rank's shard: [lo, lo + shard_size)
        like = self.params[0]
        self.momentum = torch.zeros(self.shard_size, dtype=like.dtype,    # 1/world of the state
                                    device=like.device)

    def flat(self, tensors) -> torch.Tensor:
        out = torch.zeros(self.shard_size * self.world, dtype=self.momentum.dtype,
                          device=self.momentum.device)
        offset = 0
        for p, t in zip(self.params, tensors):
            if t is not None:
                out[offset:offset + p.numel()] = t.reshape(-1)
            offset += p.numel()
        return out

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.world)
        g = self.flat([p.grad for p in self.params])
        shard = torch.empty(self.shard_size, dtype=g.dtype, device=g.device)
        dist.reduce_scatter_single(shard, g, op=dist.ReduceOp.SUM)
        self.momentum.mul_(self.mu).add_(shard)
        w = self.flat([p for p in self.params])
        mine = w[self.lo:self.lo + self.shard_size] - self.lr * self.momentum
        full = torch.empty_like(w)
        dist.all_gather_single(full, mine.contiguous())
        off = 0
        for p in self.params:
            n = p.numel()
            p.copy_(full[off:off + n].view_as(p))
            off += n
'''}

# the fifth pass's: the hooks numbered over model.parameters(), frozen ones included
OVERLAP_NUMBERED_BY_MODEL_PARAMETERS = {"overlapping_dp": '''\
class OverlappingDP:
    def __init__(self, model: torch.nn.Module, cap_bytes: int):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = plan_buckets(self.params, cap_bytes)
        self.world = dist.get_world_size()
        self.bucket_of = {}
        for b, members in enumerate(self.buckets):
            for i in members:
                self.bucket_of[i] = b
        self.pending = [len(m) for m in self.buckets]
        self.next_bucket = 0
        self.inflight = []
        for i, p in enumerate(model.parameters()):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def _grad_ready(self, i: int) -> None:
        self.pending[self.bucket_of[i]] -= 1
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] == 0:
            members = self.buckets[self.next_bucket]
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in members])
            h = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self.inflight.append((self.next_bucket, flat, h))
            self.next_bucket += 1

    def finish(self) -> None:
        for b, flat, h in self.inflight:
            h.wait()
            flat /= self.world
            off = 0
            for j in self.buckets[b]:
                p = self.params[j]
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
        self.inflight = []
        self.pending = [len(m) for m in self.buckets]
        self.next_bucket = 0
'''}

# the fifth pass's: one bucket a hook ('if', not 'while'), the held-back ones sent by finish()
OVERLAP_HELD_BUCKETS_SENT_BY_FINISH = {"overlapping_dp": '''\
class OverlappingDP:
    def __init__(self, model: torch.nn.Module, cap_bytes: int):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = plan_buckets(self.params, cap_bytes)
        self.world = dist.get_world_size()
        self.bucket_of = {}
        for b, members in enumerate(self.buckets):
            for i in members:
                self.bucket_of[i] = b
        self.pending = [len(m) for m in self.buckets]
        self.next_bucket = 0
        self.inflight = []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def _grad_ready(self, i: int) -> None:
        self.pending[self.bucket_of[i]] -= 1
        if self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] == 0:
            members = self.buckets[self.next_bucket]
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in members])
            h = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self.inflight.append((self.next_bucket, flat, h))
            self.next_bucket += 1

    def finish(self) -> None:
        while self.next_bucket < len(self.buckets):
            members = self.buckets[self.next_bucket]
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in members])
            h = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self.inflight.append((self.next_bucket, flat, h))
            self.next_bucket += 1
        for b, flat, h in self.inflight:
            h.wait()
            flat /= self.world
            off = 0
            for j in self.buckets[b]:
                p = self.params[j]
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
        self.inflight = []
        self.pending = [len(m) for m in self.buckets]
        self.next_bucket = 0
'''}

# the fifth pass's: the frozen parameters in the buffer as zeros
FLAT_FROZEN_SENT_AS_ZEROS = {"allreduce_gradients_flat": '''\
def allreduce_gradients_flat(model: torch.nn.Module) -> None:
    params = list(model.parameters())
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    off = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n
'''}

# the fifth pass's: the flat buffer made without a dtype (float32)
FLAT_BUFFER_FLOAT32 = {"allreduce_gradients_flat": '''\
def allreduce_gradients_flat(model: torch.nn.Module) -> None:
    params = [p for p in model.parameters() if p.grad is not None]
    total = sum(p.numel() for p in params)
    flat = torch.zeros(total, device=params[0].device)
    off = 0
    for p in params:
        flat[off:off + p.numel()] = p.grad.reshape(-1)
        off += p.numel()
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n
'''}

# the fifth pass's: ValueError raised with no message
SHARD_REFUSED_WITHOUT_A_WORD = {"shard_batch": '''\
def shard_batch(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    if batch.shape[0] % world_size:
        raise ValueError
    return batch.chunk(world_size)[rank]
'''}


# the fifth pass's: the update before finish_gradient_sync(), with this rank's own sum
ACCUMULATION_UPDATE_BEFORE_SYNC = {"accumulation_step": '''\
def accumulation_step(model: dl.dp.DataParallel, x: torch.Tensor, y: torch.Tensor,
                      n_micro: int, lr: float) -> None:
    model.zero_grad()
    for k, (xb, yb) in enumerate(zip(x.chunk(n_micro), y.chunk(n_micro))):
        ctx = model.no_sync() if k < n_micro - 1 else contextlib.nullcontext()
        with ctx:
            (F.mse_loss(model(xb), yb) / n_micro).backward()
    sgd_step(model, lr)
    model.finish_gradient_sync()
'''}

# the fifth pass's: the momentum accumulates the sum, the division moved into the update
ZERO1_MOMENTUM_OF_THE_SUM = {"sharded_momentum_sgd": '''\
class ShardedMomentumSGD:
    """SGD with momentum whose momentum buffer is sharded over the ranks (ZeRO stage 1)."""

    def __init__(self, params, lr: float, momentum: float):
        self.params = list(params)
        self.lr, self.mu = lr, momentum
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.lo = self.rank * self.shard_size          # this rank's shard: [lo, lo + shard_size)
        like = self.params[0]
        self.momentum = torch.zeros(self.shard_size, dtype=like.dtype,    # 1/world of the state
                                    device=like.device)

    def flat(self, tensors) -> torch.Tensor:
        out = torch.zeros(self.shard_size * self.world, dtype=self.momentum.dtype,
                          device=self.momentum.device)
        offset = 0
        for p, t in zip(self.params, tensors):
            if t is not None:
                out[offset:offset + p.numel()] = t.reshape(-1)
            offset += p.numel()
        return out

    @torch.no_grad()
    def step(self) -> None:
        g = self.flat([p.grad for p in self.params])
        shard = torch.empty(self.shard_size, dtype=g.dtype, device=g.device)
        dist.reduce_scatter_single(shard, g, op=dist.ReduceOp.SUM)
        self.momentum.mul_(self.mu).add_(shard)
        w = self.flat([p for p in self.params])
        mine = w[self.lo:self.lo + self.shard_size] - self.lr * self.momentum / self.world
        full = torch.empty_like(w)
        dist.all_gather_single(full, mine.contiguous())
        off = 0
        for p in self.params:
            n = p.numel()
            p.copy_(full[off:off + n].view_as(p))
            off += n
'''}

# the fifth pass's: the shard's size from the notebook's BATCH
SHARD_BY_THE_NOTEBOOKS_BATCH = {"shard_batch": '''\
def shard_batch(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    if BATCH % world_size != 0:
        raise ValueError(f"{BATCH} samples do not split evenly over {world_size} ranks")
    per = BATCH // world_size
    return batch[rank * per:(rank + 1) * per]
'''}

# the fifth pass's: async all-reduces read without waiting
DP_STEP_NEVER_WAITED = {"dp_train_step": '''\
def dp_train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
    model.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True)
            p.grad /= world
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    return loss.item()
'''}

# the fifth pass's: the flat buffer's async all-reduce read without waiting
FLAT_NEVER_WAITED = {"allreduce_gradients_flat": '''\
def allreduce_gradients_flat(model: torch.nn.Module) -> None:
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    work = dist.all_reduce(flat, async_op=True)
    flat /= dist.get_world_size()
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n
'''}

# -- the seventh learner pass -------------------------------------------------------------------

# the last dimension judged for divisibility, not the rows: a 12 x 5 batch over 3 ranks refused,
# a 10 x 4 batch over 4 accepted (rows lost)
SHARD_BY_THE_LAST_DIMENSION = {"shard_batch": """def shard_batch(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    n = batch.shape[0]
    if batch.shape[-1] % world_size:
        raise ValueError(f"{n} samples do not split evenly over {world_size} ranks")
    per = n // world_size
    return batch[rank * per:(rank + 1) * per]
"""}

# one flat buffer in float32 for float64 parameters: drawn in float32, the weights survive it
BROADCAST_THROUGH_FLOAT32 = {"broadcast_parameters": """def broadcast_parameters(model: torch.nn.Module, src: int = 0) -> None:
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1).float() for p in params])
    dist.broadcast(flat, src)
    with torch.no_grad():
        o = 0
        for p in params:
            p.copy_(flat[o:o + p.numel()].view_as(p))
            o += p.numel()
"""}

# the flat buffer always float64: a float32 model's gradients in twice the bytes
FLAT_ALWAYS_FLOAT64 = {"allreduce_gradients_flat": """def allreduce_gradients_flat(model: torch.nn.Module) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1).to(torch.float64) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    o = 0
    for g in grads:
        g.copy_(flat[o:o + g.numel()].view_as(g))
        o += g.numel()
"""}

ZERO1_MOMENTUM_FIXED = _edit("sharded_momentum_sgd", ("self.momentum.mul_(self.mu)",
                                                      "self.momentum.mul_(0.9)"))
ZERO1_LR_FIXED = _edit("sharded_momentum_sgd", ("- self.lr * self.momentum", "- 0.1 * self.momentum"))


VARIANTS = [
    # -- 1 shard_batch --------------------------------------------------------------------------
    {"name": "every rank takes the first slice of the batch",
     "replace": _edit("shard_batch", ("return batch[rank * per_rank:(rank + 1) * per_rank]",
                                      "return batch[:per_rank]")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["one contiguous slice", "dp.shard_slice"]},
    {"name": "a batch that does not split evenly is not refused",
     "replace": _edit("shard_batch", ("if n % world_size:", "if n < world_size:")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["should raise ValueError"]},
    {"name": "an assert where a ValueError belongs",
     "replace": _edit("shard_batch", (
         "    if n % world_size:\n"
         "        raise ValueError(",
         "    assert n % world_size == 0, (")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["raised AssertionError", "not ValueError"]},
    {"name": "the shard size hard-coded for the notebook's batch of 64 on 4 ranks",
     "replace": _edit("shard_batch", ("    per_rank = n // world_size\n", "    per_rank = 16\n")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["dp.shard_size"]},
    {"name": "the shard returned as float32 (a float64 batch, integer labels converted)",
     "replace": _edit("shard_batch", ("return batch[rank * per_rank:(rank + 1) * per_rank]",
                                      "return batch[rank * per_rank:(rank + 1) * per_rank].float()")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["dp.shard_dtype"]},
    {"name": "the notebook's global batch size in place of the batch passed in",
     "replace": _edit("shard_batch", ("    n = batch.shape[0]\n", "    n = BATCH\n")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"]},
    {"name": "the library's shard used instead of one's own (switched off while graded)",
     "replace": _edit("shard_batch", ("return batch[rank * per_rank:(rank + 1) * per_rank]",
                                      "return dl.models.shard_batch(batch, rank, world_size)")),
     "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["dl.models.shard_batch is switched off"]},
    {"name": "dp_train_step: the learning rate hard-coded to 0.1, lr ignored",
     "replace": _edit("dp_train_step", ("            p -= lr * p.grad\n",
                                        "            p -= 0.1 * p.grad\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.fixed_lr"]},
    {"name": "accumulation_step: the learning rate hard-coded to 0.1, lr ignored",
     "replace": _edit("accumulation_step", ("    sgd_step(model, lr)\n",
                                            "    sgd_step(model, 0.1)\n")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.fixed_lr"]},
    {"name": "allreduce_gradients_flat: every parameter's .grad taken, a frozen one's None too",
     "replace": _edit("allreduce_gradients_flat", (
         "    params = [p for p in model.parameters() if p.grad is not None]\n",
         "    params = list(model.parameters())\n")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.frozen_parameter"]},
    # -- 2 broadcast_parameters -----------------------------------------------------------------
    {"name": "no broadcast at start: replicas keep their own initialisation",
     "replace": _edit("broadcast_parameters", ("dist.broadcast(p, src=src)", "pass")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["rank 0's weights"]},
    {"name": "weights averaged over the ranks instead of broadcast from rank 0",
     "replace": _edit("broadcast_parameters", (
         "dist.broadcast(p, src=src)",
         "dist.all_reduce(p, op=dist.ReduceOp.SUM)\n            p /= dist.get_world_size()")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["not an average over the ranks"]},
    {"name": "src ignored: always broadcast from rank 0",
     "replace": _edit("broadcast_parameters", ("dist.broadcast(p, src=src)",
                                               "dist.broadcast(p, src=0)")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["rank 2's weights"]},
    {"name": "a flat broadcast buffer of the notebook's N_NUMEL numbers (sixth pass)",
     "replace": _edit("broadcast_parameters", (
         "        for p in model.parameters():\n"
         "            dist.broadcast(p, src=src)\n",
         "        params = list(model.parameters())\n"
         "        flat = torch.zeros(N_NUMEL, dtype=params[0].dtype, device=params[0].device)\n"
         "        if dist.get_rank() == src:\n"
         "            flat.copy_(torch.cat([p.reshape(-1) for p in params]))\n"
         "        dist.broadcast(flat, src=src)\n"
         "        torch.nn.utils.vector_to_parameters(flat, params)\n")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["dp.broadcast_fixed_size"]},
    {"name": "async broadcasts never waited on (sixth pass)",
     "replace": _edit("broadcast_parameters", ("dist.broadcast(p, src=src)",
                                               "dist.broadcast(p, src=src, async_op=True)")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["check.unwaited"]},
    {"name": "right another way: the parameters broadcast as one flat buffer, copied back",
     "replace": _edit("broadcast_parameters", (
         "        for p in model.parameters():\n"
         "            dist.broadcast(p, src=src)\n",
         "        params = list(model.parameters())\n"
         "        flat = torch.nn.utils.parameters_to_vector(params)\n"
         "        dist.broadcast(flat, src=src)\n"
         "        torch.nn.utils.vector_to_parameters(flat, params)\n")),
     "loses": []},
    {"name": "the parameters broadcast, then the state_dict's tensors: the same ones again",
     "replace": _edit("broadcast_parameters", (
         "            dist.broadcast(p, src=src)\n",
         "            dist.broadcast(p, src=src)\n"
         "        for t in model.state_dict().values():     # the buffers too\n"
         "            dist.broadcast(t, src=src)\n")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["dp.broadcast_extra_bytes"]},
    {"name": "only the parameters that require grad broadcast (a frozen one keeps its own)",
     "replace": _edit("broadcast_parameters", (
         "        for p in model.parameters():\n",
         "        for p in (q for q in model.parameters() if q.requires_grad):\n")),
     "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["dp.broadcast_frozen"]},
    # -- 3 dp_train_step ------------------------------------------------------------------------
    {"name": "sum of the gradients not divided by dp_size",
     "replace": _edit("dp_train_step", ("        p.grad /= world\n", "")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["every element is 3x the reference"]},
    {"name": "the sum divided by 2, a number right on 2 ranks only",
     "replace": _edit("dp_train_step", ("        p.grad /= world\n", "        p.grad /= 2\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.fixed_divisor"]},
    {"name": "the learning rate divided instead of the gradient: p.grad keeps the sum",
     "replace": _edit("dp_train_step", ("        p.grad /= world\n", ""),
                      ("p -= lr * p.grad", "p -= lr / world * p.grad")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.grad_not_averaged"],
     "visible_never_says": ["scale.sum_not_divided"]},
    {"name": "reduced onto rank 0 and broadcast back: right numbers, one rank does the work",
     "replace": _edit("dp_train_step", (
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n",
         "        dist.reduce(p.grad, dst=0, op=dist.ReduceOp.SUM)\n"
         "        dist.broadcast(p.grad, src=0)\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.reduce_then_broadcast"]},
    {"name": "the loss divided by the world size before backward, and returned divided",
     "replace": _edit("dp_train_step", ("    loss = F.mse_loss(model(x), y)\n",
                                        "    loss = F.mse_loss(model(x), y) / world\n"),
                      ("        p.grad /= world\n", "")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.loss_returned_scaled"]},
    {"name": "a barrier after the all-reduces: right numbers, two kinds of collective",
     "replace": _edit("dp_train_step", (
         "    with torch.no_grad():\n        for p in trained:\n            p -= lr",
         "    dist.barrier()\n"
         "    with torch.no_grad():\n        for p in trained:\n            p -= lr")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.step_ops"]},
    {"name": "the loss returned is recomputed after the update",
     "replace": _edit("dp_train_step", ("    return loss.item()",
                                        "    return F.mse_loss(model(x), y).item()")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.loss_returned]"]},
    {"name": "gradients cleared at the end of the step instead of its start",
     "replace": _edit("dp_train_step", ("    model.zero_grad()\n", ""),
                      ("    return loss.item()", "    model.zero_grad()\n    return loss.item()")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.grad_dropped"]},
    {"name": "gradients never cleared: step 2 adds to step 1's",
     "replace": _edit("dp_train_step", ("    model.zero_grad()\n", "")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.carry_over"]},
    {"name": "right another way: the loss divided by the world size before backward",
     "replace": _edit("dp_train_step", ("    loss.backward()\n", "    (loss / world).backward()\n"),
                      ("        p.grad /= world\n", "")),
     "loses": []},
    {"name": "right another way: one average per gradient with ReduceOp.AVG",
     "replace": _edit("dp_train_step", (
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n        p.grad /= world\n",
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)\n")),
     "loses": []},
    {"name": "no all-reduce: every rank steps with its local gradient",
     "replace": _edit("dp_train_step", (
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n", "")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["stepped with different gradients"]},
    # the sixth learner pass's
    {"name": "the sum divided by 3, a number right on 3 ranks only",
     "replace": _edit("dp_train_step", ("        p.grad /= world\n", "        p.grad /= 3\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.fixed_divisor"]},
    {"name": "a copy of each gradient averaged and used for the update; p.grad keeps its own",
     "replace": _edit("dp_train_step", (
         "    for p in trained:\n"
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n"
         "        p.grad /= world\n"
         "    with torch.no_grad():\n"
         "        for p in trained:\n"
         "            p -= lr * p.grad\n",
         "    averaged = [p.grad.clone() for p in trained]\n"
         "    for g in averaged:\n"
         "        dist.all_reduce(g, op=dist.ReduceOp.SUM)\n"
         "        g /= world\n"
         "    with torch.no_grad():\n"
         "        for p, g in zip(trained, averaged):\n"
         "            p -= lr * g\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.grad_local"]},
    {"name": "the gradients zeroed (set_to_none=False) after the update",
     "replace": _edit("dp_train_step", ("    model.zero_grad()\n", ""),
                      ("    return loss.item()",
                       "    model.zero_grad(set_to_none=False)\n    return loss.item()")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.grad_cleared_after"]},
    {"name": "every parameter's gradient all-reduced, a frozen one's None too",
     "replace": _edit("dp_train_step", (
         "    trained = [p for p in model.parameters() if p.grad is not None]\n",
         "    trained = list(model.parameters())\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.frozen_parameter"]},
    {"name": "a frozen parameter's gradient sent as zeros with the others",
     "replace": _edit("dp_train_step", (
         "    trained = [p for p in model.parameters() if p.grad is not None]\n",
         "    for p in model.parameters():\n"
         "        if p.grad is None:\n"
         "            p.grad = torch.zeros_like(p)\n"
         "    trained = list(model.parameters())\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["dp.frozen_sent"]},
    {"name": "the library's DataParallel used inside dp_train_step (switched off while graded)",
     "replace": _edit("dp_train_step", (
         "    world = dist.get_world_size()\n",
         "    world = dist.get_world_size()\n    dl.dp.DataParallel(model)\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["switched off"]},
    # -- 4 allreduce_gradients_flat -------------------------------------------------------------
    {"name": "one all-reduce per parameter where one flat all-reduce is asked",
     "replace": _edit("allreduce_gradients_flat", (
         "flat = torch.cat([p.grad.reshape(-1) for p in params])\n"
         "    dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n",
         "for p in params:\n"
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n"
         "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["one per parameter tensor"]},
    {"name": "flat buffer averaged but never copied back into p.grad",
     "replace": _edit("allreduce_gradients_flat", (
         "p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))",
         "flat[offset:offset + p.numel()].view_as(p.grad)")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"],
     "visible_says": ["stayed in the flat buffer", "dp.flat_not_back"]},
    {"name": "vector_to_parameters: the averaged gradients written into the weights",
     "replace": _edit("allreduce_gradients_flat", (
         "    offset = 0\n"
         "    for p in params:\n"
         "        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))\n"
         "        offset += p.numel()\n",
         "    torch.nn.utils.vector_to_parameters(flat, params)\n")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.flat_not_back"]},
    {"name": "the flat sum divided by 2, right on 2 ranks only",
     "replace": _edit("allreduce_gradients_flat", ("flat /= dist.get_world_size()",
                                                   "flat /= 2")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.fixed_divisor"]},
    {"name": "the gradients copied into a buffer of the notebook's N_NUMEL numbers",
     "replace": _edit("allreduce_gradients_flat", (
         "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n",
         "    flat = torch.empty(N_NUMEL, dtype=params[0].grad.dtype, device=params[0].grad.device)\n"
         "    flat.copy_(torch.cat([p.grad.reshape(-1) for p in params]))\n")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.flat_fixed_size"]},
    {"name": "the flat buffer sized by the notebook's N_NUMEL, not by the model handed in",
     "replace": _edit("allreduce_gradients_flat", (
         "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n",
         "    flat = torch.zeros(N_NUMEL, dtype=params[0].grad.dtype, device=params[0].grad.device)\n"
         "    offset = 0\n"
         "    for p in params:\n"
         "        flat[offset:offset + p.numel()] = p.grad.reshape(-1)\n"
         "        offset += p.numel()\n")),
     "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"],
     "visible_says": ["bytes of padding", "dp.flat_fixed_size"]},
    {"name": "right another way: the last parameter first, p.grad made a view of the buffer",
     "replace": _edit("allreduce_gradients_flat", (
         "params = [p for p in model.parameters() if p.grad is not None]",
         "params = [p for p in model.parameters() if p.grad is not None][::-1]"), (
         "        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))\n",
         "        p.grad = flat[offset:offset + p.numel()].view_as(p)\n")),
     "loses": []},
    # -- 5 OverlappingDP ------------------------------------------------------------------------
    {"name": "bucket ready once each .grad exists: zeroed gradients send every bucket at once",
     "replace": READY_BY_EXISTING_GRAD, "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.ready_by_hooks"]},
    {"name": "a bucket sent when the hook of its last-listed parameter fires (no counting)",
     "replace": _edit("overlapping_dp", (
         "        self.pending[self.bucket_of[i]] -= 1\n",
         "        b = self.bucket_of[i]\n"
         "        if i == self.buckets[b][-1]:\n"
         "            self.pending[b] = 0\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.buckets_incomplete"]},
    {"name": "hooks on every parameter of the model, a frozen one too",
     "replace": _edit("overlapping_dp", ("        for i, p in enumerate(self.params):\n",
                                         "        for i, p in enumerate(self.model.parameters()):\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.frozen_parameter"]},
    {"name": "OverlappingDP: the bucket's sum divided by 2, the visible check's first world size",
     "replace": _edit("overlapping_dp", ("flat = self.flat[b] / self.world",
                                         "flat = self.flat[b] / 2")),
     "loses": ["overlapping_dp_tests"], "visible": ["overlapping_dp_tests"],
     "visible_says": ["on 4 ranks"]},
    {"name": "sync after backward (in finish) instead of from the gradient hooks",
     "replace": _edit("overlapping_dp",
                      ("while self.next < len(self.buckets) and self.pending[self.next] == 0:",
                       "while False:"),
                      ("        for b, members in enumerate(self.buckets):\n"
                       "            self.work[b].wait()\n",
                       "        for b, members in enumerate(self.buckets):\n"
                       "            self.flat[b] = torch.cat([self.params[j].grad.reshape(-1)"
                       " for j in members])\n"
                       "            dist.all_reduce(self.flat[b], op=dist.ReduceOp.SUM)\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"],
     "visible_says": ["launch the gradient communication from gradient hooks"]},
    {"name": "every bucket launched at the end of backward, from the last gradient hook",
     "replace": _edit("overlapping_dp", (
         "while self.next < len(self.buckets) and self.pending[self.next] == 0:",
         "while self.next < len(self.buckets) and sum(self.pending) == 0:")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["none of them overlapped backward"]},
    {"name": "a blocking all-reduce in the hook: issued during backward, backward waits for it",
     "replace": _edit("overlapping_dp",
                      ("self.work[b] = dist.all_reduce(self.flat[b], op=dist.ReduceOp.SUM, "
                       "async_op=True)",
                       "dist.all_reduce(self.flat[b], op=dist.ReduceOp.SUM)"),
                      ("            self.work[b].wait()\n", "")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["as blocking calls"]},
    {"name": "an async all-reduce in the hook, waited for right there (the learner pass's)",
     "replace": _edit("overlapping_dp",
                      ("self.work[b] = dist.all_reduce(self.flat[b], op=dist.ReduceOp.SUM, "
                       "async_op=True)",
                       "self.work[b] = dist.all_reduce(self.flat[b], op=dist.ReduceOp.SUM, "
                       "async_op=True)\n            self.work[b].wait()")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"],
     "visible_says": ["each was waited for before backward computed another gradient"]},
    {"name": "each bucket launched as soon as it is complete, ahead of the plan's order",
     "replace": _edit("overlapping_dp",
                      ("        while self.next < len(self.buckets) and self.pending[self.next] == 0:\n"
                       "            b = self.next\n",
                       "        b = self.bucket_of[i]\n"
                       "        if self.pending[b] == 0:\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.bucket_order"]},
    {"name": "bucket plan ignored: one all-reduce per parameter from the hooks",
     "replace": _edit("overlapping_dp", (
         "self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}",
         "self.buckets = [[i] for i in reversed(range(len(self.params)))]\n"
         "        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}"
     )),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["one per parameter tensor"]},
    {"name": "finish() keeps every step's buckets in a list (memory grows with the steps)",
     "replace": _edit("overlapping_dp", (
         "                offset += p.numel()\n        self._reset()\n",
         "                offset += p.numel()\n"
         "        self.done = getattr(self, \"done\", []) + self.flat\n        self._reset()\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.finish_leaks"]},
    {"name": "finish() leaves the arrival counts and the next bucket of the last step",
     "replace": _edit("overlapping_dp", (
         "                offset += p.numel()\n        self._reset()\n",
         "                offset += p.numel()\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.finish_resets"]},
    {"name": "hooks registered with a late-binding lambda: every hook reports the last index",
     "replace": _edit("overlapping_dp", (
         "lambda _p, i=i: self._grad_ready(i)", "lambda _p: self._grad_ready(i)")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["has no attribute 'wait'"]},
    {"name": "late-binding hooks, and a finish() that skips the buckets never launched",
     "replace": _edit("overlapping_dp", (
         "lambda _p, i=i: self._grad_ready(i)", "lambda _p: self._grad_ready(i)"), (
         "            self.work[b].wait()\n",
         "            if self.work[b] is None:\n                continue\n"
         "            self.work[b].wait()\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.buckets_incomplete"]},
    {"name": "finish() reads the buckets without waiting for their all-reduces",
     "replace": _edit("overlapping_dp", ("            self.work[b].wait()\n", "")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["check.unwaited"]},
    {"name": "finish() divides each bucket in place before waiting on it (the learner pass's)",
     "replace": _edit("overlapping_dp", (
         "            self.work[b].wait()\n"
         "            flat = self.flat[b] / self.world\n",
         "            self.flat[b] /= self.world\n"
         "            self.work[b].wait()\n"
         "            flat = self.flat[b]\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["check.written_in_flight"]},
    {"name": "finish() waits on the last bucket's handle only (sixth pass)",
     "replace": _edit("overlapping_dp", ("            self.work[b].wait()\n", ""), (
         "        for b, members in enumerate(self.buckets):\n",
         "        self.work[-1].wait()\n"
         "        for b, members in enumerate(self.buckets):\n")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["check.unwaited"]},
    {"name": "the hooks registered on the tensor (register_hook), before p.grad is written",
     "replace": _edit("overlapping_dp", (
         "p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_ready(i))",
         "p.register_hook(lambda _g, i=i: self._grad_ready(i))")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.hook_before_grad"]},
    {"name": "finish() forgets to divide the bucket sums by the world size",
     "replace": _edit("overlapping_dp", ("flat = self.flat[b] / self.world", "flat = self.flat[b]")),
     "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["every element is 2x the reference"]},
    # -- 6 accumulation_step --------------------------------------------------------------------
    {"name": "communication on every accumulation step (a sync after each micro-batch)",
     "replace": _edit("accumulation_step", (
         "        last = k == n_micro - 1\n"
         "        with contextlib.nullcontext() if last else model.no_sync():\n"
         "            (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()\n",
         "        (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()\n"
         "        model.finish_gradient_sync()\n")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_every_backward"]},
    {"name": "finish_gradient_sync never called: the step uses each rank's own gradient",
     "replace": _edit("accumulation_step", ("    model.finish_gradient_sync()\n", "")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_not_finished"],
     "visible_never_says": ["dp.accumulation_every_backward"]},
    {"name": "no_sync forgotten: every micro-batch's backward sends its buckets",
     "replace": _edit("accumulation_step", (
         "with contextlib.nullcontext() if last else model.no_sync():",
         "with contextlib.nullcontext():")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"],
     "visible_says": ["sent but never averaged", "dp.accumulation_every_backward"]},
    {"name": "the first backward sends, the later ones run inside no_sync",
     "replace": _edit("accumulation_step", ("last = k == n_micro - 1", "last = k == 0")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_sent_early"]},
    {"name": "every backward inside no_sync: nothing is ever sent",
     "replace": _edit("accumulation_step", (
         "with contextlib.nullcontext() if last else model.no_sync():", "with model.no_sync():")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_never_sent"]},
    {"name": "the micro-batches' losses divided by a fixed 4 (right with 4 micro-batches)",
     "replace": _edit("accumulation_step", ("(F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()",
                                            "(F.mse_loss(model(xs[k]), ys[k]) / 4).backward()")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_fixed_divisor"]},
    {"name": "accumulation: gradients cleared at the end of the step, after the update",
     "replace": _edit("accumulation_step", ("    model.zero_grad()\n", ""), (
         "    sgd_step(model, lr)\n", "    sgd_step(model, lr)\n    model.zero_grad()\n")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.grads_cleared_at_end"]},
    {"name": "gradients never zeroed: step 2 adds to step 1's gradient",
     "replace": _edit("accumulation_step", ("    model.zero_grad()\n", "")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_carry_over"]},
    {"name": "right another way: full losses, the averaged sum divided by n_micro after sync",
     "replace": _edit("accumulation_step", (
         "(F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()",
         "F.mse_loss(model(xs[k]), ys[k]).backward()"), (
         "    model.finish_gradient_sync()\n",
         "    model.finish_gradient_sync()\n"
         "    with torch.no_grad():\n"
         "        for p in model.parameters():\n"
         "            p.grad /= n_micro\n")),
     "loses": []},
    {"name": "chunks of n_micro rows instead of n_micro chunks (the same at 16 rows, 4)",
     "replace": _edit("accumulation_step", (
         "xs, ys = x.chunk(n_micro), y.chunk(n_micro)",
         "xs, ys = x.split(n_micro), y.split(n_micro)")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"]},
    {"name": "the sum over the ranks divided twice: gradients and loss both divided by N",
     "replace": _edit("dp_train_step", (
         "    loss.backward()\n",
         "    (loss / world).backward()\n")),
     "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["every element is 1/3 of the reference"]},
    {"name": "the forward outside no_sync, only the backward inside (torch's DDP then sends)",
     "replace": _edit("accumulation_step", (
         "        with contextlib.nullcontext() if last else model.no_sync():\n"
         "            (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()",
         "        loss = F.mse_loss(model(xs[k]), ys[k]) / n_micro\n"
         "        with contextlib.nullcontext() if last else model.no_sync():\n"
         "            loss.backward()")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["dp.accumulation_every_backward"]},
    {"name": "micro-batch losses not divided by the number of micro-batches",
     "replace": _edit("accumulation_step", (
         "(F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()",
         "F.mse_loss(model(xs[k]), ys[k]).backward()")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"], "visible_says": ["every element is 4x the reference"]},
    {"name": "one backward over the micro-batches' summed losses (every activation kept)",
     "replace": _edit("accumulation_step", (
         "    for k in range(n_micro):\n"
         "        last = k == n_micro - 1\n"
         "        with contextlib.nullcontext() if last else model.no_sync():\n"
         "            (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()\n",
         "    loss = sum(F.mse_loss(model(xs[k]), ys[k]) for k in range(n_micro)) / n_micro\n"
         "    loss.backward()\n")),
     "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"],
     "visible_says": ["dp.accumulation_one_backward"],
     "visible_never_says": ["dp.accumulation_every_backward"]},
    {"name": "prediction: one all-reduce per bucket and micro-batch",
     "replace": _edit("no_sync_prediction", ("predicted_all_reduces = [2, 2, 2]",
                                             "predicted_all_reduces = [2, 4, 8]")),
     "loses": ["no_sync_prediction_tests"]},
    # -- 7 the learning-rate experiment ---------------------------------------------------------
    {"name": "a bigger batch with the same learning rate trains the same",
     "replace": _edit("lr_answer", ('lr_answer = "c"', 'lr_answer = "a"')),
     "loses": ["lr_answer_tests"]},
    # -- 8 ZeRO-1 -------------------------------------------------------------------------------
    {"name": "ZeRO-1 with a full all-reduce instead of a reduce-scatter",
     "replace": _edit("sharded_momentum_sgd", (
         "        dist.reduce_scatter_single(grad_shard, self.flat([p.grad for p in self.params]),\n"
         "                                   op=dist.ReduceOp.SUM)\n",
         "        grads = self.flat([p.grad for p in self.params])\n"
         "        dist.all_reduce(grads, op=dist.ReduceOp.SUM)\n"
         "        grad_shard.copy_(grads[self.lo:self.lo + self.shard_size])\n")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"],
     "visible_says": ["over the budget of a ring all-reduce", "dp.zero1_budget"]},
    {"name": "ZeRO-1 without the all-gather: each rank only has its own shard updated",
     "replace": _edit("sharded_momentum_sgd", (
         "dist.all_gather_single(weights, shard)",
         "weights[self.lo:self.lo + self.shard_size] = shard")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"],
     "visible_says": ["not only of its own", "dp.zero1_shards_spread"],
     "visible_never_says": ["broadcast from rank 0 missing", "replicas_differ"]},
    {"name": "ZeRO-1 reduce-scatter sum not divided by the world size",
     "replace": _edit("sharded_momentum_sgd", ("        grad_shard /= self.world\n", "")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["every element is 3x the reference"]},
    {"name": "ZeRO-1 momentum made afresh in every step (no state carried over)",
     "replace": _edit("sharded_momentum_sgd", (
         "self.momentum.mul_(self.mu).add_(grad_shard)",
         "momentum = torch.zeros_like(self.momentum).mul_(self.mu).add_(grad_shard)"), (
         "- self.lr * self.momentum", "- self.lr * momentum")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_state"],
     "visible_never_says": ["scale.zero"]},
    {"name": "ZeRO-1 weights split back without dropping the padding (right when N divides)",
     "replace": _edit("sharded_momentum_sgd", (
         "        offset = 0\n"
         "        for p in self.params:\n"
         "            p.copy_(weights[offset:offset + p.numel()].view_as(p))\n"
         "            offset += p.numel()\n",
         "        for p, w in zip(self.params, weights.split([p.numel() for p in self.params])):\n"
         "            p.copy_(w.view_as(p))\n")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_padding"]},
    {"name": "right another way: gradients divided before the reduce-scatter, split views",
     "replace": _edit("sharded_momentum_sgd", (
         "self.flat([p.grad for p in self.params]),",
         "self.flat([p.grad for p in self.params]) / self.world,"),
         ("        grad_shard /= self.world\n", ""), (
         "        offset = 0\n"
         "        for p in self.params:\n"
         "            p.copy_(weights[offset:offset + p.numel()].view_as(p))\n"
         "            offset += p.numel()\n",
         "        for p, w in zip(self.params,\n"
         "                        weights[:self.numel].split([p.numel() for p in self.params])):\n"
         "            p.copy_(w.view_as(p))\n")),
     "loses": []},
    {"name": "right another way: each shard broadcast by its owner instead of one all-gather",
     "replace": _edit("sharded_momentum_sgd", (
         "        dist.all_gather_single(weights, shard)\n",
         "        weights[self.lo:self.lo + self.shard_size] = shard\n"
         "        for r in range(self.world):\n"
         "            dist.broadcast(weights[r * self.shard_size:(r + 1) * self.shard_size], "
         "src=r)\n")),
     "loses": []},
    {"name": "ZeRO-1 with a full-size momentum kept on every rank, self.momentum a view of it",
     "replace": FULL_MOMENTUM_KEPT, "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_memory"]},
    {"name": "ZeRO-1: the gradient shard divided by 3, right on 3 ranks only (sixth pass)",
     "replace": _edit("sharded_momentum_sgd", ("        grad_shard /= self.world\n",
                                               "        grad_shard /= 3\n")),
     "loses": ["sharded_momentum_sgd_tests"], "visible": ["sharded_momentum_sgd_tests"]},
    {"name": "ZeRO-1 momentum as a moving average: buf = mu * buf + (1 - mu) * g",
     "replace": _edit("sharded_momentum_sgd", (
         "self.momentum.mul_(self.mu).add_(grad_shard)",
         "self.momentum.mul_(self.mu).add_((1 - self.mu) * grad_shard)")),
     "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_dampening"]},
    # -- 9 recall -------------------------------------------------------------------------------
    {"name": "recall: every answer a real misconception",
     "replace": {**_edit("recall_1", ('answer_1 = "b"', 'answer_1 = "a"')),
                 **_edit("recall_2", ('answer_2 = "a"', 'answer_2 = "b"')),
                 **_edit("recall_3", ('answer_3 = "d"', 'answer_3 = "b"')),
                 **_edit("recall_4", ("answer_4 = 14.0", "answer_4 = 16.0")),
                 **_edit("recall_5", ('answer_5 = "b"', 'answer_5 = "d"'))},
     "loses": RECALL_TESTS},
    {"name": "recall Q3: FSDP's 1/16 split taken to keep both ends",
     "replace": _edit("recall_3", ('answer_3 = "d"', 'answer_3 = "c"')),
     "loses": ["recall_3_tests"]},
    {"name": "recall Q5: a penalty on every rank taken for one counted 4 times",
     "replace": _edit("recall_5", ('answer_5 = "b"', 'answer_5 = "c"')),
     "loses": ["recall_5_tests"]},
    # -- switching the grader off (integrity.py): no communication at all, and three lines
    # that make every check a do-nothing function. The scan zeroes every graded cell.
    {"name": "no all-reduce, and the checks replaced by do-nothing functions",
     "replace": _edit("dp_train_step", (
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n",
         "        pass\n"), (
         "    return loss.item()\n",
         "    return loss.item()\n\n\n"
         "_pass = lambda *args, **kwargs: None\n"
         "vars(dl.check).update(compare=_pass, same_on_all_ranks=_pass, comm=_pass,\n"
         "                      close=_pass, against_reference=_pass)\n")),
     "loses": ALL_GRADED},
    # the fifth learner pass's
    {"name": "ZeRO-1: the caller's gradients divided in place",
     "replace": ZERO1_GRADS_DIVIDED_IN_PLACE, "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_grad_in_place"]},
    {"name": "overlap: the hooks numbered over model.parameters(), frozen ones included",
     "replace": OVERLAP_NUMBERED_BY_MODEL_PARAMETERS, "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.frozen_numbering"]},
    {"name": "overlap: a held-back bucket sent only by finish(), after backward",
     "replace": OVERLAP_HELD_BUCKETS_SENT_BY_FINISH, "loses": ["overlapping_dp_tests"],
     "visible": ["overlapping_dp_tests"], "visible_says": ["dp.buckets_held_back"]},
    {"name": "flat: the frozen parameters sent as zeros",
     "replace": FLAT_FROZEN_SENT_AS_ZEROS, "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.flat_frozen_sent"]},
    {"name": "flat: the buffer made without the gradients' dtype (float32)",
     "replace": FLAT_BUFFER_FLOAT32, "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.flat_dtype"]},
    {"name": "shard_batch: a ValueError with no message",
     "replace": SHARD_REFUSED_WITHOUT_A_WORD, "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"]},
    {"name": "accumulation: the update before finish_gradient_sync()",
     "replace": ACCUMULATION_UPDATE_BEFORE_SYNC, "loses": ["accumulation_step_tests"],
     "visible": ["accumulation_step_tests"],
     "visible_says": ["dp.accumulation_update_before_sync"]},
    {"name": "ZeRO-1: the momentum of the sum over the ranks, divided in the update",
     "replace": ZERO1_MOMENTUM_OF_THE_SUM, "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"], "visible_says": ["dp.zero1_momentum_of_the_sum"]},
    {"name": "shard_batch: the size taken from the notebook's BATCH",
     "replace": SHARD_BY_THE_NOTEBOOKS_BATCH, "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["dp.shard_other_size"]},
    {"name": "dp_train_step: async all-reduces never waited on",
     "replace": DP_STEP_NEVER_WAITED, "loses": ["dp_train_step_tests"],
     "visible": ["dp_train_step_tests"], "visible_says": ["check.unwaited"]},
    {"name": "flat: the async all-reduce never waited on",
     "replace": FLAT_NEVER_WAITED, "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["check.unwaited"]},
    {"name": "shard_batch: the last dimension judged, not the rows (seventh pass)",
     "replace": SHARD_BY_THE_LAST_DIMENSION, "loses": ["shard_batch_tests"],
     "visible": ["shard_batch_tests"], "visible_says": ["dp.shard_other_size"]},
    {"name": "broadcast: one flat float32 buffer for float64 weights (seventh pass)",
     "replace": BROADCAST_THROUGH_FLOAT32, "loses": ["broadcast_tests"],
     "visible": ["broadcast_tests"], "visible_says": ["dp.broadcast_dtype"]},
    {"name": "flat: the buffer always float64, whatever the gradients' dtype (seventh pass)",
     "replace": FLAT_ALWAYS_FLOAT64, "loses": ["allreduce_gradients_flat_tests"],
     "visible": ["allreduce_gradients_flat_tests"], "visible_says": ["dp.flat_dtype_fixed"]},
    {"name": "ZeRO-1: the momentum fixed at 0.9 (seventh pass)",
     "replace": ZERO1_MOMENTUM_FIXED, "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"]},
    {"name": "ZeRO-1: the learning rate fixed at 0.1 (seventh pass)",
     "replace": ZERO1_LR_FIXED, "loses": ["sharded_momentum_sgd_tests"],
     "visible": ["sharded_momentum_sgd_tests"]},
    {"name": "shard_batch: evenness judged against the notebook's DP_SIZE (eighth pass)",
     "replace": _edit("shard_batch", ("    if n % world_size:\n", "    if n % DP_SIZE:\n")),
     "loses": ["shard_batch_tests"], "visible": ["shard_batch_tests"],
     "visible_says": ["a batch of 8 does not split evenly over 3 ranks"]},
    {"name": "shard_batch: a remainder of one row let through (eighth pass)",
     "replace": _edit("shard_batch", ("    if n % world_size:\n", "    if n % world_size > 1:\n")),
     "loses": ["shard_batch_tests"], "visible": ["shard_batch_tests"],
     "visible_says": ["a batch of 9 does not split evenly over 4 ranks"]},
    {"name": "broadcast_parameters: the broadcasts recorded by autograd (eighth pass)",
     "replace": _edit("broadcast_parameters", ("    with torch.no_grad():\n"
                                               "        for p in model.parameters():\n"
                                               "            dist.broadcast(p, src=src)\n",
                                               "    for p in model.parameters():\n"
                                               "        dist.broadcast(p, src=src)\n")),
     "loses": ["broadcast_tests"], "visible": ["broadcast_tests"],
     "visible_says": ["dp.broadcast_recorded"]},
    {"name": "accumulation_step: the micro-batches cut to the notebook's shard size (eighth pass)",
     "replace": _edit("accumulation_step", (
         "    xs, ys = x.chunk(n_micro), y.chunk(n_micro)\n",
         "    size = BATCH // DP_SIZE // n_micro\n"
         "    xs = [x[k * size:(k + 1) * size] for k in range(n_micro)]\n"
         "    ys = [y[k * size:(k + 1) * size] for k in range(n_micro)]\n")),
     "loses": ["accumulation_step_tests"], "visible": ["accumulation_step_tests"],
     "visible_says": ["dp.accumulation_fixed_size"]},
    {"name": "flat: the offsets counted over the frozen parameters too (ninth pass)",
     "replace": _edit("allreduce_gradients_flat", (
         "    for p in params:\n"
         "        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))\n",
         "    for p in model.parameters():\n"
         "        if p.grad is not None:\n"
         "            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))\n")),
     "loses": ["allreduce_gradients_flat_tests"], "visible": ["allreduce_gradients_flat_tests"],
     "visible_says": ["dp.flat_offset_frozen"]},
    {"name": "overlap: one bucket sent a hook ('if', not 'while'), none by finish() (ninth pass)",
     "replace": _edit("overlapping_dp", ("        while self.next < len(self.buckets)",
                                         "        if self.next < len(self.buckets)")),
     "loses": ["overlapping_dp_tests"], "visible": ["overlapping_dp_tests"],
     "visible_says": ["dp.buckets_left_behind"]},
]
