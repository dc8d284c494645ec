"""Broken variants of 02_data_parallel: classic mistakes the grader must catch.

Each variant is the solution cell with one mistake written in, made here as an exact edit of the
solution notebook's own source, so the variants follow the notebook as it changes. An edit that
no longer matches the notebook is an error when this module is imported, never a variant that
silently tests nothing. `loses` lists exactly the graded cells that must score zero.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("02_data_parallel")


RECALL_TESTS = [f"recall_{i}_tests" for i in range(1, 6)]
ALL_GRADED = ["shard_batch_tests", "broadcast_tests", "dp_train_step_tests",
              "allreduce_gradients_flat_tests", "overlapping_dp_tests",
              "accumulation_step_tests", "lr_answer_tests", "sharded_momentum_sgd_tests",
              *RECALL_TESTS]

VARIANTS = [
    # -- 1 shard_batch --------------------------------------------------------------------------
    {"name": "every rank takes the first slice of the batch",
     "replace": _edit("shard_batch", ("return batch[rank * per_rank:(rank + 1) * per_rank]",
                                      "return batch[:per_rank]")),
     "loses": ["shard_batch_tests"]},
    {"name": "a batch that does not split evenly is not refused",
     "replace": _edit("shard_batch", ("if n % world_size:", "if n < world_size:")),
     "loses": ["shard_batch_tests"]},
    # -- 2 broadcast_parameters -----------------------------------------------------------------
    {"name": "no broadcast at start: replicas keep their own initialisation",
     "replace": _edit("broadcast_parameters", ("dist.broadcast(p, src=src)", "pass")),
     "loses": ["broadcast_tests"]},
    {"name": "weights averaged over the ranks instead of broadcast from rank 0",
     "replace": _edit("broadcast_parameters", (
         "dist.broadcast(p, src=src)",
         "dist.all_reduce(p, op=dist.ReduceOp.SUM)\n            p /= dist.get_world_size()")),
     "loses": ["broadcast_tests"]},
    # -- 3 dp_train_step ------------------------------------------------------------------------
    {"name": "sum of the gradients not divided by dp_size",
     "replace": _edit("dp_train_step", ("        p.grad /= world\n", "")),
     "loses": ["dp_train_step_tests"]},
    {"name": "no all-reduce: every rank steps with its local gradient",
     "replace": _edit("dp_train_step", (
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n", "")),
     "loses": ["dp_train_step_tests"]},
    # -- 4 allreduce_gradients_flat ---------------------------------------------------------------
    {"name": "one all-reduce per parameter where one flat all-reduce is asked",
     "replace": _edit("allreduce_gradients_flat", (
         "flat = torch.cat([p.grad.reshape(-1) for p in params])\n"
         "    dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n",
         "for p in params:\n"
         "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n"
         "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n")),
     "loses": ["allreduce_gradients_flat_tests"]},
    {"name": "flat buffer averaged but never copied back into p.grad",
     "replace": _edit("allreduce_gradients_flat", (
         "p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))",
         "flat[offset:offset + p.numel()].view_as(p.grad)")),
     "loses": ["allreduce_gradients_flat_tests"]},
    # -- 5 OverlappingDP ------------------------------------------------------------------------
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
     "loses": ["overlapping_dp_tests"]},
    {"name": "bucket plan ignored: one all-reduce per parameter from the hooks",
     "replace": _edit("overlapping_dp", (
         "self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}",
         "self.buckets = [[i] for i in reversed(range(len(self.params)))]\n"
         "        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}"
     )),
     "loses": ["overlapping_dp_tests"]},
    {"name": "finish() forgets to divide the bucket sums by the world size",
     "replace": _edit("overlapping_dp", ("flat = self.flat[b] / self.world", "flat = self.flat[b]")),
     "loses": ["overlapping_dp_tests"]},
    # -- 6 accumulation_step --------------------------------------------------------------------
    {"name": "communication on every accumulation step (a sync after each micro-batch)",
     "replace": _edit("accumulation_step", (
         "        last = k == n_micro - 1\n"
         "        with contextlib.nullcontext() if last else model.no_sync():\n"
         "            (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()\n",
         "        (F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()\n"
         "        model.finish_gradient_sync()\n")),
     "loses": ["accumulation_step_tests"]},
    {"name": "no_sync forgotten: every micro-batch's backward sends its buckets",
     "replace": _edit("accumulation_step", (
         "with contextlib.nullcontext() if last else model.no_sync():",
         "with contextlib.nullcontext():")),
     "loses": ["accumulation_step_tests"]},
    {"name": "micro-batch losses not divided by the number of micro-batches",
     "replace": _edit("accumulation_step", (
         "(F.mse_loss(model(xs[k]), ys[k]) / n_micro).backward()",
         "F.mse_loss(model(xs[k]), ys[k]).backward()")),
     "loses": ["accumulation_step_tests"]},
    # -- 7 the learning-rate experiment -----------------------------------------------------------
    {"name": "a bigger batch with the same learning rate trains the same",
     "replace": _edit("lr_answer", ('lr_answer = "b"', 'lr_answer = "a"')),
     "loses": ["lr_answer_tests"]},
    # -- 8 ZeRO-1 -------------------------------------------------------------------------------
    {"name": "ZeRO-1 with a full all-reduce instead of a reduce-scatter",
     "replace": _edit("sharded_momentum_sgd", (
         "        dist.reduce_scatter_single(grad_shard, self.flat([p.grad for p in self.params]),\n"
         "                                   op=dist.ReduceOp.SUM)\n",
         "        grads = self.flat([p.grad for p in self.params])\n"
         "        dist.all_reduce(grads, op=dist.ReduceOp.SUM)\n"
         "        grad_shard.copy_(grads[self.lo:self.lo + self.shard_size])\n")),
     "loses": ["sharded_momentum_sgd_tests"]},
    {"name": "ZeRO-1 without the all-gather: each rank only has its own shard updated",
     "replace": _edit("sharded_momentum_sgd", (
         "dist.all_gather_single(weights, shard)",
         "weights[self.lo:self.lo + self.shard_size] = shard")),
     "loses": ["sharded_momentum_sgd_tests"]},
    # -- 9 recall -------------------------------------------------------------------------------
    {"name": "recall: every answer wrong",
     "replace": _edit("recall_answers",
                      ('answer_1 = "b"', 'answer_1 = "a"'), ("answer_2 = False", "answer_2 = True"),
                      ("answer_3 = False", "answer_3 = True"), ("answer_4 = 6.0", "answer_4 = 4.0"),
                      ("answer_5 = 2", "answer_5 = 8")),
     "loses": RECALL_TESTS},
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
]
