"""nbgrader's exchange with private submissions, for a course served by a JupyterHub.

nbgrader's own submit leaves each submission readable by every user of the server, hidden only
by a random folder name. `PrivateSubmit` closes the submission's folder to all but the learner
and its group: the inbound folder's (set-group-id, made by the instructor's release, so the
instructor's group), which the folder took when it was made. Another learner cannot enter it
even knowing its name. The learners' nbgrader_config.py names it (hub.py writes that file).
"""

from __future__ import annotations

import os

from nbgrader.exchange.default.submit import ExchangeSubmit

# The folder is the gate: its files may keep the learner's group (nbgrader writes some after
# the copy has reset the folder's set-group-id bit), so they are readable by whoever enters.
SUBMISSION_FILE_MODE = 0o444
SUBMISSION_DIR_MODE = 0o2770     # the learner and the graders' group; others cannot enter


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, then the submission's folder closed to everyone but its learner and
    the graders' group."""

    def copy_files(self) -> None:
        super().copy_files()
        dest = os.path.join(self.inbound_path, self.assignment_filename)
        self.set_perms(dest, fileperms=SUBMISSION_FILE_MODE, dirperms=SUBMISSION_DIR_MODE)
