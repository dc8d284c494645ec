"""The scan of a submission's own cells (scan.py): it finds every write into the library and
every escape hatch, in the house's words, and leaves ordinary code alone, the solutions of
every notebook included."""

from __future__ import annotations

import nbformat
import pytest

from dpmp_lab.instructor import course, scan
from dpmp_lab.instructor.nbgrader_plugin import mark_forged, split_cells
from tests.conftest import ROOT
from tests.support.notebook_sources import source_notebook, variants, with_replacements

GIVEN = ["import torch\nimport torch.distributed as dist\nimport dpmp_lab as dl\n"
         "from dpmp_lab.check import comm\nimport os, sys, inspect, gc\n"
         "def reference(x):\n    return x\n"]


@pytest.mark.parametrize("line", [
    "dl.check.comm = lambda *a, **k: None",
    "dist.all_reduce = print",
    "setattr(dl.check, 'compare', print)",
    "vars(dl.check)['close'] = print",
    "dl.check.__dict__['close'] = print",
    "vars(dl.check).update(comm=print)",
    "dl.Trace.count = lambda self, *a: 0",
    "del dl.check.comm",
    "with dl.integrity.swapped(dl.check, 'comm', print): pass",
    "c = dl.check\nc.comm = print",                          # through an alias
    "c = dl.check\nd = c\nsetattr(d, 'compare', print)",      # an alias of an alias
    "def f(c=dl.check):\n    c.comm = print",                # a default argument
])
def test_scan_finds_writes_into_the_library(line):
    found = scan.scan(["def f0():\n    return 1\n" + line], context=GIVEN)
    assert any(f.endswith(f"({scan.WRITES})") for f in found), found


@pytest.mark.parametrize("line, why", [
    ("expected = sys._getframe(1).f_locals['want']", scan.FRAMES),
    ("frame = inspect.currentframe().f_back", scan.FRAMES),
    ("caller = inspect.stack()[1]", scan.FRAMES),
    ("sys.settrace(lambda *a: None)", scan.TRACING),
    ("exec('x = 1')", scan.DYNAMIC),
    ("m = __import__('dpmp_lab')", scan.DYNAMIC),
    ("import importlib", scan.DYNAMIC),
    ("import builtins\nbuiltins.abs = lambda x: 0", scan.BUILTINS),
    ("__builtins__['len'] = lambda x: 0", scan.BUILTINS),
    ("sys.modules['dpmp_lab.integrity']._snapshot.clear()", scan.MODULES),
    ("reference.__code__ = (lambda x: 0).__code__", scan.INTERNALS),
    ("objs = gc.get_referrers(dl)", scan.INTERNALS),
    ("gc.freeze()   # hides what a rank holds from dl.footprint.held", scan.INTERNALS),
    ("import ctypes", scan.INTERNALS),
    ("from dpmp_lab.harness import agent", scan.RECORDS),
    ("x = dl.integrity", scan.RECORDS),
    ("f = getattr(sys, '_getframe')", scan.FRAMES),
    # red-teamed: the launcher's module reached from a function and patched through its
    # namespace, so that the grader's launches in the learner's kernel ran unaudited
    ("m = inspect.getmodule(dl.launch)", scan.MODULES),
    ("import pkgutil\nm = pkgutil.resolve_name('dpmp_lab.launcher.launch')", scan.MODULES),
    ("m = type(dl)('x')\nm.__dict__.update(launch=print)", scan.NAMESPACE),
    ("vars(m)['launch'] = print", scan.NAMESPACE),
    # red-teamed: the launcher's module imported by a name in bytes, then patched by setattr
    ("import pickle\nm = pickle.loads(b'cdpmp_lab.launcher\\nlaunch\\n.')", scan.UNPICKLE),
    ("from _pickle import loads", scan.UNPICKLE),
    ("import marshal", scan.UNPICKLE),
    ("state = torch.load(buffer, weights_only=False)", scan.UNPICKLE),
    ("state = torch.load(buffer)   # weights_only is False before torch 2.6", scan.UNPICKLE),
])
def test_scan_finds_every_escape_hatch(line, why):
    found = scan.scan([line], context=GIVEN)
    assert any(why in f for f in found), found


@pytest.mark.parametrize("line", [
    "model.weight = torch.nn.Parameter(torch.ones(2))",
    "torch.backends.cudnn.deterministic = True",
    "x = dl.check.comm",
    "grads = {}\ngrads['w'] = dist.get_rank()",
    "p.grad /= dist.get_world_size()",
    "model = dl.models.TinyMLP()\nmodel.fc = None",    # a call's result is the learner's own
    "y = torch.stack([x, x])\nmodel.eval()\nc = torch.compile",
    "import torch\nimport torch.distributed as dist",   # the same imports again
    "from IPython.display import display",
    "import gc\ngc.collect()",
    "t = dl.trace()\nprint(t.events)",
    "this is not python",
    # the learner's own kernel is theirs: its shell, history and namespace reach no test
    'get_ipython().input_transformers_cleanup.append(lambda l: ["pass\\n"])',
    "print(In[-1])",
    "globals()['dl'] = None",
    "dl = None",
    "def reference(x):\n    return 0",
    "from IPython import get_ipython",
    "class Box:\n    def __init__(self, **kw):\n        self.__dict__.update(kw)",
    "print(vars())",
    "state = torch.load(buffer, weights_only=True)",
])
def test_scan_leaves_ordinary_code_alone(line):
    assert scan.scan([line], context=GIVEN) == []


def test_every_solution_and_every_right_alternative_scans_clean():
    """No honest answer is flagged: the solutions, and every variant but the ones written to
    switch the grader off (00's two, 02's one)."""
    tampering = {"replaces dl.check.comm with a do-nothing function",
                 "replaces dl.check.comm through the module's __dict__",
                 "no all-reduce, and the checks replaced by do-nothing functions"}
    for name in course.assignments(ROOT):
        nb = source_notebook(name)
        for label, replace in [("solution", {})] + [(v["name"], v["replace"])
                                                    for v in variants(name)]:
            mine, given, _ = split_cells(with_replacements(nb, replace))
            found = scan.scan([c.source for c in mine], context=[c.source for c in given])
            assert bool(found) == (label in tampering), (name, label, found)


def test_a_finding_zeroes_every_graded_cell_with_the_lines():
    def cell(source, **meta):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["nbgrader"] = {"grade_id": meta.get("id", "x"), **meta}
        return c
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell(GIVEN[0], id="imports"),
                cell("def f():\n    return 2\ndl.check.comm = print", id="f", solution=True),
                cell("assert f() == 2", id="f_tests", grade=True, points=1)]
    mine, given, _ = split_cells(nb)
    found = scan.scan([c.source for c in mine], context=[c.source for c in given])
    mark_forged(nb, found)
    [error] = nb.cells[2].outputs
    assert error["ename"] == "TamperingDetected" and "`dl.check.comm = print`" in error["evalue"]
    assert nb.cells[1].outputs == []


def test_cells_the_learner_added_or_locked_themselves_are_theirs():
    def cell(source, **meta):
        c = nbformat.v4.new_code_cell(source)
        if meta:
            c.metadata["nbgrader"] = meta
        return c
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell(GIVEN[0], grade_id="imports", locked=True),
                cell("x = 1", grade_id="answer", solution=True),
                cell("exec('1')", grade_id=""),                          # added, no id
                cell("sys._getframe()", grade_id="forged", locked=True),  # locked by the learner
                cell("assert x == 1", grade_id="answer_tests", grade=True, locked=True)]
    own = {"imports": GIVEN[0], "answer_tests": "assert x == 1"}   # as the gradebook has them
    mine, given, tests = split_cells(nb, own)
    assert [c.source for c in mine] == ["x = 1", "exec('1')", "sys._getframe()"]
    assert [c.source for c in tests] == ["assert x == 1"]
    found = scan.scan([c.source for c in mine], context=[c.source for c in given])
    assert any("exec" in f for f in found) and any("_getframe" in f for f in found)
    assert [c.source for c in split_cells(nb)[0]] == ["x = 1", "exec('1')"]  # no gradebook
