"""nbgrader configuration for instructors: solutions/ is the source, course/ the release.

    dpmp-lab release              # regenerate course/ from solutions/ (nbgrader generate_assignment)
    dpmp-lab grade 02_data_parallel   # autograde submitted/*/02_data_parallel, write feedback/
"""

c = get_config()  # noqa: F821 (provided by nbgrader when it reads this file)

c.CourseDirectory.course_id = "dpmp_lab"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
# Launching ranks takes longer than nbgrader's default 30 s per cell on a small machine.
c.Execute.timeout = 600
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Tamper evidence (dpmp_lab/integrity.py): after running a submission, scan the learner's cells
# for writes into the grader's modules; a finding zeroes the graded cells and says why.
from nbgrader.converters import Autograde  # noqa: E402

from dpmp_lab.nbgrader_plugin import autograde_preprocessors  # noqa: E402

c.Autograde.autograde_preprocessors = autograde_preprocessors(
    Autograde.class_traits()["autograde_preprocessors"].default())
