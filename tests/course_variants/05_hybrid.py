"""Wrong answers to 05_hybrid, and the graded cells each must lose (all others keep points)."""

from tests.course_variants import solution_editor

# -- exercise 1: the groups of a dp x tp grid ------------------------------------------------------

GROUPS_SWAPPED = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(d * tp + t for t in range(tp)) for d in range(dp)]


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(d * tp + t for d in range(dp)) for t in range(tp)]
'''

GROUPS_STRIDE_DP = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(d * dp + t for d in range(dp)) for t in range(tp)]


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(d * dp + t for t in range(tp)) for d in range(dp)]
'''

# the library's layout instead of the formula (switched off while the check runs)
GROUPS_FROM_THE_LIBRARY = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return dl.GridLayout(dp=dp, tp=tp).groups("dp")


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return dl.GridLayout(dp=dp, tp=tp).groups("tp")
'''

# right, written another way: strides and slices instead of the formula
GROUPS_ANOTHER_WAY = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(range(t, dp * tp, tp)) for t in range(tp)]


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    ranks = list(range(dp * tp))
    return [tuple(ranks[d * tp:(d + 1) * tp]) for d in range(dp)]
'''

# the right ranks, not in the spec's form: lists, ranks and groups in reverse order
GROUPS_AS_REVERSED_LISTS = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [list(range(t, dp * tp, tp))[::-1] for t in reversed(range(tp))]


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [list(range(d * tp, (d + 1) * tp)) for d in range(dp)]
'''

GROUPS_IN_REVERSE = '''
def dp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(range(t, dp * tp, tp)) for t in reversed(range(tp))]


def tp_groups(dp: int, tp: int) -> list[tuple[int, ...]]:
    return [tuple(range(d * tp, (d + 1) * tp)) for d in range(dp)]
'''

# -- exercise 2: process groups ----------------------------------------------------------------------

ONLY_OWN_GROUPS = '''
def make_groups(dp_ranks, tp_ranks):
    me = dist.get_rank()
    mine = {}
    for kind, groups in (("dp", dp_ranks), ("tp", tp_ranks)):
        for ranks in groups:
            if me in ranks:
                group = dist.new_group(list(ranks))
                dl.name_group(group, kind)
                mine[kind] = group
    return mine["dp"], mine["tp"]
'''

# the solution with one line changed: this rank's index in each group kept, not the group
RANKS_KEPT_INSTEAD_OF_GROUPS = solution_editor("05_hybrid")(
    "make_groups", ("                mine[kind] = group", "                mine[kind] = ranks.index(me)"))

GROUPS_NOT_NAMED = '''
def make_groups(dp_ranks, tp_ranks):
    me = dist.get_rank()
    mine = {}
    for kind, groups in (("dp", dp_ranks), ("tp", tp_ranks)):
        for ranks in groups:
            group = dist.new_group(list(ranks))
            if me in ranks:
                mine[kind] = group
    return mine["dp"], mine["tp"]
'''

# right: any order works, as long as every rank uses the same one
TP_GROUPS_FIRST = '''
def make_groups(dp_ranks, tp_ranks):
    made = {}
    for kind, groups in (("tp", tp_ranks), ("dp", dp_ranks)):
        for ranks in groups:
            group = dist.new_group(list(ranks))
            if dist.get_rank() in ranks:
                dl.name_group(group, kind)
                made[kind] = group
    return made["dp"], made["tp"]
'''

# the library's grid instead of one's own groups (switched off while the check runs)
GROUPS_FROM_PROCESS_GRID = '''
def make_groups(dp_ranks, tp_ranks):
    grid = dl.ProcessGrid(dp=len(dp_ranks[0]), tp=len(tp_ranks[0]))
    return grid.dp_group, grid.tp_group
'''

# -- exercise 3: the gradient sync -------------------------------------------------------------------


def _sync(reduce: str, divide: str = "flat /= dist.get_world_size(dp_group)") -> str:
    return f'''
def sync_gradients(model: torch.nn.Module, dp_group: dist.ProcessGroup) -> None:
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    {reduce}
    {divide}
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
'''


SYNC_ON_WORLD = _sync("dist.all_reduce(flat)", "flat /= dist.get_world_size()")
SYNC_DIVIDES_BY_WORLD = _sync("dist.all_reduce(flat, group=dp_group)",
                              "flat /= dist.get_world_size()")
SYNC_SUM_ONLY = _sync("dist.all_reduce(flat, group=dp_group)", "pass")
# the tp group, as the tensor-parallel layers hold it
SYNC_ON_TP_GROUP = _sync("dist.all_reduce(flat, group=model.blocks[0].mlp.fc1.group)",
                         "flat /= dist.get_world_size(model.blocks[0].mlp.fc1.group)")
SYNC_ALSO_OVER_TP = _sync(
    "dist.all_reduce(flat, group=dp_group)",
    "flat /= dist.get_world_size(dp_group)\n"
    "    dist.all_reduce(flat, group=model.blocks[0].mlp.fc1.group)\n"
    "    flat /= dist.get_world_size(model.blocks[0].mlp.fc1.group)")

SYNC_PER_TENSOR = '''
def sync_gradients(model: torch.nn.Module, dp_group: dist.ProcessGroup) -> None:
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= dist.get_world_size(dp_group)
'''

SYNC_FORGOTTEN = '''
def sync_gradients(model: torch.nn.Module, dp_group: dist.ProcessGroup) -> None:
    pass
'''

# -- exercise 3: the training step ---------------------------------------------------------------


def _train(shard: str = "dl.models.shard_batch(idx, dp_rank, dp)",
           shard_targets: str = "dl.models.shard_batch(targets, dp_rank, dp)",
           loss: str = "dl.tp.tp_lm_loss(model(idx), targets, tp_group)") -> str:
    return f'''
def train_hybrid(dp_group, tp_group, steps: int = 3, seed: int = 0) -> dict:
    dp, dp_rank, dev = dist.get_world_size(dp_group), dist.get_rank(dp_group), dl.device()
    model = dl.tp.parallelize_gpt(dl.models.TinyGPT(SMALL, seed=seed), tp_group).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, first_grads = [], None
    for step in range(steps):
        idx, targets = batch_for(step, seed)
        idx = {shard}.to(dev)
        targets = {shard_targets}.to(dev)
        optimizer.zero_grad()
        loss = {loss}
        loss.backward()
        sync_gradients(model, dp_group)
        if first_grads is None:
            first_grads = {{n: p.grad.detach().clone() for n, p in model.named_parameters()}}
        optimizer.step()
        losses.append(loss.item())
    return {{"losses": losses, "grads": first_grads,
            "params": {{n: p.detach().clone() for n, p in model.named_parameters()}}}}
'''


TRAIN_SHARDS_BY_GLOBAL_RANK = _train(
    "dl.models.shard_batch(idx, dist.get_rank(), dist.get_world_size())",
    "dl.models.shard_batch(targets, dist.get_rank(), dist.get_world_size())")
TRAIN_WITHOUT_DATA_SPLIT = _train("idx", "targets")
TRAIN_DENSE_LOSS_ON_SHARDS = _train(loss="dl.models.lm_loss(model(idx), targets)")

_HYBRID = ["hybrid_numbers_tests", "hybrid_comm_tests"]

_NUMBERS, _COMM = ["hybrid_numbers_tests"], ["hybrid_comm_tests"]
_HYBRID = [*_NUMBERS, *_COMM]


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


VARIANTS = [
    # exercise 1; each loses only its own cell: exercises 2 and 3 are graded on the library's
    # rank lists and groups, so a wrong formula is not paid for again there
    _seen({"name": "dp and tp swapped: tp groups of non-neighbours",
           "replace": {"groups": GROUPS_SWAPPED}, "loses": ["groups_tests"],
           "visible_says": ["rows and columns are swapped"]}),
    _seen({"name": "stride dp instead of tp (right only when dp == tp)",
           "replace": {"groups": GROUPS_STRIDE_DP}, "loses": ["groups_tests"],
           "visible_says": ["dp and tp mixed up in the arithmetic"]}),
    _seen({"name": "the library's GridLayout instead of the formula",
           "replace": {"groups": GROUPS_FROM_THE_LIBRARY}, "loses": ["groups_tests"],
           "visible_says": ["is switched off here"]}),
    _seen({"name": "the right ranks as lists, each reversed, the groups in reverse order",
           "replace": {"groups": GROUPS_AS_REVERSED_LISTS}, "loses": ["groups_tests"],
           "visible_says": ["grid.spec_form"]}),
    _seen({"name": "the right tuples, the groups in reverse order",
           "replace": {"groups": GROUPS_IN_REVERSE}, "loses": ["groups_tests"],
           "visible_says": ["in another order"]}),
    # exercise 2; loses only its own cell: exercise 3 trains on dl.ProcessGrid's groups
    _seen({"name": "each rank creates only its own groups (hang or wrong partner)",
           "replace": {"make_groups": ONLY_OWN_GROUPS}, "loses": ["make_groups_tests"],
           "visible_says": ["not every rank created every group in the same order"]}),
    _seen({"name": "keeps this rank's index in each group instead of the group",
           "replace": RANKS_KEPT_INSTEAD_OF_GROUPS, "loses": ["make_groups_tests"],
           "visible_says": ["grid.not_a_group"]}),
    _seen({"name": "groups not named dp / tp",
           "replace": {"make_groups": GROUPS_NOT_NAMED}, "loses": ["make_groups_tests"],
           "visible_says": ["dl.name_group"]}),
    _seen({"name": "the library's ProcessGrid instead of one's own groups",
           "replace": {"make_groups": GROUPS_FROM_PROCESS_GRID}, "loses": ["make_groups_tests"],
           "visible_says": ["is switched off here"]}),
    # exercise 3
    _seen({"name": "gradient all-reduce on the world group",
           "replace": {"sync": SYNC_ON_WORLD}, "loses": _HYBRID,
           "visible_says": ["average over the dp group only"]}),
    _seen({"name": "average over the world size instead of the dp size",
           "replace": {"sync": SYNC_DIVIDES_BY_WORLD}, "loses": _NUMBERS,
           "visible_says": ["every element is 1/2 of the reference"]}),
    _seen({"name": "sum instead of average",
           "replace": {"sync": SYNC_SUM_ONLY}, "loses": _NUMBERS,
           "visible_says": ["every element is 2x the reference"]}),
    _seen({"name": "gradient all-reduce on the tp group instead of the dp group",
           "replace": {"sync": SYNC_ON_TP_GROUP}, "loses": _HYBRID,
           "visible_says": ["went to group tp instead of"]}),
    _seen({"name": "tp-sharded gradients also averaged over the tp group",
           "replace": {"sync": SYNC_ALSO_OVER_TP}, "loses": _HYBRID,
           "visible_says": ["Only the tensors split over the tp group are wrong"]}),
    _seen({"name": "one all-reduce per parameter tensor (right numbers, many small messages)",
           "replace": {"sync": SYNC_PER_TENSOR}, "loses": _COMM,
           "visible_says": ["exactly one all-reduce per step", "issued once per parameter"]}),
    _seen({"name": "gradient sync forgotten",
           "replace": {"sync": SYNC_FORGOTTEN}, "loses": _HYBRID}),
    _seen({"name": "batch split over all ranks (tp ranks see different samples)",
           "replace": {"train": TRAIN_SHARDS_BY_GLOBAL_RANK}, "loses": _NUMBERS,
           "visible_says": ["the ranks of a tp group must see the same samples"]}),
    _seen({"name": "batch not split: every rank trains on the whole batch",
           "replace": {"train": TRAIN_WITHOUT_DATA_SPLIT}, "loses": _NUMBERS,
           "visible_says": ["every rank trained on the whole batch"]}),
    _seen({"name": "dense loss on vocab-sharded logits",
           "replace": {"train": TRAIN_DENSE_LOSS_ON_SHARDS}, "loses": _HYBRID}),
    # right answers written another way keep every point: the checks test behaviour
    {"name": "right: groups from strided ranges, dp groups in another order",
     "replace": {"groups": GROUPS_ANOTHER_WAY}, "loses": []},
    {"name": "right: every rank creates the tp groups first, then the dp groups",
     "replace": {"make_groups": TP_GROUPS_FIRST}, "loses": []},
    {"name": "right: a number within the stated 2 %",
     "replace": {"recall_dp_bytes": "q_dp_allreduce_gb = 5.07"}, "loses": []},
    # the prediction of section 4 and the recall questions (their visible tests check the
    # format only, so these are not marked visible)
    {"name": "prediction: the dp group carries the most",
     "replace": {"predict_traffic": 'q_traffic_order = ("dp", "tp", "pp")'},
     "loses": ["predict_traffic_tests"]},
    {"name": "recall 1: groups of rank 5 swapped",
     "replace": {"recall_groups": "q_tp_group_of_5 = (1, 5)\nq_dp_group_of_5 = (4, 5, 6, 7)"},
     "loses": ["recall_groups_tests"]},
    {"name": "recall 2: batch split over every rank",
     "replace": {"recall_samples": "q_samples_per_rank = 16"}, "loses": ["recall_samples_tests"]},
    {"name": "recall 3: the whole model's gradient",
     "replace": {"recall_dp_bytes": "q_dp_allreduce_gb = 40.0"},
     "loses": ["recall_dp_bytes_tests"]},
    {"name": "recall 3: divided by dp as well (ZeRO's share)",
     "replace": {"recall_dp_bytes": "q_dp_allreduce_gb = 0.3125"},
     "loses": ["recall_dp_bytes_tests"]},
    {"name": "recall 4: the tp group identical",
     "replace": {"recall_identical": 'q_identical = "b"'}, "loses": ["recall_identical_tests"]},
    {"name": "recall 5: new_group needs consecutive ranks",
     "replace": {"recall_neighbours": 'q_why_neighbours = "a"'},
     "loses": ["recall_neighbours_tests"]},
    {"name": "recall 6: next stage is the next rank",
     "replace": {"recall_next_stage": "q_next_stage_of_6 = 7"},
     "loses": ["recall_next_stage_tests"]},
    {"name": "recall 7: every rank simply waits forever",
     "replace": {"recall_new_group": 'q_new_group = "d"'}, "loses": ["recall_new_group_tests"]},
]
