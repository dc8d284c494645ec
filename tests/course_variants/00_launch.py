"""Wrong answers to 00_launch, and the graded cells each must lose (all others keep points)."""

DROPS_THE_REMAINDER = '''
def my_rows(n: int, rank: int, world: int) -> range:
    size = n // world
    return range(rank * size, (rank + 1) * size)
'''

OVERLAPPING_ROWS = '''
def my_rows(n: int, rank: int, world: int) -> range:
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, min(n, start + base + 1))
'''

ALL_REDUCE_INSTEAD_OF_ALL_GATHER = '''
def gather_partial_sums(n: int) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    total = torch.tensor([float(sum(i * i for i in my_rows(n, rank, world)))],
                         dtype=torch.float64, device=dev)
    dist.all_reduce(total)
    return [total.item()] * world, total.item()
'''

ONE_BROADCAST_PER_RANK = '''
def gather_partial_sums(n: int) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    mine = float(sum(i * i for i in my_rows(n, rank, world)))
    partials = []
    for src in range(world):
        t = torch.tensor([mine if src == rank else 0.0], dtype=torch.float64, device=dev)
        dist.broadcast(t, src=src)
        partials.append(t.item())
    return partials, sum(partials)
'''

ONLY_MY_OWN_PART = '''
def gather_partial_sums(n: int) -> tuple[list[float], float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = dl.device()
    mine = torch.tensor([float(sum(i * i for i in my_rows(n, rank, world)))],
                        dtype=torch.float64, device=dev)
    parts = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(world)]
    dist.all_gather(parts, mine)
    return [mine.item()] * world, mine.item() * world
'''

WRONG_RECALL = '''
q_ranks = [1, 2, 3, 4]
q_notebook_list = True
q_failure = "a"
q_backend = "nccl"
'''

# Switching the grader off (integrity.py): the answer is wrong (a broadcast per rank instead of
# one all_gather) and the cell then tries to make the communication check pass anyway. The scan
# of the submitted cells zeroes every graded cell, so the feedback says why on each.
GRADER_REPLACED = ONE_BROADCAST_PER_RANK + '''
dl.check.comm = lambda *args, **kwargs: None
'''
GRADER_REPLACED_BEHIND_ITS_BACK = ONE_BROADCAST_PER_RANK + '''
dl.check.__dict__["comm"] = lambda *args, **kwargs: None
'''
ALL_GRADED = ["my_rows_tests", "gather_tests", "gather_comm_tests", "recall_ranks",
              "recall_notebook_list", "recall_failure", "recall_backend"]

VARIANTS = [
    {"name": "rows dropped when n does not divide",
     "replace": {"my_rows": DROPS_THE_REMAINDER}, "loses": ["my_rows_tests", "gather_tests"]},
    {"name": "neighbouring ranks share a row",
     "replace": {"my_rows": OVERLAPPING_ROWS}, "loses": ["my_rows_tests", "gather_tests"]},
    {"name": "all_reduce where all_gather belongs",
     "replace": {"gather": ALL_REDUCE_INSTEAD_OF_ALL_GATHER},
     "loses": ["gather_tests", "gather_comm_tests"]},
    {"name": "right numbers, one broadcast per rank instead of one all_gather",
     "replace": {"gather": ONE_BROADCAST_PER_RANK}, "loses": ["gather_comm_tests"]},
    {"name": "gathers, then ignores what arrived",
     "replace": {"gather": ONLY_MY_OWN_PART}, "loses": ["gather_tests"]},
    {"name": "every recall answer wrong",
     "replace": {"recall": WRONG_RECALL},
     "loses": ["recall_ranks", "recall_notebook_list", "recall_failure", "recall_backend"]},
    {"name": "replaces dl.check.comm with a do-nothing function",
     "replace": {"gather": GRADER_REPLACED}, "loses": ALL_GRADED},
    {"name": "replaces dl.check.comm through the module's __dict__",
     "replace": {"gather": GRADER_REPLACED_BEHIND_ITS_BACK}, "loses": ALL_GRADED},
]
