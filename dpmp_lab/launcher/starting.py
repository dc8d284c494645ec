"""How rank processes start, and starting the forkserver before a kernel's first launch.

The default start method is a forkserver with torch and dpmp_lab preloaded: a server process
imports them once (about 2 s), then every rank is a fork of it (about 0.1 s for 4 ranks). The
first launch of a kernel would pay those 2 s, so importing dpmp_lab in IPython starts the
server in a background thread (DPMP_LAB_WARM=0 turns that off; `warm_up()` asks for it
anywhere). Scripts start nothing until they launch.

Processes are only ever started under one lock, taken by the warm-up and by every launch: a
launch with start_method="fork" then never forks while the warm-up thread is inside
multiprocessing, where the child would inherit its locks held and hang on them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, process
from multiprocessing.context import BaseContext

from dpmp_lab._helpers import ipython_shell

START_METHODS = ("forkserver", "fork", "spawn")
# torch._dynamo: the first torch.optim optimizer a rank creates imports it (0.9 s here), which
# would otherwise be paid by every launch that trains; the forkserver pays it once.
# dpmp_lab.preloaded, last: the learner's API loaded, then all of it frozen out of the ranks'
# garbage collector's sight.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "dpmp_lab.preloaded"]
WARM_ENV = "DPMP_LAB_WARM"

_start_lock = threading.Lock()


def context(start_method: str) -> BaseContext:
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # only takes effect when the server starts
    return ctx


@contextlib.contextmanager
def starting(start_method: str) -> Iterator[BaseContext]:
    """The context to start ranks with, while no other thread starts processes."""
    with _start_lock:
        yield context(start_method)


def warm_up() -> None:
    """Start the forkserver now (in this thread), so that the first launch finds it running.
    Returns at once: the server imports torch in its own process."""
    with starting("forkserver"):
        forkserver.ensure_running()


def warm_up_in_background() -> threading.Thread:
    """warm_up() in a daemon thread; a launch meanwhile waits for it at the lock."""
    thread = threading.Thread(target=_warm_up_quietly, name="dpmp_lab-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up_quietly() -> None:
    # A failed warm-up costs nothing: the first launch starts the server itself, and says why
    # if that fails too.
    with contextlib.suppress(Exception):
        warm_up()


def warm_up_if_interactive() -> threading.Thread | None:
    """When the learner's API loads (dpmp_lab.load): warm up in the background when a person is
    at an IPython prompt or a notebook, unless DPMP_LAB_WARM=0. Never in a rank or a script."""
    if os.environ.get(WARM_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if ipython_shell() is None or mp.parent_process() is not None or importing_main():
        return None
    return warm_up_in_background()


def forkserver_running() -> bool:
    """Whether this process's forkserver has been started (and not seen to die)."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


def importing_main() -> bool:
    """True in a new process while multiprocessing imports the parent's main script in it
    (start methods forkserver and spawn): a launch called then comes from a script whose
    top level launches, not from the function the rank was started to run."""
    return bool(getattr(process.current_process(), "_inheriting", False))
