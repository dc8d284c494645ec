"""Each learner's JupyterLab in cgroups of its own: a memory, CPU and process limit that holds
for everything the server starts (its kernels, their rank starters, every rank), so that one
runaway learner cannot take the server, the hub or grading down.

JupyterHub's LocalProcessSpawner runs a server as its user's process but enforces none of
`mem_limit` and `cpu_limit`; `LimitedSpawner` makes cgroups named after the user below the
hub's own (`limits.Cgroups.make`), has the server's first process join them before it becomes
the user (so every process below starts inside) and, when the server stops, stops whatever is
left in them (hub.pre_spawn tells the server its share of the cores, DPMP_LAB_CORES). The cgroups outlive a restart of the hub, as the server does.
Where systemd runs the machine, jupyterhub-systemdspawner gives the same limits as systemd
units (hub.configure chooses); this spawner is for where it does not.

This module imports jupyterhub: the hub loads it by name (hub.LIMITED_SPAWNER).
"""

from __future__ import annotations

import os
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer

from dpmp_lab.instructor.limits import MIB, Cgroups


class LimitedSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose server lives in cgroups that hold `mem_limit`, `cpu_limit`
    and `processes`; the server does not start where no cgroup can hold its memory."""

    processes = Integer(4096, config=True,
                        help="How many processes and threads a server may run at once.")

    def cgroup_name(self) -> str:
        return f"dpmp-lab-hub-{self.user.name}"

    def cgroups(self) -> Cgroups:
        """The server's cgroups, made (or taken over, after a restart) with its limits."""
        memory_mb = int(self.mem_limit // MIB) if self.mem_limit else 0
        if memory_mb <= 0:
            raise ValueError("LimitedSpawner needs mem_limit (DPMP_LAB_HUB_MEMORY)")
        return Cgroups.make(self.cgroup_name(), memory_mb, self.processes,
                            cpus=self.cpu_limit or None)

    def make_preexec_fn(self, name: str) -> Any:
        become_user = super().make_preexec_fn(name)
        Cgroups.existing(self.cgroup_name()).kill_all()   # what a server that died left
        job = self.cgroups()
        if "memory" not in job.held:
            job.kill_all()
            raise RuntimeError(f"no memory cgroup could be made for {name}'s server on this "
                               "machine: it would run without its memory limit")
        procs = job.procs_files()

        def preexec() -> None:   # after fork, before exec: join while still root
            for path in procs:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
            become_user()

        return preexec

    async def stop(self, now: bool = False) -> None:
        """Stop the server as LocalProcessSpawner does, then every process it left in its
        cgroups (a kernel it did not stop, its ranks), and remove them."""
        try:
            await super().stop(now=now)
        finally:
            Cgroups.existing(self.cgroup_name()).kill_all()
