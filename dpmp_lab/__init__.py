"""dpmp_lab: build data, tensor, pipeline and hybrid parallel training yourself, from a notebook.

    import dpmp_lab as dl
    res = dl.launch(fn, world_size=4)     # fn runs on 4 ranks with a process group each
    with dl.trace() as t: ...             # inside a rank: every collective it issues
    grid = dl.ProcessGrid(dp=2, tp=2)     # inside a rank: the dp x tp process groups
    dl.check.comm(res, {...})             # grading: numbers and communication

Importing the package binds none of it: the first name asked for (`dl.launch`) loads the API
(dpmp_lab/api.py) and prepares the process, so the instructor's tools, which live in the package
too (the grader's processes, the hub), never load torch. In IPython, the learner's kernel, the
import itself loads it: the process is prepared before the learner's first cell.
"""

import threading

from dpmp_lab._helpers import ipython_shell

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

_loading = threading.RLock()
_loaded = False


def load() -> None:
    """Bind the learner's API in the package and prepare this process for it (once). What the
    first `dl.<name>` does, importing the package in IPython, and a rank before its code runs."""
    global _loaded
    with _loading:
        if _loaded:
            return
        _loaded = True   # a module of the API that asks for a name while loading gets none
        try:
            from dpmp_lab import api

            globals().update({name: getattr(api, name) for name in api.__all__})
            api.prepare()   # after the binding: the snapshot holds the facade's names too
        except BaseException:
            _loaded = False   # the next name asked for tries again, and fails as loudly
            raise


def __getattr__(name: str):
    if name in __all__:
        load()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython) -> None:
    """`%load_ext dpmp_lab` registers the %%distributed cell magic."""
    from dpmp_lab.magic import register

    register(ipython)


if ipython_shell() is not None:
    load()
