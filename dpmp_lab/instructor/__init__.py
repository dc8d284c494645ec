"""Grading a class, which learners never import: the course folders (course), one submission's
job (grading_job: a scratch course of copies, limits, sandbox, sandbox_kernel), the parent that
alone writes the gradebook (grading), nbgrader's hooks (nbgrader_plugin: the learner's cells
and the tests in two kernels, two_kernels; the scan; feedback without the server's paths:
server_paths), the class report (class_report) and the grades out (grades_export, `nbgrader
export`'s plugin)."""
