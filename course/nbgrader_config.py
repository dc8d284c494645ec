"""nbgrader configuration for learners: the Validate button runs a notebook like the grader."""

c = get_config()  # noqa: F821 (provided by nbgrader when it reads this file)

# Launching ranks takes longer than nbgrader's default 30 s per cell on a small machine.
c.Execute.timeout = 600
