"""Broken variants of 11_expert_parallel: classic mistakes the grader must catch.

Each variant is a solution cell with one mistake written in, as an exact edit of the solution
notebook's source (or a whole cell where the mistake is a different design). `loses` lists
exactly the graded cells that must score zero; `visible` the test cells a learner can run that
must already fail, with `visible_says` words. Expert parallel is graded with the library's
routing, and its numbers and its messages are separate cells, so an all-gather in place of
the all-to-alls (right numbers, wrong communication) loses only the communication.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("11_expert_parallel")

EP = ["expert_parallel_numbers_tests", "expert_parallel_comm_tests"]


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


# -- exercise 2: expert parallel ------------------------------------------------------------------

EP_BY_ALL_GATHER = '''
def expert_parallel(buf, experts, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    e, c, d = buf.shape
    local = e // n
    every = [torch.empty_like(buf) for _ in range(n)]
    dist.all_gather(every, buf.contiguous(), group=group)
    mine = torch.stack([b[me * local:(me + 1) * local] for b in every], dim=1)
    y = experts(mine.reshape(local, n * c, d)).view(local, n, c, d)
    outs = [torch.empty_like(y) for _ in range(n)]
    dist.all_gather(outs, y.contiguous(), group=group)
    return torch.cat([o[:, me] for o in outs], dim=0)
'''

EP_BY_ALL_REDUCE = '''
def expert_parallel(buf, experts, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    e, c, d = buf.shape
    local = e // n
    every = buf.new_zeros(n, e, c, d)
    every[me] = buf
    dist.all_reduce(every, group=group)                 # every rank's buffer, everywhere
    mine = every[:, me * local:(me + 1) * local].transpose(0, 1).reshape(local, n * c, d)
    y = experts(mine).view(local, n, c, d)
    outs = y.new_zeros(n, e, c, d)
    outs[:, me * local:(me + 1) * local] = y.transpose(0, 1)
    dist.all_reduce(outs, group=group)
    return outs[me]
'''

# right, written another way: the list form of all_to_all
EP_WITH_LISTS = '''
def expert_parallel(buf, experts, group):
    n = dist.get_world_size(group)
    e, c, d = buf.shape
    local = e // n
    arrived = [torch.empty(local, c, d, dtype=buf.dtype, device=buf.device) for _ in range(n)]
    dist.all_to_all(arrived, [p.contiguous() for p in buf.split(local)], group=group)
    y = experts(torch.cat(arrived, dim=1))                 # (local, n c, d), source by source
    back = [torch.empty(local, c, d, dtype=buf.dtype, device=buf.device) for _ in range(n)]
    dist.all_to_all(back, [p.contiguous() for p in y.split(c, dim=1)], group=group)
    return torch.cat(back, dim=0)
'''

# -- exercise 1: routing --------------------------------------------------------------------------

ROUTE_BY_LOOPS = '''
def route(probs, top_k, capacity_factor):
    tokens, n_experts = probs.shape
    capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)
    gate, expert = probs.topk(top_k, dim=-1)
    used = [0] * n_experts
    rows = []
    for choice in range(top_k):
        for t in range(tokens):
            e = int(expert[t, choice])
            rows.append((t, e, gate[t, choice], e * capacity + used[e], used[e] < capacity))
            used[e] += 1
    token, exp, g, slot, kept = zip(*rows)
    return dl.moe.Routing(torch.tensor(token), torch.tensor(exp), torch.stack(g),
                          torch.tensor(slot), torch.tensor(kept), capacity)
'''

VARIANTS = [
    # -- 1 routing --------------------------------------------------------------------------------
    _seen({"name": "no capacity: nothing is dropped",
           "replace": _edit("route", ("kept = place < capacity",
                                      "kept = torch.ones_like(place, dtype=torch.bool)")),
           "loses": ["route_tests"], "visible_says": ["nothing was dropped"]}),
    _seen({"name": "token-major priority: a token's second choice before the next first choice",
           "replace": _edit("route", ("expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)",
                                      "expert, gate = expert.reshape(-1), gate.reshape(-1)"),
                            ("token = torch.arange(tokens, device=probs.device).repeat(top_k)",
                             "token = torch.arange(tokens, device=probs.device)"
                             ".repeat_interleave(top_k)")),
           "loses": ["route_tests"], "visible_says": ["in another order"]}),
    _seen({"name": "capacity rounded down (right only when it divides evenly)",
           "replace": _edit("route", ("capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)",
                                      "capacity = int(capacity_factor * tokens * top_k / n_experts)")),
           "loses": ["route_tests"], "visible_says": ["rounds up"]}),
    _seen({"name": "top-k gates renormalised to sum to 1 (GShard's and Mixtral's choice, not this one)",
           "replace": _edit("route", ("gate, expert = probs.topk(top_k, dim=-1)\n",
                                      "gate, expert = probs.topk(top_k, dim=-1)\n"
                                      "    gate = gate / gate.sum(dim=-1, keepdim=True)\n")),
           "loses": ["route_tests"], "visible_says": ["renormalised gates"]}),
    _seen({"name": "the right assignments in other slots (place-major buffer rows)",
           "replace": _edit("route", ("expert * capacity + place, kept", "place * n_experts + expert, kept")),
           "loses": ["route_tests"], "visible_says": ["in other slots"]}),
    _seen({"name": "the library's routing (switched off while graded)",
           "replace": {"route": "def route(probs, top_k, capacity_factor):\n"
                                "    return dl.moe.route(probs, top_k, capacity_factor)\n"},
           "loses": ["route_tests"], "visible_says": ["is switched off here"]}),
    {"name": "right: routing by loops, one counter per expert",
     "replace": {"route": ROUTE_BY_LOOPS}, "loses": []},
    # -- 2 expert parallel --------------------------------------------------------------------------
    _seen({"name": "all-gather of the buffers instead of all-to-all (right numbers)",
           "replace": {"expert_parallel": EP_BY_ALL_GATHER},
           "loses": ["expert_parallel_comm_tests"], "visible_says": ["N times the bytes"]}),
    _seen({"name": "all-reduce of zero-padded buffers where all-to-all belongs (right numbers)",
           "replace": {"expert_parallel": EP_BY_ALL_REDUCE},
           "loses": ["expert_parallel_comm_tests"], "visible_says": ["all_reduce of the whole"]}),
    _seen({"name": "rows not regrouped by expert after the dispatch (no transpose)",
           "replace": _edit("expert_parallel",
                            ("h = arrived.view(n, local, c, d).transpose(0, 1).reshape(",
                             "h = arrived.view(n, local, c, d).reshape("),
                            ("y = experts(h).view(local, n, c, d).transpose(0, 1).reshape(",
                             "y = experts(h).view(local, n, c, d).reshape(")),
           "loses": ["expert_parallel_numbers_tests"], "visible_says": ["hands its parts over in rank order"]}),
    _seen({"name": "no combine: the results stay where the experts are",
           "replace": _edit("expert_parallel",
                            ("    dist.all_to_all_single(back, y.contiguous(), group=group)\n"
                             "    return back", "    return y")),
           "loses": EP, "visible_says": ["second all-to-all"]}),
    _seen({"name": "all_to_all_single without group=: over the world, not the ep group",
           "replace": _edit("expert_parallel",
                            ("dist.all_to_all_single(arrived, buf.contiguous(), group=group)",
                             "dist.all_to_all_single(arrived, buf.contiguous())"),
                            ("dist.all_to_all_single(back, y.contiguous(), group=group)",
                             "dist.all_to_all_single(back, y.contiguous())")),
           "loses": EP, "visible_says": ["without a group runs over the", "(0,1,2,3) in the table"]}),
    {"name": "expert parallel over the world group instead of the ep group",
     "replace": _edit("expert_parallel", ("n = dist.get_world_size(group)",
                                          "group = dist.group.WORLD\n"
                                          "    n = dist.get_world_size(group)")),
     "loses": EP, "visible": EP},
    _seen({"name": "the library's all_to_all (switched off while graded)",
           "replace": _edit("expert_parallel",
                            ("    dist.all_to_all_single(arrived, buf.contiguous(), group=group)",
                             "    arrived = dl.moe.all_to_all(buf, group)")),
           "loses": EP, "visible_says": ["is switched off here"]}),
    {"name": "right: the list form of all_to_all",
     "replace": {"expert_parallel": EP_WITH_LISTS}, "loses": []},
    # -- recall ------------------------------------------------------------------------------------
    {"name": "recall 1: no capacity, every token kept",
     "replace": {"recall_dropped": "q_kept_tokens = 12"}, "loses": ["recall_dropped_tests"]},
    {"name": "recall 1: only the tokens of the crowded expert counted",
     "replace": {"recall_dropped": "q_kept_tokens = 3"}, "loses": ["recall_dropped_tests"]},
    {"name": "recall 2: the whole buffers, the rank's own part counted as sent",
     "replace": {"recall_dispatch_mb": "q_dispatch_mb = 83.9"},
     "loses": ["recall_dispatch_mb_tests"]},
    {"name": "recall 2: dispatch only, not combine",
     "replace": {"recall_dispatch_mb": "q_dispatch_mb = 36.7"},
     "loses": ["recall_dispatch_mb_tests"]},
    {"name": "recall 3: the ep group, which holds other experts",
     "replace": {"recall_expert_grads": 'q_expert_grads = "a"'},
     "loses": ["recall_expert_grads_tests"]},
    {"name": "recall 3: dp / ep ranks, the cp ranks left out",
     "replace": {"recall_expert_grads": 'q_expert_grads = "b"'},
     "loses": ["recall_expert_grads_tests"]},
]
