"""Broken variants of 09_context_parallel: classic mistakes the grader must catch.

Each variant is a solution cell with one mistake written in, as an exact edit of the solution
notebook's source (or a whole cell where the mistake is a different design). `loses` lists
exactly the graded cells that must score zero; `visible` the test cells a learner can run that
must already fail, with `visible_says` words. A mistake in the online softmax costs only its own
cell: the ring is graded with the library's online softmax. The ring's numbers and its messages
are separate cells, so an all-gather of K/V (right numbers, wrong communication) loses only the
communication.
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("09_context_parallel")

RING = ["ring_forward_numbers_tests", "ring_forward_comm_tests"]
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
]
