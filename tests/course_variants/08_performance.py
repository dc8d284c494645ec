"""Wrong answers to 08_performance, and the graded cells each must lose (all others keep points).

Each variant is the solution cell with one mistake written in, as an exact edit of the solution
notebook's own source, so the variants follow the notebook as it changes; an edit that no longer
matches is an error when this module is imported, never a variant that silently tests nothing.
Nothing here depends on how fast the machine is: every graded cell compares the learner's
function with the reference on the same data (synthetic, or the learner's own measurements).
"""

from __future__ import annotations

from tests.course_variants import solution_editor

_edit = solution_editor("08_performance")

# -- 1 the ring's alpha-beta model --------------------------------------------------------------

_STEPS = "steps = 2 * (world_size - 1)"

RING_N_MINUS_1_STEPS = _edit("ring_time", (_STEPS, "steps = world_size - 1"))
RING_WHOLE_BUFFER_PER_STEP = _edit("ring_time", ("nbytes / (world_size * beta)",
                                                 "nbytes / beta"))
RING_N_STEPS_PER_PHASE = _edit("ring_time", (_STEPS, "steps = 2 * world_size"))
RING_FROM_THE_LIBRARY = _edit("ring_time", (
    "return steps * (alpha + nbytes / (world_size * beta))",
    'return dl.bench.AlphaBeta(alpha, beta).predict("all_reduce", nbytes, world_size)'))
# right, written another way: the latency and bandwidth terms apart
RING_TWO_TERMS = {"ring_time": '''
def ring_all_reduce_time(nbytes, world_size, alpha, beta):
    latency = 2 * (world_size - 1) * alpha
    bandwidth = 2 * (world_size - 1) / world_size * nbytes / beta
    return latency + bandwidth
'''}

# -- 2 the least-squares fit --------------------------------------------------------------------

UNWEIGHTED_FIT = _edit("fit", (
    "design = torch.stack([a / t, b / t], dim=1)\n"
    "    alpha, inverse_beta = torch.linalg.lstsq(design, torch.ones_like(t)[:, None])",
    "design = torch.stack([a, b], dim=1)\n"
    "    alpha, inverse_beta = torch.linalg.lstsq(design, t[:, None])"))
FIT_WITHOUT_THE_RING = _edit(
    "fit",
    ("torch.tensor([2.0 * (w - 1) for _, w, n, t in rows]", "torch.tensor([1.0 for _ in rows]"),
    ("torch.tensor([2.0 * (w - 1) / w * n for _, w, n, t in rows]",
     "torch.tensor([float(n) for _, w, n, t in rows]"))
BETA_AS_SECONDS_PER_BYTE = _edit("fit", ("return alpha.item(), 1 / inverse_beta.item()",
                                         "return alpha.item(), inverse_beta.item()"))
FIT_FROM_THE_LIBRARY = {"fit": '''
def fit_alpha_beta(rows):
    fit = dl.bench.fit_alpha_beta(rows)
    return fit.alpha, fit.beta
'''}
# right, written another way: numpy's least squares on the relative errors
FIT_WITH_NUMPY = {"fit": '''
import numpy as np


def fit_alpha_beta(rows):
    x = np.array([[2.0 * (w - 1) / t, 2.0 * (w - 1) / w * n / t] for _, w, n, t in rows])
    (alpha, inverse_beta), *_ = np.linalg.lstsq(x, np.ones(len(rows)), rcond=None)
    return float(alpha), float(1 / inverse_beta)
'''}

# -- 4 overlap from the profile ---------------------------------------------------------------

_OVERLAP = 'return any(k.kind == "backward" and k.start > c.start for c in comm for k in compute)'

ANY_COMPUTE_COUNTS = _edit("overlap", (
    _OVERLAP, "return any(k.start > c.start for c in comm for k in compute)"))
INTERSECTING_INTERVALS = _edit("overlap", (
    _OVERLAP,
    'return any(k.kind == "backward" and k.end > c.start for c in comm for k in compute)'))
OVERLAP_FROM_THE_LIBRARY = _edit("overlap", (
    _OVERLAP, "return dl.bench.Profile(0, compute, comm, 0.0).overlapped()"))
# right, written another way: the last backward start against the first issue
OVERLAP_BY_EXTREMES = _edit("overlap", (_OVERLAP, '''starts = [k.start for k in compute if k.kind == "backward"]
    return bool(comm) and bool(starts) and max(starts) > min(c.start for c in comm)'''))

# -- 5 scaling --------------------------------------------------------------------------------------

SPEED_UP_INVERTED = _edit("scaling", ("return {n: (t1 / t, t1 / t / n) for n, t in times.items()}",
                                      "return {n: (t / t1, t / t1 / n) for n, t in times.items()}"))
WEAK_EFFICIENCY_DIVIDED_BY_N = _edit("scaling", ("return {n: (n * t1 / t, t1 / t) for",
                                                 "return {n: (n * t1 / t, t1 / t / n) for"))
STRONG_EFFICIENCY_NOT_DIVIDED = _edit("scaling", (
    "return {n: (t1 / t, t1 / t / n) for n, t in times.items()}",
    "return {n: (t1 / t, t1 / t) for n, t in times.items()}"))
# right, written another way
SCALING_IN_A_LOOP = {"scaling": '''
def scaling(times, weak=False):
    out = {}
    for n in sorted(times):
        ratio = times[1] / times[n]
        out[n] = (n * ratio, ratio) if weak else (ratio, ratio / n)
    return out
'''}

# -- 6 MFU ------------------------------------------------------------------------------------------

_MFU = "return 6 * n_params * tokens / (step_seconds * peak_flops * devices)"

MFU_FORWARD_ONLY = _edit("mfu", (_MFU, "return 2 * n_params * tokens / (step_seconds * peak_flops * devices)"))
MFU_ONE_DEVICE = _edit("mfu", (_MFU, "return 6 * n_params * tokens / (step_seconds * peak_flops)"))
MFU_FROM_THE_LIBRARY = _edit("mfu", (
    _MFU, "return dl.bench.train_flops(n_params, tokens) / (step_seconds * peak_flops * devices)"))


def _seen(variant: dict) -> dict:
    """A classic mistake: the visible test of every cell it loses fails before hand-in."""
    return {**variant, "visible": variant.get("visible", variant["loses"])}


VARIANTS = [
    # 1
    _seen({"name": "ring all-reduce with N - 1 steps (the all-gather forgotten)",
           "replace": RING_N_MINUS_1_STEPS, "loses": ["ring_time_tests"],
           "visible_says": ["only N - 1 steps"]}),
    _seen({"name": "every ring step sends the whole buffer",
           "replace": RING_WHOLE_BUFFER_PER_STEP, "loses": ["ring_time_tests"],
           "visible_says": ["not the whole buffer"]}),
    _seen({"name": "N steps per phase instead of N - 1",
           "replace": RING_N_STEPS_PER_PHASE, "loses": ["ring_time_tests"],
           "visible_says": ["N - 1 steps per phase"]}),
    _seen({"name": "the library's model instead of one's own (switched off while graded)",
           "replace": RING_FROM_THE_LIBRARY, "loses": ["ring_time_tests"],
           "visible_says": ["is switched off here"]}),
    # 2
    _seen({"name": "unweighted least squares: the largest messages decide alpha",
           "replace": UNWEIGHTED_FIT, "loses": ["fit_tests"],
           "visible_says": ["an unweighted fit"]}),
    _seen({"name": "fit of T = alpha + n / beta without the ring's factors",
           "replace": FIT_WITHOUT_THE_RING, "loses": ["fit_tests"],
           "visible_says": ["the ring's factors are missing"]}),
    _seen({"name": "beta returned as seconds per byte",
           "replace": BETA_AS_SECONDS_PER_BYTE, "loses": ["fit_tests"],
           "visible_says": ["beta is a bandwidth in bytes per second"]}),
    _seen({"name": "the library's fit instead of one's own (switched off while graded)",
           "replace": FIT_FROM_THE_LIBRARY, "loses": ["fit_tests"],
           "visible_says": ["is switched off here"]}),
    # 4
    _seen({"name": "any compute after the issue counted as overlap (the division too)",
           "replace": ANY_COMPUTE_COUNTS, "loses": ["overlap_tests"],
           "visible_says": ["only backward intervals count"]}),
    _seen({"name": "intervals that merely intersect (the issuing node) counted as overlap",
           "replace": INTERSECTING_INTERVALS, "loses": ["overlap_tests"],
           "visible_says": ["does not count"]}),
    _seen({"name": "the library's verdict instead of one's own (switched off while graded)",
           "replace": OVERLAP_FROM_THE_LIBRARY, "loses": ["overlap_tests"],
           "visible_says": ["is switched off here"]}),
    # 5
    _seen({"name": "speed-up inverted: T(N) / T(1)",
           "replace": SPEED_UP_INVERTED, "loses": ["scaling_tests"],
           "visible_says": ["the old time over the new"]}),
    _seen({"name": "weak-scaling efficiency divided by N like strong scaling's",
           "replace": WEAK_EFFICIENCY_DIVIDED_BY_N, "loses": ["scaling_tests"],
           "visible_says": ["not divided by N again"]}),
    _seen({"name": "strong-scaling efficiency not divided by N",
           "replace": STRONG_EFFICIENCY_NOT_DIVIDED, "loses": ["scaling_tests"],
           "visible_says": ["speed-up divided by N"]}),
    # 6
    _seen({"name": "MFU with 2 N T (forward only)",
           "replace": MFU_FORWARD_ONLY, "loses": ["mfu_tests"],
           "visible_says": ["forward pass only"]}),
    _seen({"name": "MFU against one device's peak on many devices",
           "replace": MFU_ONE_DEVICE, "loses": ["mfu_tests"],
           "visible_says": ["divide by devices"]}),
    _seen({"name": "the library's 6 N T instead of one's own (switched off while graded)",
           "replace": MFU_FROM_THE_LIBRARY, "loses": ["mfu_tests"],
           "visible_says": ["is switched off here"]}),
    # right answers written another way keep every point
    {"name": "right: the ring's latency and bandwidth terms apart", "replace": RING_TWO_TERMS,
     "loses": []},
    {"name": "right: numpy's least squares", "replace": FIT_WITH_NUMPY, "loses": []},
    {"name": "right: overlap from the last backward start and the first issue",
     "replace": OVERLAP_BY_EXTREMES, "loses": []},
    {"name": "right: scaling in a loop", "replace": SCALING_IN_A_LOOP, "loses": []},
    {"name": "right: sync times rounded within the stated 2 %",
     "replace": {"sync_ms": "sync_ms = (20.8, 1.87)"}, "loses": []},
    # numeric and recall questions (their visible tests check the format only)
    {"name": "question 1: one message per all-reduce instead of 2 (N - 1)",
     "replace": {"sync_ms": "sync_ms = (64 * (50e-6 + 16384 / 4 / 1e9) * 1e3, "
                            "(50e-6 + 64 * 16384 / 4 / 1e9) * 1e3)"},
     "loses": ["sync_ms_tests"]},
    {"name": "question 2: big messages split and pay alpha again",
     "replace": {"huge_bucket": 'answer_2 = "b"'}, "loses": ["huge_bucket_tests"]},
    {"name": "question 3: more ranks are slower on any hardware",
     "replace": {"cpu_meaning": 'answer_3 = "a"'}, "loses": ["cpu_meaning_tests"]},
    {"name": "question 4: the ring's time grows with its number of steps",
     "replace": {"ring_scale": 'answer_4 = "d"'}, "loses": ["ring_scale_tests"]},
]
