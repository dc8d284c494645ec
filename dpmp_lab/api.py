"""The learner's API, `dl.<name>`: what the package's facade binds at the first name asked for
(dpmp_lab/__init__.py), and what preparing a process for it does.

Preparing (once per process, after the names are bound): torch 2.13's collective names on older
torch; the snapshot of what a rank's trace relies on (dpmp_lab/integrity.py), taken before any
code of the learner's runs; in IPython, the forkserver warmed up and the imports frozen out of
gc's sight, so that dl.footprint walks only what the learner made.
"""

import dpmp_lab.bench as bench  # one line each (not in the list below): merges stay easy
import dpmp_lab.cp as cp
import dpmp_lab.footprint as footprint
import dpmp_lab.fsdp as fsdp
import dpmp_lab.moe as moe
from dpmp_lab import check, collectives, cost, dp, hybrid, integrity, models, pp, tp, viz
from dpmp_lab._helpers import ipython_shell
from dpmp_lab._torch_helpers import freeze_startup
from dpmp_lab.check import references
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


def prepare() -> None:
    """Ready this process for the API: in every process that loads it, before the learner's
    first line (dpmp_lab.load calls it)."""
    provide_new_collective_names()     # torch 2.13's all_gather_single etc. on older torch too
    integrity.remember()               # what a rank's trace relies on, to tell if a rank changed it
    references.read_library()          # where references_off finds them: read once for every rank
    starting.warm_up_if_interactive()  # in a kernel: the forkserver starts now, not at the 1st launch
    if ipython_shell() is not None:    # and what the imports made leaves gc's sight, as in the
        freeze_startup()               # forkserver: dl.footprint walks only the learner's objects


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
