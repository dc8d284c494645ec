"""nbgrader configuration for learners: the Validate button runs a notebook like the grader.

Installed with the package as {sys.prefix}/etc/jupyter/nbgrader_config.py (pyproject's
data-files; bootstrap.py for an editable install), where nbgrader reads it wherever a notebook
lies: Validate reads the server's working directory and jupyter's config path, never the
notebook's own folder, so a notebook fetched into a learner's home needs it there.
"""

c = get_config()  # noqa: F821 (provided by nbgrader when it reads this file)

# Launching ranks takes longer than nbgrader's default 30 s per cell on a small machine.
c.Execute.timeout = 600
