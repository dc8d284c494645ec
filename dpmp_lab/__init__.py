"""dpmp_lab: build data, tensor, pipeline and hybrid parallel training yourself, from a notebook.

    import dpmp_lab as dl
    res = dl.launch(fn, world_size=4)     # fn runs on 4 ranks with a process group each
    with dl.trace() as t: ...             # inside a rank: every collective it issues
    grid = dl.ProcessGrid(dp=2, tp=2)     # inside a rank: the dp x tp process groups
    dl.check.comm(res, {...})             # grading: numbers and communication
"""

import dpmp_lab.bench as bench  # one line each (not in the list below): merges stay easy
import dpmp_lab.cp as cp
import dpmp_lab.footprint as footprint
import dpmp_lab.fsdp as fsdp
import dpmp_lab.moe as moe
from dpmp_lab import check, collectives, cost, dp, hybrid, integrity, models, pp, tp, viz
from dpmp_lab._helpers import ipython_shell
from dpmp_lab._torch_helpers import freeze_startup
from dpmp_lab.compat import provide_new_collective_names
from dpmp_lab.context import device, rank, world_size
from dpmp_lab.grid import GridLayout, ProcessGrid
from dpmp_lab.launcher import starting
from dpmp_lab.launcher.launch import (
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    RankFailure,
    launch,
    visible_gpus,
)
from dpmp_lab.trace import CommEvent, Trace, name_group, trace

provide_new_collective_names()   # torch 2.13's all_gather_single etc. on older torch too
integrity.remember()             # what a rank's trace relies on, to tell if a rank changed it
starting.warm_up_if_interactive()  # in a kernel: the forkserver starts now, not at the 1st launch
if ipython_shell() is not None:    # and what the imports made leaves gc's sight, as in the
    freeze_startup()               # forkserver: dl.footprint walks only the learner's objects

__version__ = "0.2.0"

__all__ = [
    "CommEvent",
    "GridLayout",
    "LaunchError",
    "LaunchResult",
    "LaunchTimeout",
    "ProcessGrid",
    "RankFailure",
    "Trace",
    "bench",
    "check",
    "collectives",
    "cost",
    "cp",
    "device",
    "dp",
    "footprint",
    "fsdp",
    "hybrid",
    "integrity",
    "launch",
    "load_ipython_extension",
    "models",
    "moe",
    "name_group",
    "pp",
    "rank",
    "tp",
    "trace",
    "visible_gpus",
    "viz",
    "world_size",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext dpmp_lab` registers the %%distributed cell magic."""
    from dpmp_lab.magic import register

    register(ipython)
