"""Keep the course's JupyterHub running where systemd does not (deploy/dpmp-lab-hub.service is
the way where it does): start it, start it again when it dies after having run, stop it when
told to. Learners' servers outlive the hub either way (hub.configure: cleanup_servers off), so a
crash or a restart costs them a reconnect, not their kernels.

    python -m dpmp_lab.instructor.hub_supervisor -f deploy/jupyterhub_config.py [--port ...]

A hub that exits with an error within its first STARTUP_S seconds did not start (a setting, a
port in use): that is reported and not retried; one killed by a signal is started again. SIGTERM or SIGINT stop the hub and then the supervisor.

`python -c SERVICE MODULE ARGS...` runs one of the hub's services (hub.services) so that it
ends with the hub that started it, however the hub ends: a service outliving a crashed hub
would go on knocking with a token the next hub never made. (A few lines of their own, so that
starting the idle culler does not import this package, and torch with it.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

STARTUP_S = 20.0   # a hub that ran this long had started: its death is a crash
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def say(text: str) -> None:
    print(f"[hub-supervisor] {text}", file=sys.stderr, flush=True)


SERVICE = """
import ctypes, os, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM):   # a hub that ignores them must not pass that on
    signal.signal(sig, signal.SIG_DFL)
if sys.platform.startswith("linux"):   # SIGTERM when the hub, our parent, dies; kept by exec
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    if os.getppid() == 1:   # it died before we asked
        sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", *sys.argv[1:]])
"""


class Supervisor:
    """Runs one hub at a time; `stop()` (from a signal) ends the current one and the loop."""

    def __init__(self, command: list[str]) -> None:
        self.command, self.hub, self.stopping = command, None, False

    def stop(self, *_: object) -> None:
        self.stopping = True
        if self.hub is not None and self.hub.poll() is None:
            self.hub.send_signal(signal.SIGTERM)

    def run(self) -> int:
        crashes = 0
        while True:
            started = time.monotonic()
            self.hub = subprocess.Popen(self.command)
            say(f"jupyterhub started (pid {self.hub.pid})")
            code = self.hub.wait()
            ran = time.monotonic() - started
            if self.stopping:
                say(f"jupyterhub stopped ({code}); learners' servers keep running")
                return 0
            if code > 0 and ran < STARTUP_S:
                say(f"jupyterhub exited with {code} within {STARTUP_S:.0f} s of starting: it "
                    "did not start (its log above says why); not starting it again")
                return code
            crashes = crashes + 1 if ran < 600 else 0
            pause = BACKOFF_S[min(crashes, len(BACKOFF_S)) - 1]
            say(f"jupyterhub died ({code}); starting it again in {pause:.0f} s")
            time.sleep(pause)
            if self.stopping:
                return 0


def main(argv: list[str] | None = None, command: list[str] | None = None) -> int:
    """Run `command` (jupyterhub) with `argv` until told to stop; 0, or the status of a hub
    that did not start."""
    args = sys.argv[1:] if argv is None else argv
    supervisor = Supervisor([*([sys.executable, "-m", "jupyterhub"] if command is None
                               else command), *args])
    before = {sig: signal.signal(sig, supervisor.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return supervisor.run()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
