"""Wrong answers to 06_planning, and the graded cells each must lose (all others keep points).

Each variant is the solution cell with one mistake written in, as an exact edit of the solution
notebook's own source, so the variants follow the notebook as it changes; an edit that no longer
matches is an error when this module is imported, never a variant that silently tests nothing.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("06_planning")


# -- Exercise 1: model state per GPU ----------------------------------------------------------

_TABLE = '{"fp32": (4, 4, 8), "mixed": (2, 2, 12)}'

NO_OPTIMIZER_STATE = _edit("memory", (_TABLE, '{"fp32": (4, 4, 0), "mixed": (2, 2, 0)}'))

NO_MASTER_WEIGHTS = _edit("memory", (_TABLE, '{"fp32": (4, 4, 8), "mixed": (2, 2, 8)}'))

ZERO_SHARDS_THE_WRONG_PART = _edit(
    "memory",
    ('"params": share * weights / (dp if zero >= 3 else 1)',
     '"params": share * weights / (dp if zero >= 1 else 1)'),
    ('"optimizer": share * optimizer / (dp if zero >= 1 else 1)',
     '"optimizer": share * optimizer / (dp if zero >= 3 else 1)'))

PIPELINE_DOES_NOT_SPLIT = _edit("memory", ("share = n_params / (tp * pp)",
                                           "share = n_params / tp"))

ROUNDED_SHARE = _edit("memory", ("share = n_params / (tp * pp)", "share = n_params // (tp * pp)"))

MASTER_COPY_WITH_THE_WEIGHTS = _edit("memory", (_TABLE, '{"fp32": (4, 4, 8), "mixed": (6, 2, 8)}'))

DP_ALWAYS_DIVIDES = _edit("memory", ("share = n_params / (tp * pp)",
                                     "share = n_params / (tp * pp * dp)"))

# right, written another way: bytes per number by precision, the stage that shards each part
MEMORY_ANOTHER_WAY = {"memory": '''
def model_state_bytes(n_params, *, dp=1, tp=1, pp=1, zero=0, precision="fp32"):
    compute = 4 if precision == "fp32" else 2
    adam = 2 * 4 + (4 if precision == "mixed" else 0)
    per_gpu = n_params / tp / pp
    sharded = {"params": zero == 3, "grads": zero >= 2, "optimizer": zero >= 1}
    sizes = {"params": compute, "grads": compute, "optimizer": adam}
    return {k: per_gpu * sizes[k] / (dp if sharded[k] else 1) for k in sizes}
'''}

MEMORY_FROM_THE_LIBRARY = {"memory": '''
def model_state_bytes(n_params, *, dp=1, tp=1, pp=1, zero=0, precision="fp32"):
    m = dl.cost.memory(n_params, dp=dp, tp=tp, pp=pp, zero=zero, precision=precision)
    return {"params": m.params, "grads": m.grads, "optimizer": m.optimizer}
'''}

# -- Exercise 2: bytes per step -------------------------------------------------------------------

TP_FORWARD_ONLY = _edit(
    "step_bytes",
    ("tp_per_micro_batch += 2 * activation + 2 * activation   # forward g, backward f",
     "tp_per_micro_batch += 2 * activation                    # forward g"),
    ("tp_per_micro_batch += 3 * per_token + activation",
     "tp_per_micro_batch += 3 * per_token"))

LOSS_ALL_REDUCES_FORGOTTEN = _edit(
    "step_bytes", ("tp_per_micro_batch += 3 * per_token + activation",
                   "tp_per_micro_batch += activation"))

NO_GRADIENTS_BACK_THROUGH_THE_PIPELINE = _edit(
    "step_bytes", ("directions = (stage < pp - 1) + (stage > 0)",
                   "directions = int(stage < pp - 1)"))

# every stage counted both ways, the first and the last too
PIPELINE_BOTH_WAYS_EVERYWHERE = _edit(
    "step_bytes", ("directions = (stage < pp - 1) + (stage > 0)",
                   "directions = 2 * (pp > 1)"))

# Right wherever pp <= 2 (a stage there sends one way only); a middle stage sends both ways.
PIPELINE_ONE_WAY_PER_STAGE = _edit(
    "step_bytes", ("directions = (stage < pp - 1) + (stage > 0)",
                   "directions = int(pp > 1)"))

DP_ALL_REDUCE_PER_MICRO_BATCH = _edit(
    "step_bytes", ('"dp": n_params * itemsize if dp > 1 else 0',
                   '"dp": micro_batches * n_params * itemsize if dp > 1 else 0'))

DP_TRAFFIC_WITHOUT_A_DP_GROUP = _edit(
    "step_bytes", ('"dp": n_params * itemsize if dp > 1 else 0', '"dp": n_params * itemsize'))

MICRO_BATCH_IGNORES_DP = _edit(
    "step_bytes", ("b = batch_size // (dp * micro_batches)", "b = batch_size // micro_batches"))

FOUR_BYTES_PER_NUMBER_ALWAYS = _edit(
    "step_bytes", ("    b = batch_size // (dp * micro_batches)",
                   "    itemsize = 4\n    b = batch_size // (dp * micro_batches)"))

# the library's estimate instead of one's own (switched off while the checks run)
DP_FROM_THE_LIBRARY = _edit(
    "step_bytes", ('"dp": n_params * itemsize if dp > 1 else 0',
                   '"dp": dl.cost.dp_gradient_bytes(\n'
                   '        n_params, torch.float64 if itemsize == 8 else torch.float32) if dp > 1 else 0'))

# right, written another way: first and last stage told apart by their pieces
DIRECTIONS_FROM_THE_PIECES = _edit(
    "step_bytes", ("directions = (stage < pp - 1) + (stage > 0)",
                   'directions = (pieces[-1] != "head") + (pieces[0] != "embed")'))

# -- Exercise 3: choosing a layout ------------------------------------------------------------------

IGNORES_THE_MEMORY_LIMIT = _edit(
    "layout", ("    m = 1\n    while", "    return (gpus, 1, 1)\n    m = 1\n    while"))

_TP_LINE = "        tp = min(m, gpus_per_node)\n"

TP_ACROSS_NODES = _edit("layout", (_TP_LINE, "        tp = m\n"))

PIPELINE_BEFORE_TENSOR_PARALLEL = _edit("layout", (_TP_LINE, "        tp = 1\n"))

COUNTS_ONLY_THE_WEIGHTS = _edit("layout", ("precision=precision).total",
                                           "precision=precision).params"))

# every divisor of the GPU count tried, not only powers of two
DIVISORS_NOT_POWERS = {"layout": '''
import math


def choose_layout(n_params, *, gpus, gpus_per_node, memory_budget, precision="mixed"):
    for m in range(1, gpus + 1):
        if gpus % m:
            continue
        tp = math.gcd(m, gpus_per_node)
        pp = m // tp
        if dl.cost.memory(n_params, dp=gpus // m, tp=tp, pp=pp,
                          precision=precision).total <= memory_budget:
            return (gpus // m, tp, pp)
    return None
'''}

# right, written another way: search every (tp, pp) and keep the best by the objective
LAYOUT_BY_SEARCH = {"layout": '''
def choose_layout(n_params, *, gpus, gpus_per_node, memory_budget, precision="mixed"):
    powers = [2 ** k for k in range(31) if gpus % 2 ** k == 0]
    fits = [(tp * pp, -tp, (gpus // (tp * pp), tp, pp)) for tp in powers for pp in powers
            if tp <= gpus_per_node and gpus % (tp * pp) == 0
            and dl.cost.memory(n_params, dp=gpus // (tp * pp), tp=tp, pp=pp,
                               precision=precision).total <= memory_budget]
    return min(fits)[2] if fits else None
'''}

_DP_PP, _TP = ["comm_dp_pp_tests"], ["comm_tp_tests"]


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


VARIANTS = [
    # exercise 1; each loses only its own cell: exercise 3 measures with dl.cost.memory
    _seen({"name": "Adam's optimizer state left out",
           "replace": NO_OPTIMIZER_STATE, "loses": ["memory_tests"],
           "visible_says": ["Adam's state is missing", "plan.adam"]}),
    _seen({"name": "mixed precision without the fp32 master weights",
           "replace": NO_MASTER_WEIGHTS, "loses": ["memory_tests"],
           "visible_says": ["master copy"]}),
    _seen({"name": "ZeRO-1 shards the weights and ZeRO-3 the optimizer state (order reversed)",
           "replace": ZERO_SHARDS_THE_WRONG_PART, "loses": ["memory_tests"],
           "visible_says": ["divided by dp where the params stay whole", "plan.zero_stage"]}),
    _seen({"name": "pipeline stages do not divide the model state",
           "replace": PIPELINE_DOES_NOT_SPLIT, "loses": ["memory_tests"],
           "visible_says": ["pp does not divide it", "plan.pp_splits"]}),
    _seen({"name": "the share rounded to whole parameters",
           "replace": ROUNDED_SHARE, "loses": ["memory_tests"],
           "visible_says": ["a rounded share", "plan.rounded"]}),
    _seen({"name": "mixed precision: the fp32 master copy counted with the weights",
           "replace": MASTER_COPY_WITH_THE_WEIGHTS, "loses": ["memory_tests"],
           "visible_says": ["it is optimizer state", "plan.master_copy"]}),
    _seen({"name": "dp divides the state without ZeRO",
           "replace": DP_ALWAYS_DIVIDES, "loses": ["memory_tests"],
           "visible_says": ["plain data parallel copies them", "plan.zero_stage"]}),
    _seen({"name": "the library's dl.cost.memory instead of one's own arithmetic",
           "replace": MEMORY_FROM_THE_LIBRARY, "loses": ["memory_tests"],
           "visible_says": ["is switched off here"]}),
    # exercise 2
    _seen({"name": "tensor-parallel all-reduces counted in forward only",
           "replace": TP_FORWARD_ONLY, "loses": _TP,
           "visible_says": ["in backward every f all-reduces", "plan.tp_backward"]}),
    _seen({"name": "the vocab-parallel loss's three per-token all-reduces forgotten",
           "replace": LOSS_ALL_REDUCES_FORGOTTEN, "loses": _TP,
           "visible_says": ["three numbers per token", "plan.tp_loss"]}),
    _seen({"name": "pipeline: every stage counted one way (right for pp <= 2 only)",
           "replace": PIPELINE_ONE_WAY_PER_STAGE, "loses": _DP_PP,
           "visible_says": ["a middle stage sends the activation forward AND"]}),
    _seen({"name": "pipeline: activation gradients never sent back",
           "replace": NO_GRADIENTS_BACK_THROUGH_THE_PIPELINE, "loses": _DP_PP,
           "visible_says": ["this stage sends nothing in yours", "plan.pp_directions"]}),
    _seen({"name": "pipeline: the first and last stages counted both ways",
           "replace": PIPELINE_BOTH_WAYS_EVERYWHERE, "loses": _DP_PP,
           "visible_says": ["has one neighbour only", "plan.pp_directions"]}),
    _seen({"name": "gradient all-reduce on every micro-batch (accumulation steps communicate)",
           "replace": DP_ALL_REDUCE_PER_MICRO_BATCH, "loses": _DP_PP,
           "visible_says": ["not once per micro-batch"]}),
    _seen({"name": "gradient all-reduce counted with dp = 1",
           "replace": DP_TRAFFIC_WITHOUT_A_DP_GROUP, "loses": _DP_PP,
           "visible_says": ["with dp = 1 there is no data-parallel group"]}),
    _seen({"name": "micro-batch size without dividing the batch over the dp ranks",
           "replace": MICRO_BATCH_IGNORES_DP, "loses": [*_DP_PP, *_TP],
           "visible_says": ["before it is cut into micro-batches", "plan.micro_batch"]}),
    # run F (fp64 with tp = 4) shows it in the tp bytes, a hidden run
    _seen({"name": "4 bytes per number whatever the dtype",
           "replace": FOUR_BYTES_PER_NUMBER_ALWAYS, "loses": [*_DP_PP, *_TP],
           "visible": _DP_PP, "visible_says": ["8 bytes per number (itemsize)"]}),
    _seen({"name": "the library's dp estimate instead of one's own",
           "replace": DP_FROM_THE_LIBRARY, "loses": [*_DP_PP, *_TP],
           "visible_says": ["is switched off here"]}),
    # exercise 3
    _seen({"name": "layout chosen without checking the memory (always plain data parallel)",
           "replace": IGNORES_THE_MEMORY_LIMIT, "loses": ["layout_tests"],
           "visible_says": ["check the memory before choosing"]}),
    _seen({"name": "tensor parallel spread across nodes",
           "replace": TP_ACROSS_NODES, "loses": ["layout_tests"],
           "visible_says": ["spans more than one node"]}),
    _seen({"name": "pipeline stages before tensor parallel",
           "replace": PIPELINE_BEFORE_TENSOR_PARALLEL, "loses": ["layout_tests"],
           "visible_says": ["take the most tensor parallel", "plan.most_tp"]}),
    _seen({"name": "every divisor of the GPU count tried, not only powers of two",
           "replace": DIVISORS_NOT_POWERS, "loses": ["layout_tests"],
           "visible_says": ["must be powers of two", "plan.power_of_two"]}),
    _seen({"name": "only the weights counted against the memory budget",
           "replace": COUNTS_ONLY_THE_WEIGHTS, "loses": ["layout_tests"],
           "visible_says": ["check the memory before choosing"]}),
    # right answers written another way keep every point: the checks test behaviour
    {"name": "right: model state from bytes per number and the stage that shards each part",
     "replace": MEMORY_ANOTHER_WAY, "loses": []},
    {"name": "right: first and last stage told apart by their pieces",
     "replace": DIRECTIONS_FROM_THE_PIECES, "loses": []},
    {"name": "right: the layout found by searching every (tp, pp)",
     "replace": LAYOUT_BY_SEARCH, "loses": []},
    {"name": "right: bubbles rounded within the stated 0.002",
     "replace": {"recall_bubble_both": "bubble_of_step = 0.226\nbubble_of_ideal = 0.29"},
     "loses": []},
    # the prediction of section 5 and the recall questions (their visible tests check the
    # format only, so these are not marked visible)
    {"name": "prediction: more micro-batches cost GPipe more memory at a fixed batch",
     "replace": {"predict_memory": 'q_memory = ("up", "same")'},
     "loses": ["predict_memory_tests"]},
    {"name": "recall 1: data parallel needs no communication",
     "replace": {"recall_dp_exchange": 'answer_1 = "a"'}, "loses": ["recall_dp_exchange_tests"]},
    {"name": "recall 2: more micro-batches cost activation bytes at a fixed batch",
     "replace": {"recall_micro_batches": 'answer_2 = "b"'},
     "loses": ["recall_micro_batches_tests"]},
    {"name": "recall 3: a bigger batch with the same learning rate trains the same",
     "replace": {"recall_batch_lr": 'answer_3 = "a"'}, "loses": ["recall_batch_lr_tests"]},
    {"name": "recall 4: bubble of exactly 10% taken as below 10%",
     "replace": {"recall_bubble_m": "bubble_m = 27"}, "loses": ["recall_bubble_m_tests"]},
    {"name": "recall 5: the two conventions swapped",
     "replace": {"recall_bubble_both": "bubble_of_step = 7 / 24\nbubble_of_ideal = 7 / 31"},
     "loses": ["recall_bubble_both_tests"]},
    {"name": "recall 6: micro-batches counted instead of sequences",
     "replace": {"recall_held": "held = (28, 4)"}, "loses": ["recall_held_tests"]},
    {"name": "recall 7: both cuts move each activation once",
     "replace": {"recall_methods": 'answer_7 = "a"'}, "loses": ["recall_methods_tests"]},
]
