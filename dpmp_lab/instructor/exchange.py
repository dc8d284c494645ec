"""nbgrader's exchange with private submissions, for a course served by a JupyterHub.

nbgrader's own submit leaves each submission readable by every user of the server, hidden only
by a random folder name. `PrivateSubmit` closes it to the learner and the group of the inbound
folder (the instructor's, which releases the assignment), so another learner cannot read it
even by its name. The learners' nbgrader_config.py names it (hub.py writes that file).
"""

from __future__ import annotations

import os

from nbgrader.exchange.default.submit import ExchangeSubmit

SUBMISSION_FILE_MODE = 0o440     # the learner and the graders' group read it
SUBMISSION_DIR_MODE = 0o2770     # the graders' group may also clean it up; others nothing


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, then the submission closed to everyone but its learner and the
    graders' group (inherited from the set-group-id inbound folder)."""

    def copy_files(self) -> None:
        super().copy_files()
        dest = os.path.join(self.inbound_path, self.assignment_filename)
        self.set_perms(dest, fileperms=SUBMISSION_FILE_MODE, dirperms=SUBMISSION_DIR_MODE)
