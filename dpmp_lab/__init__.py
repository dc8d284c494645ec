"""dpmp_lab: build data, tensor, pipeline and hybrid parallel training yourself, from a notebook.

    import dpmp_lab as dl
    res = dl.launch(fn, world_size=4)     # fn runs on 4 ranks with a process group each
"""

from dpmp_lab.launch import (
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    RankFailure,
    launch,
    visible_gpus,
)
from dpmp_lab.worker import device, rank, world_size

__version__ = "0.1.0"

__all__ = [
    "LaunchError",
    "LaunchResult",
    "LaunchTimeout",
    "RankFailure",
    "device",
    "launch",
    "load_ipython_extension",
    "rank",
    "visible_gpus",
    "world_size",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext dpmp_lab` registers the %%distributed cell magic."""
    from dpmp_lab.magic import register

    register(ipython)
