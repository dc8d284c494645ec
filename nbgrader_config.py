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

# Trusted grading (dpmp_lab/instructor/nbgrader_plugin.py): each submission's cells run in a kernel in a
# sandbox (bubblewrap), the graded test cells in a harness of their own that no code of the
# submission reaches, the learner's cells are scanned for writes into the library, and feedback
# carries no hidden test.
from dpmp_lab.instructor.nbgrader_plugin import configure  # noqa: E402

configure(c)
