"""Broken variants of 09_long_and_sparse: classic mistakes the grader must catch.

Each variant is a solution cell with one mistake written in, as an exact edit of the solution
notebook's source (or a whole cell where the mistake is a different design). `loses` lists
exactly the graded cells that must score zero; `visible` the test cells a learner can run that
must already fail, with `visible_says` words. A mistake in the online softmax costs only its own
cell: the ring is graded with the library's online softmax. The ring's numbers and its messages
are separate cells, so an all-gather of K/V (right numbers, wrong communication) loses only the
communication, and so does an all-gather in place of expert parallel's all-to-alls.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("09_long_and_sparse")

RING = ["ring_forward_numbers_tests", "ring_forward_comm_tests"]
EP = ["expert_parallel_numbers_tests", "expert_parallel_comm_tests"]
ZIGZAG = ["zigzag_forward_numbers_tests", "zigzag_forward_flops_tests"]


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


# -- exercise 1: the online softmax ---------------------------------------------------------------

SOFTMAX_ANOTHER_WAY = '''
def online_softmax_update(acc, m, l, s, v):
    new_m = torch.stack([m, s.max(dim=-1).values]).max(dim=0).values
    old_scale = (m - new_m).exp()
    w = (s - new_m[..., None]).exp()
    acc.copy_(acc * old_scale[..., None] + torch.einsum("...qk,...kd->...qd", w, v))
    l.copy_(l * old_scale + w.sum(dim=-1))
    m.copy_(new_m)
'''

# -- exercise 2: the ring ------------------------------------------------------------------------

RING_BY_ALL_GATHER = '''
def ring_attention_forward(q, k, v, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    every = [torch.empty_like(torch.stack([k, v])) for _ in range(n)]
    dist.all_gather(every, torch.stack([k, v]), group=group)
    acc = torch.zeros_like(q)
    m = q.new_full(q.shape[:-1], float("-inf"))
    l = q.new_zeros(q.shape[:-1])
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    for src in range(me + 1):
        s = q @ every[src][0].transpose(-1, -2) / math.sqrt(q.shape[-1])
        if src == me:
            s = s.masked_fill(future, float("-inf"))
        online_softmax_update(acc, m, l, s, every[src][1])
    return acc / l.unsqueeze(-1)
'''

# right, written another way: step <= me instead of src <= me, tril for the mask, the exchange
# posted first thing in each step and its handles waited at its end
RING_ANOTHER_WAY = '''
def ring_attention_forward(q, k, v, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    acc, m, l = torch.zeros_like(q), torch.zeros_like(q[..., 0]), torch.zeros_like(q[..., 0])
    m.fill_(float("-inf"))
    visible = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril()
    kv = torch.stack([k, v])
    for step in range(n):
        last = step == n - 1
        incoming = None if last else torch.empty_like(kv)
        pending = [] if last else post_exchange(kv, incoming, group)
        if step <= me:                       # the block of rank me - step: now or in the past
            s = torch.matmul(q, kv[0].transpose(-1, -2)) * q.shape[-1] ** -0.5
            if step == 0:
                s = torch.where(visible, s, torch.tensor(float("-inf"), dtype=s.dtype,
                                                         device=s.device))
            online_softmax_update(acc, m, l, s, kv[1])
        [w.wait() for w in pending]
        kv = kv if last else incoming
    return acc / l[..., None]
'''

# a ring that takes turns: each block's exchange waited for before the block is computed
RING_WAITS_FIRST = '''
def ring_attention_forward(q, k, v, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    acc = torch.zeros_like(q)
    m = q.new_full(q.shape[:-1], float("-inf"))
    l = q.new_zeros(q.shape[:-1])
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    kv = torch.stack([k, v])
    for step in range(n):
        src = (me - step) % n
        if step > 0:                          # fetch this step's block, then compute with it
            incoming = torch.empty_like(kv)
            for work in post_exchange(kv, incoming, group):
                work.wait()
            kv = incoming
        if src <= me:
            s = q @ kv[0].transpose(-1, -2) / math.sqrt(q.shape[-1])
            if src == me:
                s = s.masked_fill(future, float("-inf"))
            online_softmax_update(acc, m, l, s, kv[1])
    return acc / l.unsqueeze(-1)
'''

# -- exercise 4: the zig-zag ring -----------------------------------------------------------------

# right, written another way: pairs decided from the global positions of their first tokens
ZIGZAG_BY_POSITIONS = '''
def zigzag_ring_attention_forward(q, k, v, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    seq, half = q.shape[-2] * n, q.shape[-2] // 2
    q_pos = dl.cp.positions(seq, n, me, zigzag=True).to(q.device)
    state = [torch.zeros_like(q), q.new_full(q.shape[:-1], float("-inf")),
             q.new_zeros(q.shape[:-1])]
    kv = torch.stack([k, v])
    for step in range(n):
        nxt = torch.empty_like(kv) if step < n - 1 else None
        pending = post_exchange(kv, nxt, group) if nxt is not None else []
        k_pos = dl.cp.positions(seq, n, (me - step) % n, zigzag=True).to(q.device)
        for a in (0, half):
            for b in (0, half):
                qp, kp = q_pos[a:a + half], k_pos[b:b + half]
                if kp[0] > qp[-1]:
                    continue                                   # all in the future
                s = torch.einsum("...qd,...kd->...qk", q[..., a:a + half, :],
                                 kv[0][..., b:b + half, :]) / q.shape[-1] ** 0.5
                s = torch.where(kp[None, :] <= qp[:, None], s, float("-inf"))
                online_softmax_update(state[0][..., a:a + half, :], state[1][..., a:a + half],
                                      state[2][..., a:a + half], s, kv[1][..., b:b + half, :])
        for w in pending:
            w.wait()
        kv = nxt if nxt is not None else kv
    return state[0] / state[2][..., None]
'''

# -- exercise 6: expert parallel ------------------------------------------------------------------

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
    # -- 1 the online softmax -------------------------------------------------------------------
    _seen({"name": "acc and l not rescaled when the max grows",
           "replace": _edit("online_softmax",
                            ("l.mul_(rescale).add_(p.sum(dim=-1))", "l.add_(p.sum(dim=-1))"),
                            ("acc.mul_(rescale.unsqueeze(-1)).add_(p @ v)", "acc.add_(p @ v)")),
           "loses": ["online_softmax_tests"], "visible_says": ["were not rescaled"]}),
    _seen({"name": "new tensors instead of an update in place",
           "replace": _edit("online_softmax",
                            ("l.mul_(rescale).add_(p.sum(dim=-1))",
                             "l = l * rescale + p.sum(dim=-1)"),
                            ("acc.mul_(rescale.unsqueeze(-1)).add_(p @ v)",
                             "acc = acc * rescale.unsqueeze(-1) + p @ v"),
                            ("m.copy_(m_new)", "m = m_new")),
           "loses": ["online_softmax_tests"], "visible_says": ["in place"]}),
    _seen({"name": "exponentials against the old max (overflow to inf)",
           "replace": _edit("online_softmax", ("p = torch.exp(s - m_new.unsqueeze(-1))",
                                               "p = torch.exp(s - m.unsqueeze(-1))")),
           "loses": ["online_softmax_tests"], "visible_says": ["inf or nan"]}),
    _seen({"name": "the library's online softmax (switched off while graded)",
           "replace": {"online_softmax": "def online_softmax_update(acc, m, l, s, v):\n"
                                         "    dl.cp.online_softmax_update(acc, m, l, s, v)\n"},
           "loses": ["online_softmax_tests"], "visible_says": ["is switched off here"]}),
    _seen({"name": "no max subtracted and no rescaling (right while the scores are small)",
           "replace": _edit("online_softmax",
                            ("p = torch.exp(s - m_new.unsqueeze(-1))", "p = torch.exp(s)"),
                            ("l.mul_(rescale).add_(p.sum(dim=-1))", "l.add_(p.sum(dim=-1))"),
                            ("acc.mul_(rescale.unsqueeze(-1)).add_(p @ v)", "acc.add_(p @ v)")),
           "loses": ["online_softmax_tests"], "visible_says": ["inf or nan", "overflows above 709"]}),
    {"name": "right: the update written with stack, einsum and copy_",
     "replace": {"online_softmax": SOFTMAX_ANOTHER_WAY}, "loses": []},
    # -- 2 the ring --------------------------------------------------------------------------------
    _seen({"name": "all-gather of K/V instead of the ring (right numbers)",
           "replace": {"ring_forward": RING_BY_ALL_GATHER},
           "loses": ["ring_forward_comm_tests", "ring_forward_overlap_tests"],
           "visible_says": ["An all_gather of K/V gives the same numbers"]}),
    _seen({"name": "own block not masked: queries see later keys of their chunk",
           "replace": _edit("ring_forward", ("            if src == me:\n"
                                             "                s = s.masked_fill(",
                                             "            if src == -1:\n"
                                             "                s = s.masked_fill(")),
           "loses": ["ring_forward_numbers_tests"],
           "visible_says": ["whether a rank's queries may see"]}),
    _seen({"name": "no causality at all: every block attended in full",
           "replace": _edit("ring_forward",
                            ("if src <= me:   ", "if True:   "),
                            ("            if src == me:\n", "            if src == -1:\n")),
           "loses": ["ring_forward_numbers_tests", "ring_forward_comm_tests"],
           "visible_says": ["queries see future keys", "masked away entirely"]}),
    _seen({"name": "blocks wholly in the future multiplied out and masked away (right numbers)",
           "replace": _edit("ring_forward",
                            ("if src <= me:   ", "if True:   "),
                            ("                s = s.masked_fill(future, float(\"-inf\"))\n",
                             "                s = s.masked_fill(future, float(\"-inf\"))\n"
                             "            elif src > me:\n"
                             "                s = torch.full_like(s, float(\"-inf\"))\n")),
           "loses": ["ring_forward_comm_tests"], "visible_says": ["masked away entirely"],
           "visible_never_says": ["queries see future keys"]}),
    _seen({"name": "blocks from the right attended instead of those from the left",
           "replace": _edit("ring_forward", ("if src <= me:   ", "if src >= me:   ")),
           "loses": ["ring_forward_numbers_tests", "ring_forward_comm_tests"],
           "visible_says": ["which rank the block a rank holds started on"]}),
    _seen({"name": "the ring turns the wrong way: blocks taken as coming from the right",
           "replace": _edit("ring_forward", ("src = (me - step) % n", "src = (me + step) % n")),
           "loses": ["ring_forward_numbers_tests"], "visible_says": ["which rank the block a rank holds started on"]}),
    _seen({"name": "scores not scaled by 1/sqrt(d)",
           "replace": _edit("ring_forward", ("s = q @ kv[0].transpose(-1, -2) / math.sqrt(q.shape[-1])",
                                             "s = q @ kv[0].transpose(-1, -2)")),
           "loses": ["ring_forward_numbers_tests"], "visible_says": ["not scaled by 1/sqrt(d)"]}),
    _seen({"name": "no overlap: each block's exchange waited for before its compute",
           "replace": {"ring_forward": RING_WAITS_FIRST},
           "loses": ["ring_forward_overlap_tests"], "visible_says": ["no exchange was in flight"]}),
    _seen({"name": "no overlap: the next exchange posted only after the block's compute",
           "replace": _edit("ring_forward",
                            ("        works = []\n"
                             "        if step < n - 1:\n"
                             "            incoming = torch.empty_like(kv)\n"
                             "            works = post_exchange(kv, incoming, group)\n", ""),
                            ("        for work in works:\n",
                             "        works = []\n"
                             "        if step < n - 1:\n"
                             "            incoming = torch.empty_like(kv)\n"
                             "            works = post_exchange(kv, incoming, group)\n"
                             "        for work in works:\n")),
           "loses": ["ring_forward_overlap_tests"], "visible_says": ["posted after the compute"]}),
    _seen({"name": "the ring over the world group instead of the cp group",
           "replace": _edit("ring_forward",
                            ("n, me = dist.get_world_size(group), dist.get_rank(group)",
                             "group = dist.group.WORLD\n"
                             "    n, me = dist.get_world_size(group), dist.get_rank(group)")),
           "loses": RING, "visible_says": ["not the world"]}),
    _seen({"name": "one exchange too many (n sends instead of n - 1)",
           "replace": _edit("ring_forward", ("if step < n - 1:", "if step < n:")),
           "loses": ["ring_forward_comm_tests"], "visible_says": ["N - 1 = 1 times"]}),
    _seen({"name": "the library's ring attention (switched off while graded)",
           "replace": {"ring_forward": "def ring_attention_forward(q, k, v, group):\n"
                                       "    return dl.cp.ring_attention(q, k, v, group)\n"},
           "loses": [*RING, "ring_forward_overlap_tests"], "visible_says": ["is switched off here"]}),
    {"name": "right: another loop, mask by tril and where, posted first and waited last",
     "replace": {"ring_forward": RING_ANOTHER_WAY}, "loses": []},
    # -- the prediction ----------------------------------------------------------------------------
    {"name": "prediction: 7, the unmasked scores instead of the FLOPs",
     "replace": {"predict_work": "q_work_ratio = 7"}, "loses": ["predict_work_tests"]},
    {"name": "prediction: balanced, 1",
     "replace": {"predict_work": "q_work_ratio = 1.0"}, "loses": ["predict_work_tests"]},
    # -- 4 the zig-zag ring ------------------------------------------------------------------------
    _seen({"name": "zig-zag pairs decided by the ranks (the contiguous rule), not by the chunks",
           "replace": _edit("zigzag_forward", ("if kj > qi:                              # keys",
                                               "if src > me:                             # keys")),
           "loses": ZIGZAG, "visible_says": ["not by the ranks"]}),
    _seen({"name": "zig-zag: the chunk against itself not masked",
           "replace": _edit("zigzag_forward", ("                if kj == qi:\n",
                                               "                if kj == -1:\n")),
           "loses": ["zigzag_forward_numbers_tests"], "visible_says": ["needs the mask"]}),
    _seen({"name": "zig-zag: future pairs multiplied out, then skipped (right numbers)",
           "replace": _edit("zigzag_forward",
                            ("                if kj > qi:                              # keys "
                             "wholly after the queries\n"
                             "                    continue\n", ""),
                            ("                    q.shape[-1])\n",
                             "                    q.shape[-1])\n"
                             "                if kj > qi:\n"
                             "                    continue\n")),
           "loses": ["zigzag_forward_flops_tests"], "visible_says": ["multiplied out and then"]}),
    _seen({"name": "zig-zag by the library's ring attention (switched off while graded)",
           "replace": {"zigzag_forward": "def zigzag_ring_attention_forward(q, k, v, group):\n"
                                         "    return dl.cp.ring_attention(q, k, v, group, "
                                         "zigzag=True)\n"},
           "loses": ZIGZAG, "visible_says": ["is switched off here"]}),
    {"name": "right: zig-zag pairs from global positions, einsum and where",
     "replace": {"zigzag_forward": ZIGZAG_BY_POSITIONS}, "loses": []},
    # -- 3 routing --------------------------------------------------------------------------------
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
    # -- 4 expert parallel --------------------------------------------------------------------------
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
    {"name": "recall 1: cp left at 4",
     "replace": {"recall_activation_gb": "q_activation_gb = 4.56"},
     "loses": ["recall_activation_gb_tests"]},
    {"name": "recall 1: the 32-GPU run's layer, as if cp grew with the sequence",
     "replace": {"recall_activation_gb": "q_activation_gb = 1.14"},
     "loses": ["recall_activation_gb_tests"]},
    {"name": "right: recall 1 within 2 %",
     "replace": {"recall_activation_gb": "q_activation_gb = 2.3"}, "loses": []},
    {"name": "recall 2: a rank sends its own block only",
     "replace": {"recall_ring_bytes": 'q_ring_bytes = "a"'}, "loses": ["recall_ring_bytes_tests"]},
    {"name": "recall 2: the causal mask halves the ring's bytes",
     "replace": {"recall_ring_bytes": 'q_ring_bytes = "b"'}, "loses": ["recall_ring_bytes_tests"]},
    {"name": "recall 3: any early and late chunk per rank balance the work",
     "replace": {"recall_zigzag": 'q_zigzag = "a"'}, "loses": ["recall_zigzag_tests"]},
    {"name": "recall 4: no capacity, every token kept",
     "replace": {"recall_dropped": "q_kept_tokens = 12"}, "loses": ["recall_dropped_tests"]},
    {"name": "recall 4: only the tokens of the crowded expert counted",
     "replace": {"recall_dropped": "q_kept_tokens = 3"}, "loses": ["recall_dropped_tests"]},
    {"name": "recall 5: the whole buffers, the rank's own part counted as sent",
     "replace": {"recall_dispatch_mb": "q_dispatch_mb = 83.9"},
     "loses": ["recall_dispatch_mb_tests"]},
    {"name": "recall 5: dispatch only, not combine",
     "replace": {"recall_dispatch_mb": "q_dispatch_mb = 36.7"},
     "loses": ["recall_dispatch_mb_tests"]},
]
