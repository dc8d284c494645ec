"""Where nbgrader_config.py files find dpmp_lab's grading hooks (`from dpmp_lab.nbgrader_plugin
import configure`): a public path kept for the course folders that already import it. The code
is dpmp_lab.instructor.nbgrader_plugin."""

from dpmp_lab.instructor.nbgrader_plugin import (
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

__all__ = ["GuardedExecute", "HideHiddenTests", "OutputLimitExceeded", "autograde_preprocessors",
           "configure", "feedback_preprocessors", "hidden_lines", "mark_forged", "mask_output",
           "split_cells"]
