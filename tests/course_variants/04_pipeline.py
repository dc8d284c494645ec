"""Wrong answers to 04_pipeline, and the graded cells each must lose (all others keep points).

Most variants are the solution cell with one mistake written in, as an exact edit of the
solution notebook's own source, so they follow the notebook as it changes; an edit that no
longer matches is an error when this module is imported, never a variant that tests nothing.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("04_pipeline")


# -- Exercise 1: the naive pipeline by hand --------------------------------------------------

FORGETS_REQUIRES_GRAD = _edit("naive", ("        inp.requires_grad_()\n", ""))

PASSES_THE_RECEIVED_GRADIENT_ON = _edit(
    "naive",
    ("        out.backward(grad)\n    if rank > 0:\n        dist.send(inp.grad, dst=rank - 1)",
     "        out.backward(grad)\n    if rank > 0:\n"
     "        dist.send(inp.grad if rank == p - 1 else grad, dst=rank - 1)"))

BROADCASTS_THE_LOSS = _edit(
    "naive",
    ("        dist.send(inp.grad, dst=rank - 1)\n",
     "        dist.send(inp.grad, dst=rank - 1)\n"
     "    value = torch.tensor([loss.item() if loss is not None else 0.0], dtype=torch.float64,\n"
     "                         device=dev)\n"
     "    dist.broadcast(value, src=p - 1)     # every rank wants to print the loss\n"))

# -- Exercise 2: schedule tables ------------------------------------------------------------

GPIPE_INTERLEAVED = _edit(
    "gpipe_table",
    ('    row = [f"F{j}" for j in range(m)] + [f"B{j}" for j in range(m)]',
     '    row = [f"{k}{j}" for j in range(m) for k in "FB"]'))

WARMUP_OFF_BY_ONE = _edit("one_f_one_b_table",
                          ("warmup = min(p - s - 1, m)", "warmup = min(p - s, m)"))

WARMUP_NOT_CAPPED_AT_M = _edit("one_f_one_b_table",
                               ("warmup = min(p - s - 1, m)", "warmup = p - s - 1"))

TABLES_FROM_THE_LIBRARY = {
    "gpipe_table": '''
def gpipe_table(p, m):
    """GPipe's table, taken from the library."""
    return [[str(a) for a in row] for row in dl.pp.make_schedule("gpipe", p, m).actions]
''',
    "one_f_one_b_table": '''
def one_f_one_b_table(p, m):
    """1F1B's table, taken from the library."""
    return [[str(a) for a in row] for row in dl.pp.one_f_one_b(p, m).actions]
'''}

# -- Exercise 3: the runner -----------------------------------------------------------------

LOSS_NOT_DIVIDED_BY_M = _edit("runner", ("                out = loss / m\n",
                                         "                out = loss\n"))

BLOCKING_SENDS = _edit(
    "runner",
    ("                sent = stage.send_activation(out, j)",
     "                dist.send(out.detach(), dst=stage.next_rank, tag=j)"),
    ("                pending = stage.send_grad(inp.grad, j)",
     "                dist.send(inp.grad, dst=stage.prev_rank, tag=j)"))

IGNORES_THE_ROW_ORDER = _edit(
    "runner",
    ("    for action in actions:\n",
     "    gpipe_order = sorted(actions, key=lambda a: (a[0] == \"B\", int(a[1:])))\n"
     "    for action in gpipe_order:\n"))

ALL_REDUCES_THE_LOSSES = _edit(
    "runner",
    ("    return losses\n",
     "    shared = torch.tensor(losses if losses else [0.0] * m, dtype=torch.float64,\n"
     "                          device=stage.device)\n"
     "    dist.all_reduce(shared)               # so that every stage knows the losses\n"
     "    return losses\n"))

# The micro-batch counted, not read from the action: right on every library row, whose
# forwards and backwards each come in micro-batch order; wrong on a row that takes them in
# another order (seen in the fifth learner pass, left open then)
COUNTS_THE_MICROBATCHES = _edit(
    "runner",
    ("    losses = []\n    for action in actions:\n        kind, j = action[0], int(action[1:])\n",
     "    losses = []\n    n_forward = n_backward = 0\n    for action in actions:\n"
     "        kind = action[0]\n"
     "        if kind == \"F\":\n"
     "            j, n_forward = n_forward, n_forward + 1\n"
     "        else:\n"
     "            j, n_backward = n_backward, n_backward + 1\n"))

# Right numbers and messages; every micro-batch's input and output stay in `kept` to the end:
# GPipe's activation memory under a 1F1B row.
KEEPS_EVERY_MICROBATCH = _edit("runner", ("            inp, out, sent = kept.pop(j)\n",
                                          "            inp, out, sent = kept[j]\n"))

# Right numbers and messages; every send's handle kept to the end, and with it the activation
# it sends (the handle holds a detached view of it): GPipe's memory on the first stages.
KEEPS_EVERY_HANDLE = _edit(
    "runner",
    ("    losses = []\n", "    losses = []\n    handles = []\n"),
    ("                sent = stage.send_activation(out, j)\n",
     "                handles.append(stage.send_activation(out, j))   # all waited at the end\n"),
    ("            if sent is not None:\n"
     "                sent.work.wait()   # delivered: the next stage has sent its gradient back\n",
     ""),
    ("    return losses\n", "    for handle in handles:\n        handle.work.wait()\n    return losses\n"))

RUNNER_FROM_THE_LIBRARY = {"runner": '''
def run_stage(actions, stage, x, y, loss_fn):
    """The library's runner, on the schedule whose row this is."""
    m = len(actions) // 2
    for name in ("1f1b", "gpipe", "naive"):
        schedule = dl.pp.make_schedule(name, stage.n_ranks, m)
        if [str(a) for a in schedule.actions[stage.index]] == list(actions):
            break
    return dl.pp.run_schedule(schedule, stage, x, y, loss_fn=loss_fn).losses
'''}

# -- Exercise 4: activation memory ----------------------------------------------------------

# the forwards before the first backward: the peak on every naive, GPipe and 1F1B row, not on
# a row where a later stretch of forwards holds more
INDEX_OF_THE_FIRST_B = {"peak": '''
def peak_in_flight(row):
    """Most micro-batches whose forward is done and backward not yet, at any point of row."""
    return next(i for i, action in enumerate(row) if action.startswith("B"))
'''}

COUNTS_FORWARDS_ONLY = {"peak": '''
def peak_in_flight(row):
    """Most micro-batches whose forward is done and backward not yet, at any point of row."""
    return sum(1 for action in row if action.startswith("F"))
'''}

COUNT_FROM_THE_LIBRARY = {"peak": '''
def peak_in_flight(row):
    """The library's count, on a one-stage schedule made of this row."""
    return dl.pp.Schedule("row", [row]).peak_in_flight(0)
'''}
# the count the runner's memory check reads, one more than held before a forward at its most
HELD_FROM_THE_LIBRARY = {"peak": '''
def peak_in_flight(row):
    """One more than the library's most held as a forward begins."""
    return max(dl.pp.Schedule("row", [row]).held_before_each_forward(0), default=-1) + 1
'''}

# -- predict, then run: rows of activations held ---------------------------------------------

COUNTS_ARE_BYTES = {"predict": "predict_rows = {4: (16, 16), 16: (64, 16)}"}

# -- Exercise 5: DP x PP --------------------------------------------------------------------

SUM_NOT_AVERAGE = _edit("dp_pp", ("        flat /= grid.dp\n", ""))

DIVIDED_BY_A_HARD_CODED_2 = _edit("dp_pp", ("        flat /= grid.dp\n", "        flat /= 2\n"))
# the learner pass's: the replicas counted as the world over two stages
DIVIDED_BY_WORLD_OVER_2 = _edit("dp_pp", ("        flat /= grid.dp\n",
                                          "        flat /= dist.get_world_size() // 2\n"))

SYNC_EVERY_MICROBATCH = {"dp_pp": '''
def dp_pp_step(grid, module, x, y, m):
    """Right numbers, but the gradients are all-reduced after every micro-batch."""
    stage = dl.pp.Stage(module, grid.pp_group,
                                activation_shape=(x.shape[0] // m, HIDDEN))
    params = [q for q in module.parameters() if q.requires_grad]
    for xj, yj in zip(x.chunk(m), y.chunk(m)):
        before = [torch.zeros_like(q) if q.grad is None else q.grad.clone() for q in params]
        dl.pp.run_schedule("1f1b", stage, xj, yj, n_microbatches=1,
                           loss_fn=lambda out, target: F.mse_loss(out, target) / m)
        new = torch.cat([(q.grad - b).reshape(-1) for q, b in zip(params, before)])
        dist.all_reduce(new, group=grid.dp_group)
        new /= grid.dp
        offset = 0
        for q, b in zip(params, before):
            q.grad.copy_(b + new[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
'''}

ONE_ALL_REDUCE_PER_PARAMETER = {"dp_pp": '''
def dp_pp_step(grid, module, x, y, m):
    """Right numbers, one all-reduce per parameter tensor instead of one flat one."""
    stage = dl.pp.Stage(module, grid.pp_group,
                                activation_shape=(x.shape[0] // m, HIDDEN))
    params = [q for q in module.parameters() if q.requires_grad]

    def average_over_replicas():
        for q in params:
            dist.all_reduce(q.grad, group=grid.dp_group)
            q.grad /= grid.dp

    dl.pp.run_schedule("1f1b", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss,
                       after_last_backward=average_over_replicas)
'''}

# right, written another way: two buckets launched from gradient hooks during the last
# micro-batch's backward (DDP under no_sync, Megatron's overlap_grad_reduce), waited for after it
BUCKETS_DURING_THE_LAST_BACKWARD = {"dp_pp": '''
def dp_pp_step(grid, module, x, y, m):
    stage = dl.pp.Stage(module, grid.pp_group,
                                activation_shape=(x.shape[0] // m, HIDDEN))
    params = [q for q in module.parameters() if q.requires_grad]
    buckets = [params[len(params) // 2:], params[:len(params) // 2]]   # backward's order
    arrived = {id(q): 0 for q in params}
    launched = []

    def ready(q):
        arrived[id(q)] += 1
        for bucket in buckets[len(launched):len(launched) + 1]:
            if all(arrived[id(p)] == m for p in bucket):
                flat = torch.cat([p.grad.reshape(-1) for p in bucket])
                launched.append((bucket, flat,
                                 dist.all_reduce(flat, group=grid.dp_group, async_op=True)))

    hooks = [q.register_post_accumulate_grad_hook(ready) for q in params]

    def finish():
        for bucket, flat, work in launched:
            work.wait()
            flat /= grid.dp
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        for hook in hooks:
            hook.remove()

    dl.pp.run_schedule("1f1b", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss,
                       after_last_backward=finish)
'''}

ALL_REDUCE_OVER_EVERY_RANK = _edit(
    "dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)",
              "        dist.all_reduce(flat)"))

MEAN_OVER_THE_WORLD = _edit("dp_pp", ("        flat /= grid.dp\n",
                                      "        flat /= dist.get_world_size()\n"))

OVER_THE_PIPELINE_GROUP = _edit(
    "dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)",
              "        dist.all_reduce(flat, group=grid.pp_group)"))

REDUCE_THEN_BROADCAST = _edit(
    "dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)",
              "        first = dist.get_global_rank(grid.dp_group, 0)\n"
              "        dist.reduce(flat, dst=first, group=grid.dp_group)\n"
              "        dist.broadcast(flat, src=first, group=grid.dp_group)"))

LOSS_AVERAGED_OVER_THE_WORLD_TOO = _edit(
    "dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)",
              "        dist.all_reduce(flat, group=grid.dp_group)\n"
              "        dist.all_reduce(torch.zeros(1, dtype=flat.dtype, device=flat.device))"))

NO_SYNC = _edit("dp_pp", ("    dl.pp.run_schedule(\"1f1b\", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss,\n"
                          "                       after_last_backward=average_over_replicas)",
                          "    dl.pp.run_schedule(\"1f1b\", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss)"))

# a good-faith learner's exchange of the weights only ("biases are small"): the biases keep each
# replica's own gradient (issue 39: it got the comparison's numbers and no word)
WEIGHTS_ONLY = _edit("dp_pp", ("params = [q for q in module.parameters() if q.requires_grad]",
                               "params = [q for q in module.parameters() if q.requires_grad "
                               "and q.dim() > 1]"))

# right, written another way: the exchange once run_schedule has returned (every send delivered)
SYNC_AFTER_THE_RUNNER_RETURNS = _edit(
    "dp_pp", ("    dl.pp.run_schedule(\"1f1b\", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss,\n"
              "                       after_last_backward=average_over_replicas)",
              "    dl.pp.run_schedule(\"1f1b\", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss)\n"
              "    average_over_replicas()"))

DATAPARALLEL_FROM_THE_LIBRARY = {"dp_pp": '''
def dp_pp_step(grid, module, x, y, m):
    """The library's DataParallel (no overlap: one sync when asked) around the stage."""
    replica = dl.dp.DataParallel(module, group=grid.dp_group, bucket_mb=1e6, overlap=False)
    stage = dl.pp.Stage(replica, grid.pp_group,
                                activation_shape=(x.shape[0] // m, HIDDEN))
    dl.pp.run_schedule("1f1b", stage, x, y, n_microbatches=m, loss_fn=F.mse_loss,
                       after_last_backward=replica.finish_gradient_sync)
'''}

# a learner's runner that reports the loss it backpropagates (divided by m), on 2 ranks with
# m = 4: the hint must not blame 4 ranks
LOSS_REPORTED_SCALED = _edit("runner", ("                losses.append(loss.item())\n"
                                        "                out = loss / m\n",
                                        "                out = loss / m\n"
                                        "                losses.append(out.item())\n"))

# a good-faith learner's runner: the micro-batch read as the action's second character, so
# "F12" is micro-batch 1 (the visible runs had m <= 4)
ONE_DIGIT_INDEX = _edit("runner", ("kind, j = action[0], int(action[1:])",
                                   "kind, j = action[0], int(action[1])"))

# a good-faith learner's runner that keeps each micro-batch's loss as a 0-d tensor and asks
# for the floats at the end (on a GPU, one synchronisation instead of m): right. Its losses'
# storages (256 bytes each for F.mse_loss on CPU) once failed the memory check
LOSSES_KEPT_AS_TENSORS = _edit(
    "runner", ("                losses.append(loss.item())\n",
               "                losses.append(loss.detach())\n"),
    ("    return losses\n", "    return [v.item() for v in losses]\n"))

# a good-faith learner's runner that names the loss every test used to hand it
MSE_NAMED = _edit("runner", ("loss = loss_fn(out, ys[j])", "loss = F.mse_loss(out, ys[j])"))

# -- recall ----------------------------------------------------------------------------------

WRONG_RECALL = {
    "answer_all_busy": "q_all_busy = True",
    "answer_bubble": "q_bubble = 70",
    "answer_bubble_ideal": "q_bubble_ideal = 0.5",
    "answer_memory": "q_memory = (16, 7)",
    "answer_traffic": 'q_traffic = "c"',
    "answer_more_microbatches": 'q_more_microbatches = "a"',
    "answer_memory_regime": 'q_memory_regime = "b"',
    "answer_blocking_send": 'q_blocking_send = "a"',
    "answer_dp_sync": 'q_dp_sync = "c"',
}

# R2 answered in Megatron's convention (7 / m <= 0.1), R3's 0.5 taken as a share of the step
BUBBLE_CONVENTIONS_SWAPPED = {"answer_bubble": "q_bubble = 70",
                              "answer_bubble_ideal": "q_bubble_ideal = 0.5"}

RECALL = ["recall_all_busy", "recall_bubble", "recall_bubble_ideal", "recall_memory",
          "recall_traffic", "recall_more_microbatches", "recall_memory_regime",
          "recall_blocking_send", "recall_dp_sync"]

# a good-faith learner's leaks (fourth pass): tensors no activation check follows, held by
# the handles of sends waited on only at the end
GRADIENT_SENDS_KEPT = {"runner": '''
def run_stage(actions, stage, x, y, loss_fn):
    """Run this rank's row of a schedule (e.g. ["F0", "F1", "B0", "F2", "B1", "B2"]).

    x, y: the whole batch, cut into m = len(actions) // 2 equal micro-batches (x.chunk(m)).
    Gradients accumulate in the stage's parameters as those of the full-batch mean loss.
    Returns the m micro-batch losses (floats, in the order of the forwards) on the last stage,
    [] on the others.
    """
    m = len(actions) // 2
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, outputs, act_sends = {}, {}, {}
    grad_sends = []
    losses = []
    for action in actions:
        kind, j = action[0], int(action[1:])
        if kind == "F":
            inp = xs[j] if stage.is_first else stage.recv_activation(j)
            out = stage.module(inp)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                losses.append(loss.item())
                outputs[j] = loss / m
            else:
                act_sends[j] = stage.send_activation(out, j)
                outputs[j] = out
            inputs[j] = inp
        else:
            out = outputs.pop(j)
            inp = inputs.pop(j)
            if stage.is_last:
                out.backward()
            else:
                out.backward(stage.recv_grad(j))
                act_sends.pop(j).work.wait()     # delivered: its gradient came back
            if not stage.is_first:
                grad_sends.append(stage.send_grad(inp.grad, j))
            del out, inp
    for h in grad_sends:
        h.work.wait()
    for h in act_sends.values():
        h.work.wait()
    return losses
'''}

COPIES_SENT_AND_KEPT = {"runner": '''
def run_stage(actions, stage, x, y, loss_fn):
    """Run this rank's row of a schedule (e.g. ["F0", "F1", "B0", "F2", "B1", "B2"]).

    x, y: the whole batch, cut into m = len(actions) // 2 equal micro-batches (x.chunk(m)).
    Gradients accumulate in the stage's parameters as those of the full-batch mean loss.
    Returns the m micro-batch losses (floats, in the order of the forwards) on the last stage,
    [] on the others.
    """
    m = len(actions) // 2
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, outputs, act_sends = {}, {}, {}
    handles = []
    losses = []
    for action in actions:
        kind, j = action[0], int(action[1:])
        if kind == "F":
            inp = xs[j] if stage.is_first else stage.recv_activation(j)
            out = stage.module(inp)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                losses.append(loss.item())
                outputs[j] = loss / m
            else:
                handles.append(stage.send_activation(out.detach().clone(), j))   # a copy: safe to send
                outputs[j] = out
            inputs[j] = inp
        else:
            out = outputs.pop(j)
            inp = inputs.pop(j)
            if stage.is_last:
                out.backward()
            else:
                out.backward(stage.recv_grad(j))
            if not stage.is_first:
                handles.append(stage.send_grad(inp.grad, j))
            del out, inp
    for h in handles:
        h.work.wait()
    return losses
'''}


# "visible": the test cells that already fail in the learner's view (hidden tests stripped),
# before hand-in; "visible_says": words of the hint they show there.

# the fifth learner pass's: the middle stage takes its input's gradient with autograd.grad, which
# leaves its weights no gradient (right on 2 stages, which have no middle one)
RUNNER_MIDDLE_NO_WEIGHT_GRADS = {"runner": '''\
def run_stage(actions, stage, x, y, loss_fn):
    m = len(actions) // 2
    xs, ys = x.chunk(m), y.chunk(m)
    losses = []
    inputs, outputs, act_sends = {}, {}, {}
    grad_send = None
    for a in actions:
        kind, j = a[0], int(a[1:])
        if kind == "F":
            inp = xs[j] if stage.is_first else stage.recv_activation(j)
            out = stage.module(inp)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                losses.append(loss.item())
                out = loss / m
            else:
                act_sends[j] = stage.send_activation(out, j)
            inputs[j], outputs[j] = inp, out
            del inp, out
        else:
            inp, out = inputs.pop(j), outputs.pop(j)
            if stage.is_first:                   # nothing to hand back: just backward
                g = stage.recv_grad(j)
                act_sends.pop(j).work.wait()
                out.backward(g)
                g_in = None
            elif stage.is_last:                  # the loss: backward, hand back d loss / d input
                out.backward()
                g_in = inp.grad
            else:                                # middle: what the previous stage needs is d loss / d input
                g = stage.recv_grad(j)
                act_sends.pop(j).work.wait()
                (g_in,) = torch.autograd.grad(out, inp, g)
            if g_in is not None:
                if grad_send is not None:
                    grad_send.work.wait()
                grad_send = stage.send_grad(g_in, j)
            del inp, out, g_in
    for h in act_sends.values():
        h.work.wait()
    if grad_send is not None:
        grad_send.work.wait()
    return losses
'''}

# the fifth pass's: the middle stage keeps every send's handle to the end of the step
RUNNER_MIDDLE_KEEPS_HANDLES = {"runner": '''\
def run_stage(actions, stage, x, y, loss_fn):
    m = len(actions) // 2
    xs, ys = x.chunk(m), y.chunk(m)
    losses, inputs, outputs, sends = [], {}, {}, {}
    middle = not (stage.is_first or stage.is_last)
    kept = []                                   # middle stage: "wait for everything at the end"
    for a in actions:
        kind, j = a[0], int(a[1:])
        if kind == "F":
            inp = xs[j] if stage.is_first else stage.recv_activation(j)
            out = stage.module(inp)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                losses.append(loss.item())
                out = loss / m
            else:
                sends[("a", j)] = stage.send_activation(out, j)
            inputs[j], outputs[j] = inp, out
        else:
            inp, out = inputs.pop(j), outputs.pop(j)
            if stage.is_last:
                out.backward()
            else:
                out.backward(stage.recv_grad(j))
                h = sends.pop(("a", j))
                kept.append(h) if middle else h.work.wait()
            if not stage.is_first:
                for k in [k for k in sends if k[0] == "g"]:
                    sends.pop(k).work.wait()
                h = stage.send_grad(inp.grad, j)
                if middle:
                    kept.append(h)
                else:
                    sends[("g", j)] = h
            del inp, out
    for h in list(sends.values()) + kept:
        h.work.wait()
    return losses
'''}

# the fifth pass's: the micro-batch read as one character (wrong from m = 11 on)
PEAK_ONE_CHARACTER_INDEX = {"peak": '''\
def peak_in_flight(row):
    live, peak = set(), 0
    for a in row:
        a = str(a)
        if a[0] == "F":
            live.add(int(a[1]))
            peak = max(peak, len(live))
        else:
            live.discard(int(a[1]))
    return peak
'''}

# the fifth pass's: the count held once the last forward has run, taken for the peak
PEAK_AT_THE_LAST_FORWARD = {"peak": '''\
def peak_in_flight(row):
    row = [str(a) for a in row]
    last_f = max(i for i, a in enumerate(row) if a[0] == "F")
    return sum(1 for a in row[:last_f + 1] if a[0] == "F") - sum(1 for a in row[:last_f] if a[0] == "B")
'''}

# the sixth pass's: three cases written out, the middle stage as rank 1 (a fourth stage hangs)
NAIVE_MIDDLE_IS_RANK_1 = {"naive": '''\
def naive_pipeline_step(x, y):
    """Forward and backward of the whole batch through p = world_size stages, stage r on rank r.

    Returns {"loss": the loss on the last rank (None on the others),
             "grads": {name: gradient} of the parameters this rank's stage holds}.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    dev = dl.device()                      # where this rank's tensors and model live
    model = make_model().to(dev)
    x, y = x.to(dev), y.to(dev)            # the batch arrives from the notebook on the CPU
    stage = dl.pp.split_pieces(list(model.layers), p)[rank]
    loss = None
    # YOUR CODE HERE
    rows = x.shape[0]
    if rank == 0:
        out = stage(x)
        dist.send(out.detach(), dst=1)
        g = torch.empty(rows, HIDDEN, dtype=torch.float64, device=dev)
        dist.recv(g, src=1)
        out.backward(g)
    elif rank == p - 1:
        inp = torch.empty(rows, HIDDEN, dtype=torch.float64, device=dev)
        dist.recv(inp, src=rank - 1)
        inp.requires_grad_()
        loss = F.mse_loss(stage(inp), y)
        loss.backward()
        dist.send(inp.grad, dst=rank - 1)
    elif rank == 1:                        # the middle stage
        inp = torch.empty(rows, HIDDEN, dtype=torch.float64, device=dev)
        dist.recv(inp, src=0)
        inp.requires_grad_()
        out = stage(inp)
        dist.send(out.detach(), dst=2)
        g = torch.empty(rows, HIDDEN, dtype=torch.float64, device=dev)
        dist.recv(g, src=2)
        out.backward(g)
        dist.send(inp.grad, dst=0)
    grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    return {"loss": None if loss is None else loss.item(), "grads": grads}
'''}

# -- the seventh learner pass -------------------------------------------------------------------

# each micro-batch's loss scaled by its rows over the notebook's BATCH: 1/m only at that batch
RUNNER_SCALED_BY_THE_NOTEBOOKS_BATCH = _edit("runner", ("                out = loss / m",
                                                        "                out = loss * ys[j].shape[0] / BATCH"))

# the replicas' gradients exchanged in float32, half the bytes and half the digits
DP_PP_IN_FLOAT32 = _edit("dp_pp", (
    "        flat = torch.cat([q.grad.reshape(-1) for q in params])\n"
    "        dist.all_reduce(flat, group=grid.dp_group)",
    "        flat = torch.cat([q.grad.reshape(-1) for q in params]).float()\n"
    "        dist.all_reduce(flat, group=grid.dp_group)"))

# -- the eighth learner pass -------------------------------------------------------------------

# micro-batches in flight at F<j> taken as j + 1 less the backwards so far: right
# only where the forwards come in micro-batch order
PEAK_BY_THE_FORWARDS_INDEX = {"peak": '''\
def peak_in_flight(row):
    """Most micro-batches whose forward is done and backward not yet, at any point of row."""
    # YOUR CODE HERE
    peak = done_b = 0
    for action in row:
        j = int(action[1:])
        if action[0] == "F":
            peak = max(peak, j + 1 - done_b)
        else:
            done_b += 1
    return peak
'''}

# micro-batches in flight before B<j> taken as the forwards so far less j: right
# only where the backwards come in micro-batch order
PEAK_BY_THE_BACKWARDS_INDEX = {"peak": '''\
def peak_in_flight(row):
    """Most micro-batches whose forward is done and backward not yet, at any point of row."""
    # YOUR CODE HERE
    peak = done_f = 0
    for action in row:
        if action[0] == "F":
            done_f += 1
        else:
            peak = max(peak, done_f - int(action[1:]))
    return peak
'''}

# a runner of the learner's own that waits on each gradient send as soon as it is
# posted (and on each activation send before the next): right on every library schedule, a
# deadlock where the first stage runs GPipe's row beside 1F1B's
RUNNER_WAITS_EACH_GRADIENT_SEND = {"runner": '''\
def run_stage(actions, stage, x, y, loss_fn):
    """Run this rank's row of a schedule (e.g. ["F0", "F1", "B0", "F2", "B1", "B2"]).

    x, y: the whole batch, cut into m = len(actions) // 2 equal micro-batches (x.chunk(m)).
    Gradients accumulate in the stage's parameters as those of the full-batch mean loss.
    Returns the m micro-batch losses (floats, in the order of the forwards) on the last stage,
    [] on the others.
    """
    m = len(actions) // 2
    xs, ys = x.chunk(m), y.chunk(m)
    # YOUR CODE HERE
    inputs, outputs, losses = {}, {}, []
    pending = None                          # the handle of the last send, not yet waited on
    for action in actions:
        kind, j = action[0], int(action[1:])
        if kind == "F":
            inp = xs[j] if stage.is_first else stage.recv_activation(j)
            out = stage.module(inp)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                losses.append(loss.item())
                out = loss / m
            inputs[j], outputs[j] = inp, out
            if pending is not None:
                pending.work.wait()
                pending = None
            if not stage.is_last:
                pending = stage.send_activation(out.detach(), j)
        else:
            inp, out = inputs.pop(j), outputs.pop(j)
            if stage.is_last:
                out.backward()
            else:
                out.backward(stage.recv_grad(j))
            del out
            if pending is not None:
                pending.work.wait()
                pending = None
            if not stage.is_first:
                stage.send_grad(inp.grad, j).work.wait()
            del inp
    if pending is not None:
        pending.work.wait()
    return losses
'''}

# the same runner, waiting on each activation send as soon as it is posted instead
RUNNER_WAITS_EACH_ACTIVATION_SEND = {"runner": RUNNER_WAITS_EACH_GRADIENT_SEND["runner"].replace(
    "                pending = stage.send_activation(out.detach(), j)\n",
    "                stage.send_activation(out.detach(), j).work.wait()\n").replace(
    "                stage.send_grad(inp.grad, j).work.wait()\n",
    "                pending = stage.send_grad(inp.grad, j)\n")}


VARIANTS = [
    {"name": "naive pipeline written for 3 stages (the visible case)",
     "replace": _edit("naive", ("    if rank < p - 1:\n        dist.send(out.detach()",
                                "    if rank < 2:\n        dist.send(out.detach()"),
                      ("    if rank == p - 1:\n        loss.backward()",
                       "    if rank == 2:\n        loss.backward()")),
     "loses": ["naive_tests", "naive_comm_tests"], "visible": ["naive_tests"]},
    {"name": "naive pipeline as first, middle and last stage, the middle one hard-coded as rank 1"
             " (right on 2 and 3 ranks; sixth pass)",
     "replace": NAIVE_MIDDLE_IS_RANK_1, "loses": ["naive_tests", "naive_comm_tests"],
     "visible": ["naive_tests"]},
    {"name": "naive pipeline receiving into a buffer of the notebook's BATCH rows",
     "replace": _edit("naive", ("torch.empty(x.shape[0], HIDDEN", "torch.empty(BATCH, HIDDEN")),
     "loses": ["naive_tests"], "visible": ["naive_tests"], "visible_says": ["pp.fixed_batch"]},
    {"name": "received activation without requires_grad: no gradient to send back",
     "replace": FORGETS_REQUIRES_GRAD, "loses": ["naive_tests", "naive_comm_tests"],
     "visible": ["naive_tests", "naive_comm_tests"], "visible_says": ["pp.recv_untracked"]},
    {"name": "a middle stage passes on the gradient it received, as if it were the identity",
     "replace": PASSES_THE_RECEIVED_GRADIENT_ON, "loses": ["naive_tests"],
     "visible": ["naive_tests"], "visible_says": ["differs from the reference"]},
    {"name": "right numbers, plus a broadcast of the loss",
     "replace": BROADCASTS_THE_LOSS, "loses": ["naive_comm_tests"],
     "visible": ["naive_comm_tests"], "visible_says": ["send/recv only"]},
    {"name": "GPipe table interleaves F and B (that is the naive schedule)",
     "replace": GPIPE_INTERLEAVED, "loses": ["gpipe_tests"],
     "visible": ["gpipe_tests"], "visible_says": ["every forward first"]},
    {"name": "runner: the losses reported divided by m",
     "replace": LOSS_REPORTED_SCALED, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["not the ranks: this run has 2"]},
    {"name": "runner: F.mse_loss named where the runner is handed loss_fn",
     "replace": MSE_NAMED, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.loss_fn"]},
    {"name": "runner: the micro-batch index read as one digit (F12 taken for F1)",
     "replace": ONE_DIGIT_INDEX, "loses": ["runner_tests"],
     "visible": ["runner_tests"]},
    {"name": "1F1B warm-up one forward too long (a wrong table costs Exercise 2 only)",
     "replace": WARMUP_OFF_BY_ONE, "loses": ["one_f_one_b_tests"],
     "visible": ["one_f_one_b_tests"], "visible_says": ["never holds more than"]},
    {"name": "1F1B warm-up not capped at m (breaks only when m < p)",
     "replace": WARMUP_NOT_CAPPED_AT_M, "loses": ["one_f_one_b_tests"],
     "visible": ["one_f_one_b_tests"]},
    {"name": "tables taken from the library's own schedules (switched off while graded)",
     "replace": TABLES_FROM_THE_LIBRARY, "loses": ["gpipe_tests", "one_f_one_b_tests"],
     "visible": ["gpipe_tests", "one_f_one_b_tests"], "visible_says": ["is switched off"]},
    {"name": "runner: micro-batch loss not divided by m (costs Exercise 3 only, not 5)",
     "replace": LOSS_NOT_DIVIDED_BY_M, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["not divided by 4"]},
    {"name": "runner: the received activation detached (its .grad never filled)",
     "replace": _edit("runner", ("inp = xs[j] if stage.is_first else stage.recv_activation(j)",
                                 "inp = xs[j] if stage.is_first else stage.recv_activation(j).detach()")),
     "loses": ["runner_tests", "runner_comm_tests"],
     "visible": ["runner_tests", "runner_comm_tests"], "visible_says": ["only an input that requires grad"]},
    {"name": "runner: blocking sends deadlock in 1F1B's steady state",
     "replace": BLOCKING_SENDS, "loses": ["runner_tests", "runner_comm_tests"],
     "visible": ["runner_tests", "runner_comm_tests"], "visible_says": ["isend"]},
    {"name": "runner: right numbers, but runs every row in GPipe order (and holds GPipe's "
             "activations under a 1F1B row)",
     "replace": IGNORES_THE_ROW_ORDER, "loses": ["runner_tests", "runner_comm_tests"],
     "visible": ["runner_tests", "runner_comm_tests"],
     "visible_says": ["action by action", "pp.activations_kept"]},
    {"name": "runner: right numbers and messages, but keeps every micro-batch to the end",
     "replace": KEEPS_EVERY_MICROBATCH, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.activations_kept"]},
    {"name": "runner: the stage's gradients cleared as the runner starts (sixth pass)",
     "replace": _edit("runner", ("    losses = []\n", "    losses = []\n    stage.module.zero_grad()\n")),
     "loses": ["runner_tests"], "visible": ["runner_tests"], "visible_says": ["pp.runner_cleared"]},
    {"name": "runner: the micro-batch counted, not read from the action (right on every "
             "library row only)",
     "replace": COUNTS_THE_MICROBATCHES, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.runner_index"]},
    {"name": "runner: right numbers and messages, but keeps every send's handle (and so its "
             "activation) to the end",
     "replace": KEEPS_EVERY_HANDLE, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.activations_kept"]},
    {"name": "runner: every gradient send waited on only at the end (a gradient per "
             "micro-batch held on every stage but the first)",
     "replace": GRADIENT_SENDS_KEPT, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.activations_kept", "waited on"]},
    {"name": "runner: a copy of each output sent, every handle waited on only at the end",
     "replace": COPIES_SENT_AND_KEPT, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.activations_kept", "a copy"]},
    {"name": "runner: right numbers, plus an all-reduce of the losses",
     "replace": ALL_REDUCES_THE_LOSSES, "loses": ["runner_comm_tests"],
     "visible": ["runner_comm_tests"], "visible_says": ["send/recv only"]},
    {"name": "runner: the library's run_schedule (switched off while graded)",
     "replace": RUNNER_FROM_THE_LIBRARY, "loses": ["runner_tests", "runner_comm_tests"],
     "visible": ["runner_tests", "runner_comm_tests"], "visible_says": ["is switched off"]},
    {"name": "peak activations: counts every forward, ignores the backwards",
     "replace": COUNTS_FORWARDS_ONLY, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["in flight from its F to its B"]},
    {"name": "peak activations: the forwards before the first backward",
     "replace": INDEX_OF_THE_FIRST_B, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["wherever in the row"]},
    {"name": "peak activations: the library's Schedule.peak_in_flight (switched off)",
     "replace": COUNT_FROM_THE_LIBRARY, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["is switched off"]},
    {"name": "peak activations: from the library's count of what is held before each forward",
     "replace": HELD_FROM_THE_LIBRARY, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["is switched off"]},
    {"name": "prediction: rows held taken to grow like the count of micro-batches",
     "replace": COUNTS_ARE_BYTES, "loses": ["predict_tests"]},
    {"name": "DP x PP: the replicas' all-reduce asynchronous, its handle dropped (sixth pass)",
     "replace": _edit("dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)",
                                "        dist.all_reduce(flat, group=grid.dp_group, async_op=True)")),
     "loses": ["dp_pp_tests"], "visible": ["dp_pp_tests"],
     "visible_says": ["check.unwaited"]},
    {"name": "DP x PP: divided in place before waiting on the asynchronous all-reduce",
     "replace": _edit("dp_pp", ("        dist.all_reduce(flat, group=grid.dp_group)      # SUM, then divide: runs on every backend\n"
                                "        flat /= grid.dp\n",
                                "        work = dist.all_reduce(flat, group=grid.dp_group, async_op=True)\n"
                                "        flat /= grid.dp\n"
                                "        work.wait()\n")),
     "loses": ["dp_pp_tests"], "visible": ["dp_pp_tests"],
     "visible_says": ["check.written_in_flight"]},
    {"name": "DP x PP: sum over the replicas instead of the average",
     "replace": SUM_NOT_AVERAGE, "loses": ["dp_pp_tests"],
     "visible": ["dp_pp_tests"], "visible_says": ["pp.dp_sum_not_divided"]},
    {"name": "DP x PP: the step runs GPipe where the docstring says 1F1B (same gradients)",
     "replace": _edit("dp_pp", ('    dl.pp.run_schedule("1f1b", stage,', '    dl.pp.run_schedule("gpipe", stage,')),
     "loses": ["dp_pp_tests"],
     "visible": ["dp_pp_tests"], "visible_says": ["pp.dp_pp_schedule"]},
    {"name": "runner: the losses returned as tensors, not floats",
     "replace": _edit("runner", ("                losses.append(loss.item())\n",
                                 "                losses.append(loss.detach())\n")),
     "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.loss_floats"]},
    {"name": "DP x PP: the replicas' sum divided by dp x m (the micro-batches counted again)",
     "replace": _edit("dp_pp", ("        flat /= grid.dp\n", "        flat /= grid.dp * m\n")),
     "loses": ["dp_pp_tests"], "visible": ["dp_pp_tests"],
     "visible_says": ["pp.dp_divided_by_m"]},
    {"name": "DP x PP: the replicas' sum divided by 2, right on dp = 2 only",
     "replace": DIVIDED_BY_A_HARD_CODED_2, "loses": ["dp_pp_tests"],
     "visible": ["dp_pp_tests"], "visible_says": ["pp.dp_fixed_divisor"]},
    {"name": "DP x PP: the replicas' sum divided by world size // 2, right on two stages only",
     "replace": DIVIDED_BY_WORLD_OVER_2, "loses": ["dp_pp_tests"], "visible": ["dp_pp_tests"],
     "visible_says": ["pp.dp_fixed_divisor"]},
    {"name": "runner: the middle stage's weights get no gradient (autograd.grad)",
     "replace": RUNNER_MIDDLE_NO_WEIGHT_GRADS, "loses": ["runner_tests"],
     "visible": ["runner_tests"]},
    {"name": "runner: the middle stage keeps every send's handle to the end",
     "replace": RUNNER_MIDDLE_KEEPS_HANDLES, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.activations_kept"]},
    {"name": "peak_in_flight: the micro-batch read as one character",
     "replace": PEAK_ONE_CHARACTER_INDEX, "loses": ["peak_tests"], "visible": ["peak_tests"]},
    {"name": "peak_in_flight: the count once the last forward has run",
     "replace": PEAK_AT_THE_LAST_FORWARD, "loses": ["peak_tests"], "visible": ["peak_tests"]},
    {"name": "DP x PP: right numbers, synced after every micro-batch",
     "replace": SYNC_EVERY_MICROBATCH, "loses": ["dp_pp_comm_tests"],
     "visible": ["dp_pp_comm_tests"]},
    {"name": "DP x PP: right numbers, one all-reduce per parameter",
     "replace": ONE_ALL_REDUCE_PER_PARAMETER, "loses": ["dp_pp_comm_tests"],
     "visible": ["dp_pp_comm_tests"], "visible_says": ["one per parameter tensor"]},
    {"name": "DP x PP: all-reduce over every rank instead of the dp group",
     "replace": ALL_REDUCE_OVER_EVERY_RANK, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"], "visible_says": ["pp.dp_sync_group"]},
    {"name": "DP x PP: the replicas' sum divided by the world size, not by dp",
     "replace": MEAN_OVER_THE_WORLD, "loses": ["dp_pp_tests"], "visible": ["dp_pp_tests"],
     "visible_says": ["pp.dp_mean_world"]},
    {"name": "DP x PP: gradients exchanged over the pipeline group (the other stage)",
     "replace": OVER_THE_PIPELINE_GROUP, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"], "visible_says": ["pp.dp_sync_group"]},
    {"name": "DP x PP: right numbers, reduced onto one replica and broadcast back",
     "replace": REDUCE_THEN_BROADCAST, "loses": ["dp_pp_comm_tests"],
     "visible": ["dp_pp_comm_tests"], "visible_says": ["pp.dp_sync_ops"]},
    {"name": "DP x PP: right numbers, every replica's gradients gathered and summed by each",
     "replace": _edit("dp_pp", (
         "        dist.all_reduce(flat, group=grid.dp_group)      # SUM, then divide: runs on "
         "every backend\n",
         "        parts = [torch.empty_like(flat) for _ in range(grid.dp)]\n"
         "        dist.all_gather(parts, flat, group=grid.dp_group)\n"
         "        flat = torch.stack(parts).sum(0)\n")),
     "loses": ["dp_pp_comm_tests"],
     "visible": ["dp_pp_comm_tests"], "visible_says": ["dp.gather_then_sum"]},
    {"name": "DP x PP: right numbers, and one more all-reduce over the whole world",
     "replace": LOSS_AVERAGED_OVER_THE_WORLD_TOO, "loses": ["dp_pp_comm_tests"],
     "visible": ["dp_pp_comm_tests"], "visible_says": ["pp.dp_sync_group"]},
    {"name": "DP x PP: no exchange at all, each replica keeps its half-batch gradients",
     "replace": NO_SYNC, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"], "visible_says": ["pp.dp_no_sync"]},
    {"name": "DP x PP: the weights exchanged, the biases left with each replica's own gradient",
     "replace": WEIGHTS_ONLY, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible_says": ["pp.dp_some_left_out", "pp.dp_sync_bytes"]},
    {"name": "runner, right another way: the losses kept as 0-d tensors, floats at the end",
     "replace": LOSSES_KEPT_AS_TENSORS, "loses": []},
    {"name": "DP x PP, right another way: the exchange after run_schedule returns",
     "replace": SYNC_AFTER_THE_RUNNER_RETURNS, "loses": []},
    {"name": "DP x PP, right another way: buckets from hooks during the last backward",
     "replace": BUCKETS_DURING_THE_LAST_BACKWARD, "loses": []},
    {"name": "DP x PP: the library's DataParallel (switched off while graded)",
     "replace": DATAPARALLEL_FROM_THE_LIBRARY, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"], "visible_says": ["is switched off"]},
    {"name": "every recall answer wrong (a misconception each)",
     "replace": WRONG_RECALL, "loses": RECALL},
    {"name": "recall: the two bubble conventions swapped",
     "replace": BUBBLE_CONVENTIONS_SWAPPED, "loses": ["recall_bubble", "recall_bubble_ideal"]},
    {"name": "recall R5: a middle stage sends no gradient back",
     "replace": {"answer_traffic": 'q_traffic = "a"'}, "loses": ["recall_traffic"]},
    {"name": "recall R6: the smaller bubble taken for the shorter step",
     "replace": {"answer_more_microbatches": 'q_more_microbatches = "b"'},
     "loses": ["recall_more_microbatches"]},
    {"name": "recall R7: 1F1B's stage 0 held to its p - 1 warm-up forwards",
     "replace": {"answer_memory_regime": 'q_memory_regime = "d"'},
     "loses": ["recall_memory_regime"]},
    {"name": "recall R9: the gradients all-reduced after every micro-batch",
     "replace": {"answer_dp_sync": 'q_dp_sync = "b"'}, "loses": ["recall_dp_sync"]},
    {"name": "runner: the losses scaled with the notebook's BATCH (seventh pass)",
     "replace": RUNNER_SCALED_BY_THE_NOTEBOOKS_BATCH, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["pp.runner_scale_fixed"]},
    {"name": "DP x PP: the replicas' gradients exchanged in float32 (seventh pass)",
     "replace": DP_PP_IN_FLOAT32, "loses": ["dp_pp_tests", "dp_pp_comm_tests"],
     "visible": ["dp_pp_tests", "dp_pp_comm_tests"], "visible_says": ["pp.dp_sync_dtype"]},
    {"name": "peak activations: in flight at F<j> counted from j (eighth pass)",
     "replace": PEAK_BY_THE_FORWARDS_INDEX, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["whatever order the micro-batches come in"]},
    {"name": "peak activations: held before B<j> counted from j (eighth pass)",
     "replace": PEAK_BY_THE_BACKWARDS_INDEX, "loses": ["peak_tests"],
     "visible": ["peak_tests"], "visible_says": ["pp.peak_in_flight"]},
    {"name": "runner: each gradient send waited on as soon as it is posted (eighth pass)",
     "replace": RUNNER_WAITS_EACH_GRADIENT_SEND, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["request handle that never completes"]},
    {"name": "runner: each activation send waited on as soon as it is posted (eighth pass)",
     "replace": RUNNER_WAITS_EACH_ACTIVATION_SEND, "loses": ["runner_tests"],
     "visible": ["runner_tests"], "visible_says": ["request handle that never completes"]},
    {"name": "runner: the losses returned in micro-batch order, not the forwards' (eighth pass)",
     "replace": _edit("runner", ("                losses.append(loss.item())",
                                 "                losses.append((j, loss.item()))"),
                      ("    return losses\n", "    return [loss for _, loss in sorted(losses)]\n")),
     "loses": ["runner_tests"], "visible": ["runner_tests"],
     "visible_says": ["the order of the forwards"]},
    {"name": "runner: the losses kept as tensors with their graphs, floats at the end (eighth pass)",
     "replace": _edit("runner", ("                losses.append(loss.item())",
                                 "                losses.append(loss)"),
                      ("    return losses\n", "    return [loss.item() for loss in losses]\n")),
     "loses": ["runner_tests"], "visible": ["runner_tests"],
     "visible_says": ["a loss kept as a tensor"]},
]
