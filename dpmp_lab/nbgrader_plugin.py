"""Where nbgrader_config.py files find dpmp_lab's grading hooks (`from dpmp_lab.nbgrader_plugin
import configure`): a public path kept for the course folders that already import it, and for
`nbgrader export --exporter=dpmp_lab.nbgrader_plugin.GradesExport`. The code is in
dpmp_lab.instructor (nbgrader_plugin, grades_export)."""

from dpmp_lab.instructor.nbgrader_plugin import (
                                                 GradesExport,
                                                 GuardedExecute,
                                                 HideHiddenTests,
                                                 OutputLimitExceeded,
                                                 autograde_preprocessors,
                                                 configure,
                                                 feedback_preprocessors,
                                                 hidden_lines,
                                                 mark_forged,
                                                 mask_output,
                                                 split_cells,
)

__all__ = ["GradesExport", "GuardedExecute", "HideHiddenTests", "OutputLimitExceeded", "autograde_preprocessors",
           "configure", "feedback_preprocessors", "hidden_lines", "mark_forged", "mask_output",
           "split_cells"]
