"""Wrong answers to 05_hybrid, and the graded cells each must lose (all others keep points)."""

from tests.course_variants import solution_editor

# -- exercise 1: the groups of a dp x tp x pp grid ---------------------------------------------

_edit = solution_editor("05_hybrid")

_RIGHT_PP = '''

def pp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return [tuple((s * dp + d) * tp + t for s in range(pp)) for d in range(dp) for t in range(tp)]
'''

GROUPS_SWAPPED = {"groups": '''
def dp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return [tuple((s * dp + d) * tp + t for t in range(tp)) for s in range(pp) for d in range(dp)]


def tp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return [tuple((s * dp + d) * tp + t for d in range(dp)) for s in range(pp) for t in range(tp)]
''' + _RIGHT_PP}

# a dp group's step written with dp instead of tp: right only when dp == tp
GROUPS_STRIDE_DP = _edit("groups", ("tuple((s * dp + d) * tp + t for d in range(dp))",
                                    "tuple(s * dp * tp + d * dp + t for d in range(dp))"))

# every tp-th rank of the whole world: a dp group through every stage (right only when pp == 1)
DP_GROUPS_ACROSS_STAGES = _edit(
    "groups", ("return [tuple((s * dp + d) * tp + t for d in range(dp)) for s in range(pp) "
               "for t in range(tp)]",
               "return [tuple(range(t, dp * tp * pp, tp)) for t in range(tp)]"))

# a consistent numbering with the stages inside dp (dp slowest): right only when pp == 1
GROUPS_DP_SLOWEST = {"groups": '''
def _rank(s, d, t, dp, tp, pp):
    return (d * pp + s) * tp + t


def dp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return sorted(tuple(_rank(s, d, t, dp, tp, pp) for d in range(dp))
                  for s in range(pp) for t in range(tp))


def tp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return sorted(tuple(_rank(s, d, t, dp, tp, pp) for t in range(tp))
                  for s in range(pp) for d in range(dp))


def pp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return sorted(tuple(_rank(s, d, t, dp, tp, pp) for s in range(pp))
                  for d in range(dp) for t in range(tp))
'''}

# the library's layout instead of one's own (switched off while the check runs)
GROUPS_FROM_THE_LIBRARY = {"groups": '''
def dp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return dl.GridLayout(dp=dp, tp=tp, pp=pp).groups("dp")


def tp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return dl.GridLayout(dp=dp, tp=tp, pp=pp).groups("tp")


def pp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return dl.GridLayout(dp=dp, tp=tp, pp=pp).groups("pp")
'''}

# right, written another way: blocks and strides of ranges
GROUPS_ANOTHER_WAY = {"groups": '''
def dp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    block = dp * tp
    return [tuple(range(first + t, first + block, tp))
            for first in range(0, block * pp, block) for t in range(tp)]


def tp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return [tuple(range(first, first + tp)) for first in range(0, dp * tp * pp, tp)]


def pp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return [tuple(range(r, dp * tp * pp, dp * tp)) for r in range(dp * tp)]
'''}

# right, written another way: each rank's coordinates by divmod, grouped by the other two
GROUPS_FROM_COORDINATES = {"groups": '''
def _grouped(dp, tp, pp, kind):
    out = {}
    for rank in range(dp * tp * pp):
        stage, rest = divmod(rank, dp * tp)
        place = {"pp": stage, "dp": rest // tp, "tp": rest % tp}
        key = tuple(v for k, v in place.items() if k != kind)
        out.setdefault(key, []).append(rank)
    return sorted(tuple(g) for g in out.values())


def dp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return _grouped(dp, tp, pp, "dp")


def tp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return _grouped(dp, tp, pp, "tp")


def pp_groups(dp: int, tp: int, pp: int = 1) -> list[tuple[int, ...]]:
    return _grouped(dp, tp, pp, "pp")
'''}

# the right ranks, not in the spec's form: lists, ranks and groups in reverse order
GROUPS_AS_REVERSED_LISTS = _edit(
    "groups", ("return [tuple((s * dp + d) * tp + t for d in range(dp)) for s in range(pp) "
               "for t in range(tp)]",
               "return [list((s * dp + d) * tp + t for d in reversed(range(dp))) "
               "for s in reversed(range(pp)) for t in reversed(range(tp))]"))

GROUPS_IN_REVERSE = _edit(
    "groups", ("return [tuple((s * dp + d) * tp + t for d in range(dp)) for s in range(pp) "
               "for t in range(tp)]",
               "return [tuple((s * dp + d) * tp + t for d in range(dp)) for s in range(pp) "
               "for t in reversed(range(tp))]"))

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

# every group created, but each rank's own group first: the count means different groups
OWN_GROUP_FIRST = _edit(
    "make_groups", ("        for ranks in groups:",
                    "        for ranks in sorted(groups, key=lambda g: me not in g):"))

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


def _sync(reduce: str, divide: str = "flat /= dist.get_world_size(group)") -> str:
    return f'''
def sync_gradients(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    {reduce}
    {divide}
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
'''


SYNC_ON_WORLD = {"sync": _sync("dist.all_reduce(flat)", "flat /= dist.get_world_size()")}
SYNC_DIVIDES_BY_WORLD = {"sync": _sync("dist.all_reduce(flat, group=group)",
                                       "flat /= dist.get_world_size()")}
SYNC_SUM_ONLY = {"sync": _sync("dist.all_reduce(flat, group=group)", "pass")}

SYNC_PER_TENSOR = {"sync": '''
def sync_gradients(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)
'''}

SYNC_FORGOTTEN = {"sync": '''
def sync_gradients(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    pass
'''}

# right, written another way: divided first (exact: a power of two), torch's flatten helpers
SYNC_PREDIVIDED = {"sync": '''
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def sync_gradients(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads) / dist.get_world_size(group)
    dist.all_reduce(flat, group=group)
    for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(avg)
'''}

# -- exercise 3: the training step ---------------------------------------------------------------

_SHARD = ("idx = dl.models.shard_batch(idx, dp_rank, dp).to(dev)",
          "targets = dl.models.shard_batch(targets, dp_rank, dp).to(dev)")

TRAIN_SHARDS_BY_GLOBAL_RANK = _edit(
    "train", (_SHARD[0], "idx = dl.models.shard_batch(idx, dist.get_rank(), "
                         "dist.get_world_size()).to(dev)"),
    (_SHARD[1], "targets = dl.models.shard_batch(targets, dist.get_rank(), "
                "dist.get_world_size()).to(dev)"))
TRAIN_SHARDS_BY_TP_PLACE = _edit(
    "train", (_SHARD[0], "idx = dl.models.shard_batch(idx, dist.get_rank(tp_group), "
                         "dist.get_world_size(tp_group)).to(dev)"),
    (_SHARD[1], "targets = dl.models.shard_batch(targets, dist.get_rank(tp_group), "
                "dist.get_world_size(tp_group)).to(dev)"))
TRAIN_WITHOUT_DATA_SPLIT = _edit("train", (_SHARD[0], "idx = idx.to(dev)"),
                                 (_SHARD[1], "targets = targets.to(dev)"))
TRAIN_DENSE_LOSS_ON_SHARDS = _edit(
    "train", ("dl.tp.vocab_parallel_cross_entropy(model(idx), targets, tp_group)",
              "dl.models.lm_loss(model(idx), targets)"))
# the gradient average on the tp group, as the tensor-parallel layers use it
SYNC_ON_TP_GROUP = _edit("train", ("sync_gradients(model, dp_group)",
                                   "sync_gradients(model, tp_group)"))
SYNC_ALSO_OVER_TP = _edit("train", ("sync_gradients(model, dp_group)",
                                    "sync_gradients(model, dp_group)\n"
                                    "        sync_gradients(model, tp_group)"))
# the model split over the dp group, the loss too
MODEL_SPLIT_OVER_DP = _edit(
    "train", ("TinyGPT(SMALL, seed=seed), tp_group)", "TinyGPT(SMALL, seed=seed), dp_group)"),
    ("model(idx), targets, tp_group)", "model(idx), targets, dp_group)"))
_STEP = ("""        sync_gradients(model, dp_group)
        if first_grads is None:
            first_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
""")
# the update before the gradient average (the averaged gradients are then returned)
SYNC_AFTER_THE_UPDATE = _edit("train", (_STEP, """        optimizer.step()
        sync_gradients(model, dp_group)
        if first_grads is None:
            first_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
"""))
# right, written another way: chunks of the batch by the dp place from the grid's coordinates
TRAIN_BY_CHUNKS = _edit(
    "train", (_SHARD[0], "idx = idx.chunk(dp)[dist.get_rank() // dist.get_world_size(tp_group)]"
                         ".to(dev)"),
    (_SHARD[1], "targets = targets.chunk(dp)[dist.get_rank() // "
                "dist.get_world_size(tp_group)].to(dev)"))

_NUMBERS, _COMM = ["hybrid_numbers_tests"], ["hybrid_comm_tests"]
_HYBRID = [*_NUMBERS, *_COMM]


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


VARIANTS = [
    # exercise 1; each loses only its own cell: exercises 2 and 3 are graded on the library's
    # rank lists and groups, so a wrong numbering is not paid for again there
    _seen({"name": "dp and tp swapped: tp groups of non-neighbours",
           "replace": GROUPS_SWAPPED, "loses": ["groups_tests"],
           "visible_says": ["these are the tp groups", "grid.swapped"]}),
    _seen({"name": "a dp group's step written with dp (right only when dp == tp)",
           "replace": GROUPS_STRIDE_DP, "loses": ["groups_tests"],
           "visible_says": ["do not split the 6 ranks", "grid.stride"]}),
    _seen({"name": "dp groups through every stage (right only when pp == 1)",
           "replace": DP_GROUPS_ACROSS_STAGES, "loses": ["groups_tests"],
           "visible_says": ["a dp group stays inside its stage", "grid.stage"]}),
    _seen({"name": "a consistent numbering with dp slowest (right only when pp == 1)",
           "replace": GROUPS_DP_SLOWEST, "loses": ["groups_tests"],
           "visible_says": ["pp varies slowest", "grid.axis_order"]}),
    _seen({"name": "the library's GridLayout instead of one's own",
           "replace": GROUPS_FROM_THE_LIBRARY, "loses": ["groups_tests"],
           "visible_says": ["is switched off here"]}),
    _seen({"name": "the right ranks as lists, each reversed, the groups in reverse order",
           "replace": GROUPS_AS_REVERSED_LISTS, "loses": ["groups_tests"],
           "visible_says": ["grid.spec_form"]}),
    _seen({"name": "the right tuples, the groups in reverse order",
           "replace": GROUPS_IN_REVERSE, "loses": ["groups_tests"],
           "visible_says": ["in another order"]}),
    # exercise 2; loses only its own cell: exercise 3 trains on dl.ProcessGrid's groups
    _seen({"name": "each rank creates only its own groups (hang or wrong partner)",
           "replace": {"make_groups": ONLY_OWN_GROUPS}, "loses": ["make_groups_tests"],
           "visible_says": ["not every rank created every group in the same order"]}),
    _seen({"name": "every group created, but each rank's own group first",
           "replace": OWN_GROUP_FIRST, "loses": ["make_groups_tests"],
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
           "replace": SYNC_ON_WORLD, "loses": _HYBRID,
           "visible_says": ["hybrid.sync_group"]}),
    _seen({"name": "average over the world size instead of the group's size",
           "replace": SYNC_DIVIDES_BY_WORLD, "loses": _NUMBERS,
           "visible_says": ["every element is 1/2 of the reference"]}),
    _seen({"name": "sum instead of average",
           "replace": SYNC_SUM_ONLY, "loses": _NUMBERS,
           "visible_says": ["every element is 2x the reference"]}),
    _seen({"name": "gradient average on the tp group instead of the dp group",
           "replace": SYNC_ON_TP_GROUP, "loses": _HYBRID,
           "visible_says": ["went to group tp instead of", "hybrid.sync_group"]}),
    _seen({"name": "tp-sharded gradients also averaged over the tp group",
           "replace": SYNC_ALSO_OVER_TP, "loses": _HYBRID,
           "visible_says": ["Only the tensors split over the tp group are wrong"]}),
    _seen({"name": "one all-reduce per parameter tensor (right numbers, many small messages)",
           "replace": SYNC_PER_TENSOR, "loses": _COMM,
           "visible_says": ["exactly one all-reduce per step", "issued once per parameter"]}),
    _seen({"name": "gradient sync forgotten",
           "replace": SYNC_FORGOTTEN, "loses": _HYBRID}),
    _seen({"name": "the update before the gradient average",
           "replace": SYNC_AFTER_THE_UPDATE, "loses": _NUMBERS,
           "visible_says": ["hybrid.step_order"]}),
    _seen({"name": "batch split over all ranks (tp ranks see different samples)",
           "replace": TRAIN_SHARDS_BY_GLOBAL_RANK, "loses": _NUMBERS,
           "visible_says": ["the ranks of a tp group must see the same samples"]}),
    _seen({"name": "batch split by the tp place (a tp group's ranks see different samples)",
           "replace": TRAIN_SHARDS_BY_TP_PLACE, "loses": _NUMBERS,
           "visible_says": ["the ranks of a tp group must see the same samples"]}),
    _seen({"name": "batch not split: every rank trains on the whole batch",
           "replace": TRAIN_WITHOUT_DATA_SPLIT, "loses": _NUMBERS,
           "visible_says": ["every rank trained on the whole batch"]}),
    _seen({"name": "dense loss on vocab-sharded logits",
           "replace": TRAIN_DENSE_LOSS_ON_SHARDS, "loses": _HYBRID}),
    _seen({"name": "the model split over the dp group",
           "replace": MODEL_SPLIT_OVER_DP, "loses": _HYBRID,
           "visible_says": ["hybrid.model_group"]}),
    # right answers written another way keep every point: the checks test behaviour
    {"name": "right: groups from blocks and strides of ranges",
     "replace": GROUPS_ANOTHER_WAY, "loses": []},
    {"name": "right: groups from each rank's coordinates",
     "replace": GROUPS_FROM_COORDINATES, "loses": []},
    {"name": "right: every rank creates the tp groups first, then the dp groups",
     "replace": {"make_groups": TP_GROUPS_FIRST}, "loses": []},
    {"name": "right: gradients divided first, torch's flatten helpers",
     "replace": SYNC_PREDIVIDED, "loses": []},
    {"name": "right: the batch in chunks by the dp place from the global rank",
     "replace": TRAIN_BY_CHUNKS, "loses": []},
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
    {"name": "recall 5: the numbering only renames the groups",
     "replace": {"recall_neighbours": 'q_why_neighbours = "a"'},
     "loses": ["recall_neighbours_tests"]},
    {"name": "recall 6: next stage is the next rank",
     "replace": {"recall_next_stage": "q_next_stage_of_6 = 7"},
     "loses": ["recall_next_stage_tests"]},
    {"name": "recall 7: creating every group is enough, whatever the order",
     "replace": {"recall_new_group": 'q_new_group = "b"'}, "loses": ["recall_new_group_tests"]},
    {"name": "recall 3: the ring's wire bytes instead of the buffer",
     "replace": {"recall_dp_bytes": "q_dp_allreduce_gb = 9.375"},
     "loses": ["recall_dp_bytes_tests"]},
]
