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
    "step_bytes", ('directions = (pieces[-1] != "head") + (pieces[0] != "embed")',
                   'directions = int(pieces[-1] != "head")'))

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

# -- Exercise 3: choosing a layout ------------------------------------------------------------------

IGNORES_THE_MEMORY_LIMIT = _edit(
    "layout", ("    m = 1\n    while", "    return (gpus, 1, 1)\n    m = 1\n    while"))

_TP_LINE = "        tp = min(m, gpus_per_node)\n"

TP_ACROSS_NODES = _edit("layout", (_TP_LINE, "        tp = m\n"))

PIPELINE_BEFORE_TENSOR_PARALLEL = _edit("layout", (_TP_LINE, "        tp = 1\n"))

COUNTS_ONLY_THE_WEIGHTS = _edit("layout", ("precision=precision).total",
                                           "precision=precision).params"))

VARIANTS = [
    {"name": "Adam's optimizer state left out",
     "replace": NO_OPTIMIZER_STATE, "loses": ["memory_tests"]},
    {"name": "mixed precision without the fp32 master weights",
     "replace": NO_MASTER_WEIGHTS, "loses": ["memory_tests"]},
    {"name": "ZeRO-1 shards the weights and ZeRO-3 the optimizer state (order reversed)",
     "replace": ZERO_SHARDS_THE_WRONG_PART, "loses": ["memory_tests"]},
    {"name": "pipeline stages do not divide the model state",
     "replace": PIPELINE_DOES_NOT_SPLIT, "loses": ["memory_tests"]},
    {"name": "tensor-parallel all-reduces counted in forward only",
     "replace": TP_FORWARD_ONLY, "loses": ["comm_tp_tests"]},
    {"name": "the vocab-parallel loss's three per-token all-reduces forgotten",
     "replace": LOSS_ALL_REDUCES_FORGOTTEN, "loses": ["comm_tp_tests"]},
    {"name": "pipeline: activation gradients never sent back",
     "replace": NO_GRADIENTS_BACK_THROUGH_THE_PIPELINE, "loses": ["comm_dp_pp_tests"]},
    {"name": "gradient all-reduce on every micro-batch (accumulation steps communicate)",
     "replace": DP_ALL_REDUCE_PER_MICRO_BATCH, "loses": ["comm_dp_pp_tests"]},
    {"name": "gradient all-reduce counted with dp = 1",
     "replace": DP_TRAFFIC_WITHOUT_A_DP_GROUP, "loses": ["comm_dp_pp_tests"]},
    {"name": "micro-batch size without dividing the batch over the dp ranks",
     "replace": MICRO_BATCH_IGNORES_DP, "loses": ["comm_dp_pp_tests", "comm_tp_tests"]},
    {"name": "4 bytes per number whatever the dtype",
     "replace": FOUR_BYTES_PER_NUMBER_ALWAYS, "loses": ["comm_dp_pp_tests", "comm_tp_tests"]},
    {"name": "layout chosen without checking the memory (always plain data parallel)",
     "replace": IGNORES_THE_MEMORY_LIMIT, "loses": ["layout_tests"]},
    {"name": "tensor parallel spread across nodes",
     "replace": TP_ACROSS_NODES, "loses": ["layout_tests"]},
    {"name": "pipeline stages before tensor parallel",
     "replace": PIPELINE_BEFORE_TENSOR_PARALLEL, "loses": ["layout_tests"]},
    {"name": "only the weights counted against the memory budget",
     "replace": COUNTS_ONLY_THE_WEIGHTS, "loses": ["layout_tests"]},
    {"name": "recall 1: data parallel needs no communication",
     "replace": {"recall_1": 'answer_1 = "a"'}, "loses": ["recall_1_tests"]},
    {"name": "recall 2: more micro-batches are free",
     "replace": {"recall_2": 'answer_2 = "a"'}, "loses": ["recall_2_tests"]},
    {"name": "recall 3: a bigger batch with the same learning rate trains the same",
     "replace": {"recall_3": 'answer_3 = "a"'}, "loses": ["recall_3_tests"]},
    {"name": "recall 4: bubble of exactly 10% taken as below 10%",
     "replace": {"recall_4": "bubble_m = 27"}, "loses": ["recall_4_tests"]},
    {"name": "recall 5: GPipe's activations taken as capped like 1F1B's",
     "replace": {"recall_5": "held = (4, 4)"}, "loses": ["recall_5_tests"]},
]
