"""Wrong answers to 10_pipeline_schedules, and the graded cells each must lose (all others keep
points); and right answers written another way, which must lose nothing.

Most variants are the solution cell with one mistake written in, as an exact edit of the
solution notebook's own source, so they follow the notebook as it changes.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("10_pipeline_schedules")

# -- Exercise 1: interleaved 1F1B -------------------------------------------------------------

CHUNK_MAJOR = _edit(
    "interleaved_table",
    ("        round_, within = divmod(k, p * v)\n"
     "        chunk = within // p if kind == \"F\" else v - 1 - within // p\n"
     "        name = f\"{kind}{round_ * p + within % p}\"",
     "        chunk, j = divmod(k, m)                  # all m through chunk 0 first\n"
     "        chunk = chunk if kind == \"F\" else v - 1 - chunk\n"
     "        name = f\"{kind}{j}\""))

WARMUP_OF_1F1B = _edit("interleaved_table",
                       ("warmup = min((v - 1) * p + 2 * (p - 1 - r), total)",
                        "warmup = min((v - 1) * p + (p - 1 - r), total)"))

# the warm-up as long as the trip back, even where a rank has fewer forwards than that (p = 4,
# m = 4, v = 2: rank 0 would warm up with 10 of its 8): an IndexError, or a wrong row
WARMUP_NOT_CAPPED = _edit("interleaved_table",
                          ("warmup = min((v - 1) * p + 2 * (p - 1 - r), total)",
                           "warmup = (v - 1) * p + 2 * (p - 1 - r)"))

# the steady state's pair the other way round: the oldest backward, then the next forward
STEADY_STATE_B_FIRST = _edit("interleaved_table",
                             ("            row += [action(\"F\", warmup + i), action(\"B\", i)]",
                              "            row += [action(\"B\", i), action(\"F\", warmup + i)]"))

BACKWARD_CHUNKS_COUNTED_UP = _edit(
    "interleaved_table",
    ('chunk = within // p if kind == "F" else v - 1 - within // p', "chunk = within // p"))

CHUNK_ZERO_NAMED = _edit(
    "interleaved_table",
    ('return name if chunk == 0 else f"{name}.{chunk}"', 'return f"{name}.{chunk}"'))

LOSS_SUMMED = _edit("torch_step", (
    "schedule = getattr(schedules, schedule_name)(stages, m, loss_fn=F.mse_loss)",
    "schedule = getattr(schedules, schedule_name)(\n"
    "        stages, m, loss_fn=lambda out, y: F.mse_loss(out, y, reduction=\"sum\"))"))

ANY_M = _edit("interleaved_table",
              ("    if m % p:\n", "    if False:\n"))

TABLE_FROM_THE_LIBRARY = {"interleaved_table": '''
def interleaved_table(p, m, v):
    """The library's table."""
    return [[str(a) for a in row] for row in dl.pp.interleaved_1f1b(p, m, v).actions]
'''}

SENDS_WITHOUT_THE_WRAP = _edit("predict_sends", ("return 2 * m * (v * p - 1)",
                                                 "return 2 * m * v * (p - 1)"))

SENDS_READ_OFF_THE_TRACE = _edit("predict_sends", ("return 2 * m * (v * p - 1)",
                                                   "return {1: 48, 2: 112}[v]"))

SENDS_FROM_THE_LIBRARY = _edit("predict_sends", ("return 2 * m * (v * p - 1)",
                                                 "return dl.cost.pp_messages(p, m, v)"))

# -- Exercise 2: B and W ------------------------------------------------------------------------

WEIGHT_GRAD_TRANSPOSED = _edit("bw_linear", ("return grad_out.T @ inp, grad_out.sum(dim=0)",
                                             "return inp.T @ grad_out, grad_out.sum(dim=0)"))

BIAS_GRAD_AVERAGED = _edit("bw_linear", ("return grad_out.T @ inp, grad_out.sum(dim=0)",
                                         "return grad_out.T @ inp, grad_out.mean(dim=0)"))

# a good-faith learner's (fourth pass): both averaged over the batch, which the generic scale
# hint blamed on "4 ranks" in a single-process exercise
BOTH_GRADS_AVERAGED = _edit("bw_linear", ("return grad_out.T @ inp, grad_out.sum(dim=0)",
                                          "n = inp.shape[0]\n"
                                          "    return grad_out.T @ inp / n, grad_out.sum(dim=0) / n"))

INPUT_GRAD_WITH_THE_TRANSPOSE = _edit("bw_linear", ("return grad_out @ weight\n",
                                                    "return grad_out @ weight.T\n"))

W_DONE_DURING_B = _edit(
    "bw_stage",
    ("        held[i] = (g, acts[i])               # W of layer i needs its grad_out and its input\n",
     "        held[i] = (g, acts[i])               # W of layer i needs its grad_out and its input\n"
     "        gw, gb = backward_weight(g, acts[i])   # why wait?\n"
     "        layers[i].weight.grad, layers[i].bias.grad = gw, gb\n"))

NO_TANH_DERIVATIVE = _edit("bw_stage", ("            g = g * (1 - acts[i + 1] ** 2)\n",
                                        "            pass\n"))

# B's step through tanh, and the same step keeping the gradient that arrived (after tanh)
_THROUGH_TANH = ("        if i < len(layers) - 1:              # through tanh: its output is acts[i + 1]\n"
                 "            g = g * (1 - acts[i + 1] ** 2)\n")
_KEEPING_AFTER_TANH = "        after_tanh = g\n" + _THROUGH_TANH

HOLDS_THE_GRADIENT_BEFORE_TANH = _edit(
    "bw_stage", (_THROUGH_TANH + "        held[i] = (g, acts[i])",
                 _KEEPING_AFTER_TANH + "        held[i] = (after_tanh, acts[i])"))

HOLDS_BOTH_GRADIENTS_OF_TANH = _edit(
    "bw_stage",
    (_THROUGH_TANH + "        held[i] = (g, acts[i])",
     _KEEPING_AFTER_TANH + "        held[i] = (g, acts[i], after_tanh)   # both, in case"),
    ("    for layer, (g, inp) in zip(layers, held):", "    for layer, (g, inp, _) in zip(layers, held):"))

# ... and W reads the extra one too (a check of what it was handed): no tensor goes unread,
# but B still holds more than W computes from
HOLDS_AND_READS_BOTH_GRADIENTS_OF_TANH = _edit(
    "bw_stage",
    (_THROUGH_TANH + "        held[i] = (g, acts[i])",
     _KEEPING_AFTER_TANH + "        held[i] = (g, acts[i], after_tanh)   # both, in case"),
    ("    for layer, (g, inp) in zip(layers, held):",
     "    for layer, (g, inp, kept) in zip(layers, held):\n"
     "        assert torch.isfinite(kept).all()    # W checks what it was handed"))

HELD_IN_A_GLOBAL_TOO = _edit(
    "bw_stage",
    ("    return g, held\n",
     "    STASH.append([t.clone() for t in acts])   # a copy of the activations, for later\n"
     "    return g, held\n"),
    ("def b_step(layers, acts, grad_out):\n",
     "STASH = []\n\n\ndef b_step(layers, acts, grad_out):\n"))

W_OVERWRITES_GRAD = _edit(
    "bw_stage",
    ("param.grad = grad.clone() if param.grad is None else param.grad + grad",
     "param.grad = grad.clone()"))

# autograd does B and W, keeping the graph between them: the right numbers, with B running the
# stage's forward again and W the gradients between the layers again (a learner's, issue 39)
B_AND_W_BY_AUTOGRAD = {"bw_stage": '''
def b_step(layers, acts, grad_out):
    """B by autograd: the stage's forward again with the graph, the input gradient only."""
    with torch.enable_grad():
        x = acts[0].detach().requires_grad_()
        out, _ = stage_forward(layers, x)
        (grad_in,) = torch.autograd.grad(out, x, grad_out, retain_graph=True)
    return grad_in, (out, grad_out)


def w_step(layers, held):
    """W by autograd: the parameters' gradients from the graph B kept."""
    out, grad_out = held
    params = [q for layer in layers for q in (layer.weight, layer.bias)]
    with torch.enable_grad():
        grads = torch.autograd.grad(out, params, grad_out)
    for q, g in zip(params, grads):
        q.grad = g.clone() if q.grad is None else q.grad + g
'''}

# right, another way: the products written with einsum, what W needs in a dict per layer
BW_BY_EINSUM = {"bw_stage": '''
def b_step(layers, acts, grad_out):
    held, g = {}, grad_out
    for i in range(len(layers) - 1, -1, -1):
        if i + 1 < len(layers):
            g = g * (1 - acts[i + 1].pow(2))
        held[i] = {"grad_out": g, "input": acts[i]}
        g = torch.einsum("ro,oi->ri", g, layers[i].weight)
    return g, held


def w_step(layers, held):
    for i, layer in enumerate(layers):
        g, x = held[i]["grad_out"], held[i]["input"]
        for param, grad in ((layer.weight, torch.einsum("ro,ri->oi", g, x)),
                            (layer.bias, g.sum(0))):
            if param.grad is None:
                param.grad = grad
            else:
                param.grad += grad
'''}

# -- Exercise 3: ZB-H1 ----------------------------------------------------------------------------

W_RIGHT_AFTER_B = _edit("zb_h1_table", ("            if i >= s:                       # stage s postpones its Ws by s backwards\n",
                                        "            if True:\n"))

EVERY_W_AT_THE_END = _edit("zb_h1_table", ("            if i >= s:                       # stage s postpones its Ws by s backwards\n",
                                           "            if False:\n"))

GPIPE_ORDER_WITH_W = {"zb_h1_table": '''
def zb_h1_table(p, m):
    """GPipe's order, each W right after the B."""
    return [[f"F{j}" for j in range(m)] + [x for j in range(m) for x in (f"B{j}", f"W{j}")]
            for _ in range(p)]
'''}

ZB_FROM_THE_LIBRARY = {"zb_h1_table": '''
def zb_h1_table(p, m):
    """The library's table."""
    return [[str(a) for a in row] for row in dl.pp.zb_h1(p, m).actions]
'''}

# right, another way: 1F1B's Fs and Bs, and a W only when the stage would otherwise exceed p
# micro-batches held (before a forward), the rest at the end
LAZY_W = {"zb_h1_table": '''
def zb_h1_table(p, m):
    table = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        fb = [f"F{j}" for j in range(warmup)]
        for i in range(m - warmup):
            fb += [f"F{warmup + i}", f"B{i}"]
        fb += [f"B{j}" for j in range(m - warmup, m)]
        row, forwards, ws, backs = [], 0, 0, 0
        for a in fb:
            if a[0] == "F":
                if forwards - ws == p:
                    row.append(f"W{ws}")
                    ws += 1
                forwards += 1
            else:
                backs += 1
            row.append(a)
            if a[0] == "B" and backs - ws > s:
                row.append(f"W{ws}")
                ws += 1
        row += [f"W{j}" for j in range(ws, m)]
        table.append(row)
    return table
'''}

ZB_H2_PEAK_OF_ZB_H1 = _edit("zb_h2_peak", ("zb_h2_peak = 2 * 6 - 1", "zb_h2_peak = 6"))

# a good-faith learner's wrong versions (third pass), whole cells
BIAS_GRADIENT_IN_B = {"bw_stage": '''
def b_step(layers, acts, grad_out):
    """B of a stage: (dL/d(stage input), what W needs later), no parameter gradient yet."""
    held = [None] * len(layers)
    g = grad_out
    for i in reversed(range(len(layers))):
        held[i] = (acts[i], g, g.sum(0))          # the bias gradient is cheap: done here
        g = backward_input(g, layers[i].weight)
        if i > 0:
            g = g * (1 - acts[i] ** 2)
    return g, held


def w_step(layers, held):
    """W of a stage: add every layer's weight and bias gradients into .grad."""
    for layer, (x, g, gb) in zip(layers, held):
        gw = g.t() @ x
        for q, d in ((layer.weight, gw), (layer.bias, gb)):
            if q.grad is None:
                q.grad = d.clone()
            else:
                q.grad += d
'''}
HELD_IN_A_QUEUE_NEVER_EMPTIED = {"bw_stage": '''
PENDING_W = []       # every micro-batch's W inputs, waiting for their W


def b_step(layers, acts, grad_out):
    """B of a stage: (dL/d(stage input), what W needs later), no parameter gradient yet."""
    held = [None] * len(layers)
    g = grad_out
    for i in reversed(range(len(layers))):
        held[i] = (acts[i], g)
        g = backward_input(g, layers[i].weight)
        if i > 0:
            g = g * (1 - acts[i] ** 2)
    PENDING_W.append(held)
    return g, held


def w_step(layers, held):
    """W of a stage: add every layer's weight and bias gradients into .grad."""
    for layer, (x, g) in zip(layers, held):
        gw, gb = backward_weight(g, x)
        for q, d in ((layer.weight, gw), (layer.bias, gb)):
            if q.grad is None:
                q.grad = d.clone()
            else:
                q.grad += d
'''}

# -- Exercise 4: torch.distributed.pipelining -----------------------------------------------------

CONTIGUOUS_CHUNKS = _edit("torch_step", ("mine = [c * p + rank for c in range(v)]",
                                         "mine = [rank * v + c for c in range(v)]"))

P_STAGES_NOT_VP = _edit("torch_step", ("stages = [PipelineStage(pieces[k], k, v * p, dev) for k in mine]",
                                       "stages = [PipelineStage(pieces[k], k, p, dev) for k in mine]"))

INPUT_ARGS_OF_THE_DEMO = _edit(
    "torch_step", ("stages = [PipelineStage(pieces[k], k, v * p, dev) for k in mine]",
                   "stages = [PipelineStage(pieces[k], k, v * p, dev,\n"
                   "                            input_args=torch.zeros(1, 4, device=dev))\n"
                   "              for k in mine]"))

TWO_CHUNKS_HARD_CODED = _edit("torch_step", ("mine = [c * p + rank for c in range(v)]",
                                             "mine = [rank, rank + p]"))

THE_LIBRARYS_TORCH_SCHEDULE = _edit(
    "torch_step", ("""    mine = [c * p + rank for c in range(v)]          # rank r holds stages r, r + p, ...
    stages = [PipelineStage(pieces[k], k, v * p, dev) for k in mine]
    schedule = getattr(schedules, schedule_name)(stages, m, loss_fn=F.mse_loss)
    kwargs = {}
    if v * p - 1 in mine:
        losses = []
        kwargs = {"target": y, "losses": losses}
    if 0 in mine:
        schedule.step(x, **kwargs)
    else:
        schedule.step(**kwargs)
""", """    mine = [pieces[c * p + rank] for c in range(v)]
    losses = dl.pp.torch_schedule(mine, schedule_name, m, F.mse_loss)(x, y)
"""))

SCHEDULE_CLASS_FIXED = _edit("torch_step", ("getattr(schedules, schedule_name)(",
                                            "schedules.ScheduleInterleaved1F1B("))

NO_TARGET_ON_THE_LAST_RANK = _edit("torch_step", ("    if v * p - 1 in mine:\n",
                                                  "    if False:\n"))

# -- the seventh learner pass -------------------------------------------------------------------

# raises only for an m above p that does not split: m = 2 on p = 4 runs rounds of micro-batches
# that do not exist
RAISES_ONLY_ABOVE_P = _edit("interleaved_table", ("    if m % p:\n", "    if m > p and m % p:\n"))

# depth first: each micro-batch through every chunk before the next starts
DEPTH_FIRST = _edit(
    "interleaved_table",
    ("        round_, within = divmod(k, p * v)\n"
     "        chunk = within // p if kind == \"F\" else v - 1 - within // p\n"
     "        name = f\"{kind}{round_ * p + within % p}\"",
     "        j, chunk = divmod(k, v)                  # micro-batch j through every chunk\n"
     "        chunk = chunk if kind == \"F\" else v - 1 - chunk\n"
     "        name = f\"{kind}{j}\""))

# B peels the last layer off and passes tanh's derivative below every other one, also below
# the first layer of a 1-layer stage, whose input no tanh made
B_PEELS_THE_LAST_LAYER = {"bw_stage": """
def b_step(layers, acts, grad_out):
    \"\"\"B of a stage: (dL/d(stage input), what W needs later), no parameter gradient yet.\"\"\"
    held = [None] * len(layers)
    g = grad_out
    held[-1] = (g, acts[-2])
    g = backward_input(g, layers[-1].weight) * (1 - acts[-2] ** 2)
    for i in reversed(range(len(layers) - 1)):
        held[i] = (g, acts[i])
        g = backward_input(g, layers[i].weight)
        if i > 0:
            g = g * (1 - acts[i] ** 2)
    return g, held


def w_step(layers, held):
    \"\"\"W of a stage: add every layer's weight and bias gradients into .grad.\"\"\"
    for layer, (g, inp) in zip(layers, held):
        gw, gb = backward_weight(g, inp)
        for param, grad in ((layer.weight, gw), (layer.bias, gb)):
            param.grad = grad.clone() if param.grad is None else param.grad + grad
"""}

# W takes the oldest B's leftovers from one queue and ignores what it is handed: right while
# the Ws run in the Bs' order, another micro-batch's (or chunk's) otherwise
W_FROM_A_QUEUE = _edit(
    "bw_stage",
    ("    return g, held\n", "    PENDING_W.append(held)\n    return g, held\n"),
    ("    for layer, (g, inp) in zip(layers, held):\n",
     "    for layer, (g, inp) in zip(layers, PENDING_W.pop(0)):\n"),
    ("def b_step(layers, acts, grad_out):\n", "PENDING_W = []\n\n\ndef b_step(layers, acts, grad_out):\n"))

# the stage's gradient through float32 and back
B_IN_FLOAT32 = _edit("bw_stage", ("    g = grad_out\n", "    g = grad_out.float().double()\n"))

# the schedule given v p micro-batches, the model's stages (6 = m in the sixth pass's cases)
MICROBATCHES_AS_STAGES = _edit("torch_step", ("(stages, m, loss_fn=F.mse_loss)",
                                              "(stages, v * p, loss_fn=F.mse_loss)"))

# every stage told an example input of 2 rows, the micro-batch when m = 6
INPUT_OF_TWO_ROWS = _edit("torch_step", (
    "PipelineStage(pieces[k], k, v * p, dev) for k in mine]",
    "PipelineStage(pieces[k], k, v * p, dev, input_args=torch.zeros(\n"
    "        2, D_IN if k == 0 else HIDDEN, dtype=torch.float64, device=dev)) for k in mine]"))

# the losses list made, never handed to the step
LOSSES_NOT_HANDED_OVER = _edit("torch_step", ('kwargs = {"target": y, "losses": losses}',
                                              'kwargs = {"target": y}'))

# W given the previous layer's input where the layer's own belongs (B's gradient stays right)
W_FROM_ANOTHER_LAYERS_INPUT = _edit("bw_stage", ("        held[i] = (g, acts[i])",
                                                 "        held[i] = (g, acts[i - 1])"))

# -- reading and recall ---------------------------------------------------------------------------

DUALPIPE_WITH_B_AS_INPUT_PART = _edit("dualpipe_bubbles",
                                      ('"zb1p": 7 * (1 + 2 - 2)', '"zb1p": 7 * (1 + 1 - 2)'))

# every recall answer wrong: the share of the step for R1; a rank's chunks taken for neighbours
# in the model (R2); the sync before the Ws, which need nothing from other ranks (R3); every W
# taken to wait for the drain (R4)
RECALL_WRONG = {
    "answer_interleaved_ideal": "q_interleaved_ideal = 3 / 35\n",
    "answer_why_rounds": 'q_why_rounds = "a"\n',
    "answer_w_later": 'q_w_later = "c"\n',
    "answer_memory_tight": 'q_memory_tight = "b"\n',
}

# "visible": the test cells that already fail in the learner's view (hidden tests stripped),
# before hand-in; "visible_says": words of the hint they show there.
# B does W's matrix products itself and hands W finished gradients (a learner's version)
B_DOES_W_WORK = '''
def b_step(layers, acts, grad_out):
    held = [None] * len(layers)
    g = grad_out
    for i in reversed(range(len(layers))):
        if i < len(layers) - 1:
            g = g * (1 - acts[i + 1] ** 2)
        held[i] = backward_weight(g, acts[i])
        g = backward_input(g, layers[i].weight)
    return g, held


def w_step(layers, held):
    for layer, (gw, gb) in zip(layers, held):
        for param, grad in ((layer.weight, gw), (layer.bias, gb)):
            param.grad = grad.clone() if param.grad is None else param.grad + grad
'''


# the ninth pass's: a learner's interleaved table by simulation, a backward as soon as its
# gradient is there: the right actions, each kind in the right order, another alternation
INTERLEAVED_BY_GREEDY_SIMULATION = {"interleaved_table": 'def interleaved_table(p, m, v):\n    """Interleaved 1F1B by simulation: a backward as soon as its gradient is there, else the\n    next forward, as long as the rank holds no more than the warm-up\'s micro-batches."""\n    if m % p:\n        raise ValueError(f"m={m} is not a multiple of p={p}")\n    def order(kind):\n        out = []\n        for rnd in range(m // p):\n            for c in (range(v) if kind == "F" else reversed(range(v))):\n                out += [(j, c) for j in range(rnd * p, rnd * p + p)]\n        return out\n    fo, bo = order("F"), order("B")\n    done, rows, nf, nb = {}, [[] for _ in range(p)], [0] * p, [0] * p\n    t = 0\n    while any(nb[r] < v * m for r in range(p)):\n        step = []\n        for r in range(p):\n            act = None\n            if nb[r] < v * m:\n                j, c = bo[nb[r]]\n                k = c * p + r\n                src = ("F", k, j) if k == v * p - 1 else ("B", k + 1, j)\n                if done.get(("F", k, j), t + 1) <= t and done.get(src, t + 1) <= t:\n                    act = ("B", j, c, k)\n            if act is None and nf[r] < v * m:\n                j, c = fo[nf[r]]\n                k = c * p + r\n                if k == 0 or done.get(("F", k - 1, j), t + 1) <= t:\n                    act = ("F", j, c, k)\n            if act:\n                step.append((r, act))\n        for r, (kind, j, c, k) in step:\n            done[(kind, k, j)] = t + 1\n            rows[r].append(f"{kind}{j}" + (f".{c}" if c else ""))\n            if kind == "F":\n                nf[r] += 1\n            else:\n                nb[r] += 1\n        t += 1\n    return rows'}

# the ninth pass's: ZB-H1 simulated, the last stage's backward left whole (no W), so its B is
# timed one step where a whole backward takes two
ZB_H1_LAST_STAGE_WHOLE = {"zb_h1_table": 'def zb_h1_table(p, m):\n    """ZB-H1 for p stages and m >= p micro-batches: rows of "F<j>", "B<j>", "W<j>"."""\n    # 1F1B\'s F/B order on every stage: p - s forwards, then B and F in turn, then the Bs left\n    orders = []\n    for s in range(p):\n        warm = min(m, p - s)\n        order = [("F", j) for j in range(warm)]\n        f, b = warm, 0\n        while b < m:\n            order.append(("B", b)); b += 1\n            if f < m:\n                order.append(("F", f)); f += 1\n        orders.append(order)\n    # time steps, all stages at once: the next F/B when its input has arrived and the stage\n    # has room for one more micro-batch; otherwise a pending W (oldest first); else wait\n    done = {}                                   # (kind, s, j) -> end time\n    rows = [[] for _ in range(p)]\n    nxt = [0] * p\n    pending = [[] for _ in range(p)]\n    held = [0] * p\n    t = 0\n    while any(nxt[s] < len(orders[s]) or pending[s] for s in range(p)):\n        step = []\n        for s in range(p):\n            act = None\n            if nxt[s] < len(orders[s]):\n                kind, j = orders[s][nxt[s]]\n                if kind == "F":\n                    ready = s == 0 or done.get(("F", s - 1, j), t + 1) <= t\n                    ready = ready and held[s] < p\n                else:\n                    ready = done.get(("F", s, j), t + 1) <= t and (\n                        s == p - 1 or done.get(("B", s + 1, j), t + 1) <= t)\n                if ready:\n                    act = (kind, j)\n                    nxt[s] += 1\n            if act is None and pending[s]:\n                act = ("W", pending[s].pop(0))\n            if act is not None:\n                step.append((s, act))\n        for s, (kind, j) in step:\n            done[(kind, s, j)] = t + 1\n            rows[s].append(f"{kind}{j}")\n            if kind == "F":\n                held[s] += 1\n            elif kind == "B" and s == p - 1:\n                held[s] -= 1\n            elif kind == "B" and s < p - 1:      # the last stage never waits: its B stays whole\n                pending[s].append(j)\n            else:\n                held[s] -= 1\n        t += 1\n    return rows'}


VARIANTS = [
    {"name": "interleaved: all m micro-batches through chunk 0 first, not rounds of p",
     "replace": CHUNK_MAJOR, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.interleaved_rounds"]},
    {"name": "interleaved: 1F1B's warm-up, without the trip back",
     "replace": WARMUP_OF_1F1B, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["forwards before its first backward"]},
    {"name": "interleaved: the warm-up not capped at the v m forwards a rank has",
     "replace": WARMUP_NOT_CAPPED, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.actions_past_m"]},
    {"name": "interleaved: the steady state runs the backward before the forward",
     "replace": STEADY_STATE_B_FIRST, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["steady state"]},
    {"name": "interleaved: backwards through the chunks counted up",
     "replace": BACKWARD_CHUNKS_COUNTED_UP, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["counted down"]},
    {"name": "interleaved: chunk 0 written \"F0.0\", as the other chunks are",
     "replace": CHUNK_ZERO_NAMED, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.action_names"],
     "visible_never_says": ["counted down"]},
    {"name": "interleaved: m not a multiple of p accepted",
     "replace": ANY_M, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["ValueError"]},
    {"name": "interleaved: the library's table (switched off while graded)",
     "replace": TABLE_FROM_THE_LIBRARY, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["is switched off"]},
    {"name": "messages: the wrap from the last rank to the first forgotten",
     "replace": SENDS_WITHOUT_THE_WRAP, "loses": ["predict_sends_tests"]},
    {"name": "messages: the two counts the trace printed, for every p and m",
     "replace": SENDS_READ_OFF_THE_TRACE, "loses": ["predict_sends_tests"]},
    {"name": "messages: dl.cost's count (switched off while graded)",
     "replace": SENDS_FROM_THE_LIBRARY, "loses": ["predict_sends_tests"],
     "visible": ["predict_sends_tests"], "visible_says": ["is switched off"]},
    {"name": "W: the weight gradient transposed",
     "replace": WEIGHT_GRAD_TRANSPOSED, "loses": ["bw_linear_tests", "bw_stage_tests"],
     "visible": ["bw_linear_tests", "bw_stage_tests"], "visible_says": ["has shape"]},
    {"name": "W: the bias gradient averaged over the rows",
     "replace": BIAS_GRAD_AVERAGED, "loses": ["bw_linear_tests", "bw_stage_tests"],
     "visible": ["bw_linear_tests", "bw_stage_tests"], "visible_says": ["divided by n"]},
    {"name": "W: weight and bias gradients both averaged over the batch's rows",
     "replace": BOTH_GRADS_AVERAGED, "loses": ["bw_linear_tests", "bw_stage_tests"],
     "visible": ["bw_linear_tests", "bw_stage_tests"], "visible_says": ["the rows of the batch"]},
    {"name": "B: the input gradient with the weight transposed",
     "replace": INPUT_GRAD_WITH_THE_TRANSPOSE, "loses": ["bw_linear_tests", "bw_stage_tests"],
     "visible": ["bw_linear_tests", "bw_stage_tests"], "visible_says": ["pp.linear_shapes"]},
    {"name": "stage: the bias gradient computed in B, left for W to add",
     "replace": BIAS_GRADIENT_IN_B, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_work_in_b"]},
    {"name": "stage: what W needs also kept in a module-level queue never emptied",
     "replace": HELD_IN_A_QUEUE_NEVER_EMPTIED, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_frees"]},
    {"name": "stage: W computed during B",
     "replace": W_DONE_DURING_B, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["already have a gradient"]},
    {"name": "stage: B skips tanh's derivative",
     "replace": NO_TANH_DERIVATIVE, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.tanh_derivative"]},
    {"name": "stage: W keeps the gradient before tanh's derivative",
     "replace": HOLDS_THE_GRADIENT_BEFORE_TANH, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"]},
    {"name": "B holds the gradients on both sides of tanh for W",
     "replace": HOLDS_BOTH_GRADIENTS_OF_TANH, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_holds_more"]},
    {"name": "B computes the weight gradients and holds them; W only adds them",
     "replace": {"bw_stage": B_DOES_W_WORK}, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_work_in_b"]},
    {"name": "B holds both gradients of tanh and W reads both (hidden: more than W needs)",
     "replace": HOLDS_AND_READS_BOTH_GRADIENTS_OF_TANH, "loses": ["bw_stage_tests"]},
    {"name": "B keeps a copy of the activations in a global list",
     "replace": HELD_IN_A_GLOBAL_TOO, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_holds_more"]},
    {"name": "stage: W overwrites .grad instead of adding (shows with two micro-batches)",
     "replace": W_OVERWRITES_GRAD, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["add up"]},
    {"name": "stage: B and W by autograd, the graph kept between them (each does more work)",
     "replace": B_AND_W_BY_AUTOGRAD, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.b_work"]},
    # a good-faith learner's (fifth pass): the stage's input gradient held for W as well, and
    # a loop over the example's 3 layers
    {"name": "stage: the input gradient, sent to the previous stage, also held for W",
     "replace": _edit("bw_stage", ("    return g, held\n", "    return g, {\"layers\": held, "
                                   "\"grad_in\": g}\n"), (
         "    for layer, (g, inp) in zip(layers, held):\n",
         "    for layer, (g, inp) in zip(layers, held[\"layers\"]):\n")),
     "loses": ["bw_stage_tests"], "visible": ["bw_stage_tests"],
     "visible_says": ["pp.w_holds_more"]},
    {"name": "stage: B's loop over the example's 3 layers, not the stage's",
     "replace": _edit("bw_stage", ("    held = [None] * len(layers)\n", "    held = [None] * 3\n"), (
         "    for i in reversed(range(len(layers))):\n        if i < len(layers) - 1:",
         "    for i in (2, 1, 0):\n        if i < 2:")),
     "loses": ["bw_stage_tests"], "visible": ["bw_stage_tests"]},
    {"name": "stage: right another way, einsum products and W's inputs in a dict",
     "replace": BW_BY_EINSUM, "loses": []},
    {"name": "ZB-H1: each W right after its B (1F1B in two pieces)",
     "replace": W_RIGHT_AFTER_B, "loses": ["zb_h1_tests"],
     "visible": ["zb_h1_tests"], "visible_says": ["pp.zb_fill"]},
    {"name": "ZB-H1: Ws postponed by at most 2 backwards (fits p = 3, idles at p = 4)",
     "replace": _edit("zb_h1_table", ("if i >= s:   ", "if i >= min(s, 2):   ")),
     "loses": ["zb_h1_tests"], "visible": ["zb_h1_tests"], "visible_says": ["pp.zb_fill"]},
    {"name": "ZB-H1: the drain's Bs first, every W left after them",
     "replace": _edit("zb_h1_table", (
         "            row.append(f\"B{i}\")\n            if i >= s:   ",
         "            row.append(f\"B{i}\")\n            if i >= s and warmup + i < m:   ")),
     "loses": ["zb_h1_tests"], "visible": ["zb_h1_tests"], "visible_says": ["pp.zb_fill"]},
    {"name": "ZB-H1: every W at the end (holds all m)",
     "replace": EVERY_W_AT_THE_END, "loses": ["zb_h1_tests"],
     "visible": ["zb_h1_tests"], "visible_says": ["until its W"]},
    {"name": "ZB-H1: GPipe's order with Ws",
     "replace": GPIPE_ORDER_WITH_W, "loses": ["zb_h1_tests"],
     "visible": ["zb_h1_tests"], "visible_says": ["1F1B's place"]},
    {"name": "ZB-H1: the library's table (switched off while graded)",
     "replace": ZB_FROM_THE_LIBRARY, "loses": ["zb_h1_tests"],
     "visible": ["zb_h1_tests"], "visible_says": ["is switched off"]},
    {"name": "ZB-H1: W_j after B_(j+s), the lag capped at 3 (right up to p = 4; sixth pass)",
     "replace": _edit("zb_h1_table", ("            if i >= s:", "            if i >= min(s, 3):")),
     "loses": ["zb_h1_tests"], "visible": ["zb_h1_tests"], "visible_says": ["pp.zb_fill"]},
    {"name": "ZB-H1: Ws as late as memory allows (right, another table)",
     "replace": LAZY_W, "loses": []},
    {"name": "ZB-H2's peak taken for ZB-H1's",
     "replace": ZB_H2_PEAK_OF_ZB_H1, "loses": ["zb_h2_peak_tests"]},
    {"name": "torch_step: the schedule class fixed, schedule_name ignored",
     "replace": SCHEDULE_CLASS_FIXED, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_schedule_name"]},
    {"name": "torch_step: two chunks per rank hard-coded (v = 3 goes wrong)",
     "replace": TWO_CHUNKS_HARD_CODED, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"]},
    {"name": "torch_step: m taken as 2 p, the examples' (fifth pass)",
     "replace": _edit("torch_step", ("(stages, m, loss_fn=F.mse_loss)",
                                     "(stages, 2 * p, loss_fn=F.mse_loss)")),
     "loses": ["torch_step_tests"], "visible": ["torch_step_tests"]},
    {"name": "torch_step: the schedule given m // p micro-batches (sixth pass)",
     "replace": _edit("torch_step", ("(stages, m, loss_fn=F.mse_loss)",
                                     "(stages, m // p, loss_fn=F.mse_loss)")),
     "loses": ["torch_step_tests"], "visible": ["torch_step_tests"],
     "visible_says": ["pp.torch_microbatches"]},
    {"name": "torch: the stage index interleaved, the piece contiguous (fifth pass)",
     "replace": _edit("torch_step", ("PipelineStage(pieces[k], k, v * p, dev) for k in mine]",
                                     "PipelineStage(pieces[rank * v + c], k, v * p, dev)\n"
                                     "              for c, k in enumerate(mine)]")),
     "loses": ["torch_step_tests"], "visible": ["torch_step_tests"],
     "visible_says": ["pp.torch_layout"]},
    {"name": "torch: contiguous chunks per rank, not interleaved",
     "replace": CONTIGUOUS_CHUNKS, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_layout"]},
    {"name": "torch: p stages announced, not v p",
     "replace": P_STAGES_NOT_VP, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"]},
    {"name": "torch: input_args of another shape and dtype (float32, 4 wide)",
     "replace": INPUT_ARGS_OF_THE_DEMO, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["input_args"]},
    {"name": "torch: the library's torch_schedule, which the demo used (switched off)",
     "replace": THE_LIBRARYS_TORCH_SCHEDULE, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["is switched off"]},
    {"name": "torch: each micro-batch's loss summed over its elements, not averaged",
     "replace": LOSS_SUMMED, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_loss_sum"],
     "visible_never_says": ["8 ranks"]},
    {"name": "torch: the last rank passes no target",
     "replace": NO_TARGET_ON_THE_LAST_RANK, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"]},
    {"name": "interleaved: raises only for an m above p (seventh pass)",
     "replace": RAISES_ONLY_ABOVE_P, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.interleaved_m"]},
    {"name": "interleaved: depth first, each micro-batch through every chunk (seventh pass)",
     "replace": DEPTH_FIRST, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.interleaved_rounds"],
     "visible_never_says": ["not all m through one chunk"]},
    {"name": "stage: B peels the last layer, tanh's derivative below a 1-layer stage too",
     "replace": B_PEELS_THE_LAST_LAYER, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.tanh_derivative"]},
    {"name": "stage: W from a queue of B's leftovers, not what it is handed (seventh pass)",
     "replace": W_FROM_A_QUEUE, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_reads_held"]},
    {"name": "stage: the gradient through float32 and back (seventh pass)",
     "replace": B_IN_FLOAT32, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.float32"],
     "visible_never_says": ["pp.tanh_derivative"]},
    {"name": "torch_step: v p micro-batches, the model's stages (seventh pass)",
     "replace": MICROBATCHES_AS_STAGES, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_microbatches"]},
    {"name": "torch_step: an example input of 2 rows (seventh pass)",
     "replace": INPUT_OF_TWO_ROWS, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_shapes"]},
    {"name": "torch_step: the losses list never handed to the step (seventh pass)",
     "replace": LOSSES_NOT_HANDED_OVER, "loses": ["torch_step_tests"],
     "visible": ["torch_step_tests"], "visible_says": ["pp.torch_losses"],
     "visible_never_says": ["pp.torch_microbatches"]},
    {"name": "stage: W given another layer's input (seventh pass)",
     "replace": W_FROM_ANOTHER_LAYERS_INPUT, "loses": ["bw_stage_tests"],
     "visible": ["bw_stage_tests"], "visible_says": ["pp.w_inputs"]},
    {"name": "DualPipe's table read with B as the input part",
     "replace": DUALPIPE_WITH_B_AS_INPUT_PART, "loses": ["dualpipe_tests"]},
    {"name": "recall: every answer wrong", "replace": RECALL_WRONG,
     "loses": ["recall_interleaved_ideal", "recall_why_rounds", "recall_w_later",
               "recall_memory_tight"]},
    {"name": "recall R1: 1F1B's bubble at the new m, the chunks left out",
     "replace": {"answer_interleaved_ideal": "q_interleaved_ideal = 3 / 8\n"},
     "loses": ["recall_interleaved_ideal"]},
    {"name": "recall R3: the all-reduce after the last B, as after 1F1B's last backward",
     "replace": {"answer_w_later": 'q_w_later = "b"\n'}, "loses": ["recall_w_later"]},
    {"name": "recall R4: ZB-H1 read as 1F1B's memory on every stage",
     "replace": {"answer_memory_tight": 'q_memory_tight = "a"\n'},
     "loses": ["recall_memory_tight"]},
    {"name": "interleaved: the backward's chunk as 1 - c, right for two chunks only (ninth pass)",
     "replace": _edit("interleaved_table", ('else v - 1 - within // p', 'else 1 - within // p')),
     "loses": ["interleaved_tests"], "visible": ["interleaved_tests"],
     "visible_says": ["pp.actions_past_v"]},
    {"name": "interleaved: a greedy simulation, each backward as soon as it can (ninth pass)",
     "replace": INTERLEAVED_BY_GREEDY_SIMULATION, "loses": ["interleaved_tests"],
     "visible": ["interleaved_tests"], "visible_says": ["pp.interleaved_alternation"],
     "visible_never_says": ["pp.interleaved_backward"]},
    {"name": "W: the weight gradient computed in float32 (ninth pass)",
     "replace": _edit("bw_linear", ("return grad_out.T @ inp, grad_out.sum(dim=0)",
                                    "return grad_out.float().T @ inp.float(), grad_out.sum(dim=0)")),
     "loses": ["bw_linear_tests", "bw_stage_tests"],
     "visible": ["bw_linear_tests", "bw_stage_tests"], "visible_says": ["pp.float32"]},
    {"name": "stage: B's gradient cast to float32 before the first product (ninth pass)",
     "replace": _edit("bw_stage", ("    g = grad_out\n", "    g = grad_out.float()\n")),
     "loses": ["bw_stage_tests"], "visible": ["bw_stage_tests"], "visible_says": ["pp.float32"]},
    {"name": "ZB-H1: the last stage's backward left whole, no W in its row (ninth pass)",
     "replace": ZB_H1_LAST_STAGE_WHOLE, "loses": ["zb_h1_tests"], "visible": ["zb_h1_tests"],
     "visible_says": ["pp.zb_every_w"]},
]
