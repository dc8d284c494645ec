"""Several nbgrader commands in one process (dpmp_lab/instructor/nbgrader_steps.py): in order,
stopping at the first that fails, each step's variables its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from dpmp_lab.instructor import course, nbgrader_steps
from dpmp_lab.instructor.nbgrader_steps import Step
from tests.conftest import ROOT

NAME = "00_launch"


@pytest.mark.parametrize("text, why", [
    ("not json", "not JSON"),
    ("[]", "non-empty JSON list"),
    ('{"args": ["autograde"]}', "non-empty JSON list"),
    ('[{"args": []}]', "'args', a non-empty list"),
    ('[{"args": "autograde x"}]', "'args', a non-empty list"),
    ('[{"args": ["autograde"], "env": {"A": 1}}]', "'env' maps names to strings"),
    ('["autograde"]', "'args', a non-empty list"),
])
def test_bad_steps_are_refused_saying_what_is_wrong(text, why, capsys):
    with pytest.raises(ValueError, match=why):
        nbgrader_steps.parse(text)
    assert nbgrader_steps.main([text]) == 2
    assert why in capsys.readouterr().err


def test_steps_travel_through_the_command_line_unchanged():
    steps = [Step(("autograde", NAME, "--student", "a b*")), Step(("generate_feedback",),
                                                                  {"X": "1 2"})]
    assert nbgrader_steps.parse(nbgrader_steps.command(steps)[-1]) == steps


def test_a_step_sees_its_variables_and_the_next_does_not(monkeypatch):
    from nbgrader.apps.nbgraderapp import NbGraderApp

    seen = []

    def initialize(self, argv):
        self.argv_seen = argv

    def start(self):
        seen.append((self.argv_seen[0], os.environ.get("DPMP_LAB_STEP_PROBE")))
        if self.argv_seen[0] == "fail":
            raise SystemExit(3)

    monkeypatch.setattr(NbGraderApp, "initialize", initialize)
    monkeypatch.setattr(NbGraderApp, "start", start)
    monkeypatch.delenv("DPMP_LAB_STEP_PROBE", raising=False)
    assert nbgrader_steps.run_steps([Step(("one",), {"DPMP_LAB_STEP_PROBE": "x"}),
                                     Step(("two",))]) == 0
    assert nbgrader_steps.run_steps([Step(("fail",)), Step(("never",))]) == 3
    assert seen == [("one", "x"), ("two", None), ("fail", None)]
    assert "DPMP_LAB_STEP_PROBE" not in os.environ


def test_nbgrader_commands_run_in_order_in_one_process_and_stop_at_the_first_failure(tmp_path):
    """A step's options are its own (the next one releases into course/ again), and a
    failing step ends the run."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / NAME, root / "solutions" / NAME)
    elsewhere = ("--no-db", "--CourseDirectory.release_directory=elsewhere")
    course.nbgrader_steps([Step(("generate_assignment", NAME, "--force", *elsewhere)),
                           Step(("generate_assignment", NAME, "--force"))],
                          root=root, capture=True)
    assert (root / "elsewhere" / NAME / f"{NAME}.ipynb").is_file()
    assert (root / "course" / NAME / f"{NAME}.ipynb").is_file()
    shutil.rmtree(root / "elsewhere")
    with pytest.raises(RuntimeError, match="99_nothing"):
        course.nbgrader_steps([Step(("generate_assignment", "99_nothing")),   # no source
                               Step(("generate_assignment", NAME, "--force", *elsewhere))],
                              root=root, capture=True)
    assert not (root / "elsewhere").exists()


# What a grading job's process imports of the package (nbgrader_config.py's plugin, the job,
# the relay between the two kernels of a notebook), and a release run there: none loads torch,
# which each of a class's jobs would otherwise import for nothing (the kernels import it).
GRADER_MODULES = ("dpmp_lab.nbgrader_plugin", "dpmp_lab.instructor.grading_job",
                  "dpmp_lab.instructor.grading", "dpmp_lab.instructor.two_kernels",
                  "dpmp_lab.instructor.sandbox_kernel", "dpmp_lab.harness.plan", "dpmp_lab.cli")
PROBE = """import atexit, importlib, sys
atexit.register(lambda: print("torch loaded:", "torch" in sys.modules))
for name in sys.argv[2:]:
    importlib.import_module(name)
from dpmp_lab.instructor import nbgrader_steps
sys.exit(nbgrader_steps.main([sys.argv[1]]))
"""


def test_the_grader_s_own_process_loads_no_torch(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / NAME, root / "solutions" / NAME)
    steps = nbgrader_steps.command([Step(("generate_assignment", NAME, "--force", "--no-db"))])
    done = subprocess.run([sys.executable, "-c", PROBE, steps[-1], *GRADER_MODULES], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (root / "course" / NAME / f"{NAME}.ipynb").is_file()
    assert "torch loaded: False" in done.stdout, done.stdout
    # and the probe would see it: the learner's API loads torch
    done = subprocess.run([sys.executable, "-c", "import sys, dpmp_lab as dl\ndl.load()\n"
                           "print('torch loaded:', 'torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert "torch loaded: True" in done.stdout, done.stderr
