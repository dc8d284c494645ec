"""The forkserver's last preload (launcher/starting.py's PRELOAD), and nothing else's: the learner's
API loaded (dpmp_lab.load: every rank forked from the server has it, the integrity snapshot
taken), then what the server imported, frozen out of the garbage collector's sight. (It lives outside dpmp_lab.launcher,
whose modules dpmp_lab.integrity imports in every process.)

torch alone leaves about 160,000 objects a collector tracks, none of them ever garbage. After
`gc.freeze()` in the server, every rank forked from it starts with them in the permanent
generation: its collections and `gc.get_objects()` see only what the rank made (the rank's own
`gc.collect()` goes from about 0.16 s to well under a millisecond here), and the collector no
longer writes to the server's pages, which the fork shares (gc.freeze's documented use).
dl.footprint.held walks `gc.get_objects()` for the tensors a rank holds: a tensor the server
made before the freeze is one the rank held from its start, which held() leaves out anyway.
(A kernel does the same when it imports dpmp_lab: `freeze_startup`, in _torch_helpers.py.)
"""

import dpmp_lab
from dpmp_lab._torch_helpers import freeze_startup

dpmp_lab.load()
freeze_startup()
