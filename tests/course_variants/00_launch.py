"""Wrong answers to 00_launch, and the graded cells each must lose (all others keep points).

"visible": the visible test cells that already fail on the learner's side, before hand-in."""

from tests.course_variants import solution_editor

_edit = solution_editor("00_launch")

DROPS_THE_REMAINDER = '''
def my_rows(n: int, rank: int, world: int) -> range:
    size = n // world
    return range(rank * size, (rank + 1) * size)
'''

OVERLAPPING_ROWS = _edit("my_rows", (
    "return range(start, start + base + (1 if rank < extra else 0))",
    "return range(start, min(n, start + base + 1))"))

# The library's split instead of one's own: switched off while my_rows is graded.
CALLS_THE_LIBRARY = '''
def my_rows(n: int, rank: int, world: int) -> range:
    return dl.models.shard_range(n, rank, world)
'''

ALL_REDUCE_INSTEAD_OF_ALL_GATHER = '''
def gather_partial_sums(n: int, rows_of) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    total = torch.tensor([float(sum(i * i for i in rows_of(n, rank, world)))],
                         dtype=torch.float64, device=dev)
    dist.all_reduce(total)
    return [total.item()] * world, total.item()
'''

ONE_BROADCAST_PER_RANK = '''
def gather_partial_sums(n: int, rows_of) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    mine = float(sum(i * i for i in rows_of(n, rank, world)))
    partials = []
    for src in range(world):
        t = torch.tensor([mine if src == rank else 0.0], dtype=torch.float64, device=dev)
        dist.broadcast(t, src=src)
        partials.append(t.item())
    return partials, sum(partials)
'''

# Right numbers, but its input is every rank's slot: N numbers in, most of them zeros
ALL_REDUCE_OF_SLOTS = '''
def gather_partial_sums(n: int, rows_of) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = torch.zeros(world, dtype=torch.float64, device=dl.device())
    slots[rank] = float(sum(i * i for i in rows_of(n, rank, world)))
    dist.all_reduce(slots)
    return slots.tolist(), slots.sum().item()
'''

# Right on 2 ranks, where "the others" is one rank: the total minus mine is its part.
TWO_RANK_THINKING = '''
def gather_partial_sums(n: int, rows_of) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    mine = float(sum(i * i for i in rows_of(n, rank, world)))
    total = torch.tensor([mine], dtype=torch.float64, device=dev)
    dist.all_reduce(total)
    other = total.item() - mine
    return ([mine, other] if rank == 0 else [other, mine]), total.item()
'''

ONLY_MY_OWN_PART = _edit("gather", (
    "    partials = [p.item() for p in parts]\n",
    "    partials = [mine.item()] * world\n"))

# Switching the grader off (integrity.py): the answer is wrong (a broadcast per rank instead of
# one all_gather) and the cell then tries to make the communication check pass anyway. The scan
# of the submitted cells zeroes every graded cell, so the feedback says why on each.
GRADER_REPLACED = ONE_BROADCAST_PER_RANK + '''
dl.check.comm = lambda *args, **kwargs: None
'''
GRADER_REPLACED_BEHIND_ITS_BACK = ONE_BROADCAST_PER_RANK + '''
dl.check.__dict__["comm"] = lambda *args, **kwargs: None
'''
ALL_GRADED = ["predict_tests", "my_rows_tests", "gather_tests", "gather_comm_tests",
              "recall_ranks", "recall_group_sum", "recall_backend", "recall_failure"]

VARIANTS = [
    # A wrong my_rows costs exercise 1 only: exercise 2 is graded with the library's split.
    {"name": "rows dropped when n does not divide",
     "replace": {"my_rows": DROPS_THE_REMAINDER}, "loses": ["my_rows_tests"],
     "visible": ["my_rows_tests"], "visible_says": ["every row must appear exactly once"]},
    {"name": "neighbouring ranks share a row",
     "replace": OVERLAPPING_ROWS, "loses": ["my_rows_tests"], "visible": ["my_rows_tests"]},
    {"name": "my_rows hands over to dl.models.shard_range (switched off while graded)",
     "replace": {"my_rows": CALLS_THE_LIBRARY}, "loses": ["my_rows_tests"],
     "visible": ["my_rows_tests"], "visible_says": ["switched off"]},
    {"name": "all_reduce where all_gather belongs",
     "replace": {"gather": ALL_REDUCE_INSTEAD_OF_ALL_GATHER},
     "loses": ["gather_tests", "gather_comm_tests"],
     "visible": ["gather_tests", "gather_comm_tests"],
     "visible_says": ["every position holds the total", "an all_reduce where an all_gather"]},
    {"name": "right numbers, an all_reduce of every rank's slot (N numbers in, not one)",
     "replace": {"gather": ALL_REDUCE_OF_SLOTS}, "loses": ["gather_comm_tests"],
     "visible": ["gather_comm_tests"], "visible_says": ["an all_reduce where an all_gather"]},
    {"name": "right numbers, one broadcast per rank instead of one all_gather",
     "replace": {"gather": ONE_BROADCAST_PER_RANK}, "loses": ["gather_comm_tests"],
     "visible": ["gather_comm_tests"], "visible_says": ["a single dist.all_gather"]},
    {"name": "the other rank's part as the total minus mine: right on 2 ranks only",
     "replace": {"gather": TWO_RANK_THINKING}, "loses": ["gather_tests", "gather_comm_tests"],
     "visible": ["gather_tests", "gather_comm_tests"], "visible_says": ["3 ranks"]},
    {"name": "gathers, then ignores what arrived",
     "replace": ONLY_MY_OWN_PART, "loses": ["gather_tests"], "visible": ["gather_tests"],
     "visible_says": ["this rank's own part"]},
    {"name": "prediction: every rank appends to the notebook's one list",
     "replace": {"predict": "predicted_returned = [1, 2, 3]\npredicted_seen = [0, 1, 2]"},
     "loses": ["predict_tests"]},
    {"name": "recall: ranks numbered from 1",
     "replace": _edit("recall", ("q_ranks = [0, 1, 2, 3]", "q_ranks = [1, 2, 3, 4]")),
     "loses": ["recall_ranks"]},
    {"name": "recall: a group's all-reduce sums every rank",
     "replace": _edit("recall", ("q_group_sum = 9", "q_group_sum = 15")),
     "loses": ["recall_group_sum"]},
    {"name": "recall: nccl with fewer GPUs than ranks",
     "replace": _edit("recall", ('q_backend = "gloo"', 'q_backend = "nccl"')),
     "loses": ["recall_backend"]},
    {"name": "recall: a rank that skips a collective and returns is reported as failed",
     "replace": {"recall_failure_answer": 'q_failure = "a"'}, "loses": ["recall_failure"]},
    {"name": "replaces dl.check.comm with a do-nothing function",
     "replace": {"gather": GRADER_REPLACED}, "loses": ALL_GRADED},
    {"name": "replaces dl.check.comm through the module's __dict__",
     "replace": {"gather": GRADER_REPLACED_BEHIND_ITS_BACK}, "loses": ALL_GRADED},
]
