"""Wrong answers to 05_hybrid, and the graded cells each must lose (all others keep points)."""

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

# -- exercise 2: process groups ----------------------------------------------------------------------

ONLY_OWN_GROUPS = '''
def make_groups(dp: int, tp: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    me = dist.get_rank()
    mine = {}
    for kind, groups in (("dp", dp_groups(dp, tp)), ("tp", tp_groups(dp, tp))):
        for ranks in groups:
            if me in ranks:
                group = dist.new_group(list(ranks))
                dl.name_group(group, kind)
                mine[kind] = group
    return mine["dp"], mine["tp"]
'''

GROUPS_NOT_NAMED = '''
def make_groups(dp: int, tp: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    me = dist.get_rank()
    mine = {}
    for kind, groups in (("dp", dp_groups(dp, tp)), ("tp", tp_groups(dp, tp))):
        for ranks in groups:
            group = dist.new_group(list(ranks))
            if me in ranks:
                mine[kind] = group
    return mine["dp"], mine["tp"]
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


def _train(shard: str = "dl.models.shard(idx, dp_rank, dp)",
           shard_targets: str = "dl.models.shard(targets, dp_rank, dp)",
           groups: str = "make_groups(dp, tp)",
           loss: str = "dl.tp.tp_lm_loss(model(idx), targets, tp_group)") -> str:
    return f'''
def train_hybrid(dp: int, tp: int, steps: int = 3, seed: int = 0) -> dict:
    dp_group, tp_group = {groups}
    dp_rank, dev = dist.get_rank(dp_group), dl.device()
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
    "dl.models.shard(idx, dist.get_rank(), dist.get_world_size())",
    "dl.models.shard(targets, dist.get_rank(), dist.get_world_size())")
TRAIN_WITHOUT_DATA_SPLIT = _train("idx", "targets")
TRAIN_DENSE_LOSS_ON_SHARDS = _train(loss="dl.models.lm_loss(model(idx), targets)")
TRAIN_WITH_PROCESS_GRID = _train(
    groups="(lambda g: (g.dp_group, g.tp_group))(dl.ProcessGrid(dp=dp, tp=tp))")

_HYBRID = ["hybrid_numbers_tests", "hybrid_comm_tests"]

VARIANTS = [
    {"name": "dp and tp swapped: tp groups of non-neighbours",
     "replace": {"groups": GROUPS_SWAPPED},
     "loses": ["groups_tests", "make_groups_tests", *_HYBRID]},
    {"name": "stride dp instead of tp (right only when dp == tp)",
     "replace": {"groups": GROUPS_STRIDE_DP},
     "loses": ["groups_tests", "make_groups_tests", "hybrid_numbers_tests"]},
    {"name": "each rank creates only its own groups (hang or wrong partner, ended by timeout)",
     "replace": {"make_groups": ONLY_OWN_GROUPS},
     "loses": ["make_groups_tests", *_HYBRID]},
    {"name": "groups not named dp / tp",
     "replace": {"make_groups": GROUPS_NOT_NAMED}, "loses": ["make_groups_tests"]},
    {"name": "gradient all-reduce on the world group",
     "replace": {"sync": SYNC_ON_WORLD}, "loses": _HYBRID},
    {"name": "average over the world size instead of the dp size",
     "replace": {"sync": SYNC_DIVIDES_BY_WORLD}, "loses": ["hybrid_numbers_tests"]},
    {"name": "sum instead of average",
     "replace": {"sync": SYNC_SUM_ONLY}, "loses": ["hybrid_numbers_tests"]},
    {"name": "gradient all-reduce on the tp group instead of the dp group",
     "replace": {"sync": SYNC_ON_TP_GROUP}, "loses": _HYBRID},
    {"name": "tp-sharded gradients also averaged over the tp group",
     "replace": {"sync": SYNC_ALSO_OVER_TP}, "loses": _HYBRID},
    {"name": "one all-reduce per parameter tensor (right numbers, many small messages)",
     "replace": {"sync": SYNC_PER_TENSOR}, "loses": ["hybrid_comm_tests"]},
    {"name": "gradient sync forgotten",
     "replace": {"sync": SYNC_FORGOTTEN}, "loses": _HYBRID},
    {"name": "batch split over all ranks (tp ranks see different samples)",
     "replace": {"train": TRAIN_SHARDS_BY_GLOBAL_RANK}, "loses": ["hybrid_numbers_tests"]},
    {"name": "batch not split: every rank trains on the whole batch",
     "replace": {"train": TRAIN_WITHOUT_DATA_SPLIT}, "loses": ["hybrid_numbers_tests"]},
    {"name": "dense loss on vocab-sharded logits",
     "replace": {"train": TRAIN_DENSE_LOSS_ON_SHARDS}, "loses": _HYBRID},
    {"name": "library's ProcessGrid instead of own groups",
     "replace": {"train": TRAIN_WITH_PROCESS_GRID}, "loses": _HYBRID},
    {"name": "recall 1: groups of rank 5 swapped",
     "replace": {"recall_1": "q_tp_group_of_5 = (1, 3, 5, 7)\nq_dp_group_of_5 = (4, 5)"},
     "loses": ["recall_1_tests"]},
    {"name": "recall 2: batch split over every rank",
     "replace": {"recall_2": "q_samples_per_rank = 16"}, "loses": ["recall_2_tests"]},
    {"name": "recall 3: tp group identical",
     "replace": {"recall_3": 'q_identical = "c"'}, "loses": ["recall_3_tests"]},
    {"name": "recall 4: new_group needs consecutive ranks",
     "replace": {"recall_4": 'q_why_neighbours = "b"'}, "loses": ["recall_4_tests"]},
    {"name": "recall 5: dp busiest",
     "replace": {"recall_5": 'q_busiest_group = "dp"'}, "loses": ["recall_5_tests"]},
    {"name": "recall 6: next stage is the next rank",
     "replace": {"recall_6": "q_next_stage_of_1 = 2"}, "loses": ["recall_6_tests"]},
    {"name": "recall 7: only own groups works",
     "replace": {"recall_7": 'q_new_group = "a"'}, "loses": ["recall_7_tests"]},
]
