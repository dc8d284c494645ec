"""Receipts (receipts.py) and nbgrader's side of trusted grading (nbgrader_plugin.py), without
a grading run: a test cell's receipt line comes and goes without a trace, a missing or wrong
receipt and every kind of tampered kernel are named, output past a limit ends the run, and
feedback masks every hidden line wherever it shows."""

from __future__ import annotations

import os
import types

import nbformat
import pytest
import torch.distributed

import dpmp_lab as dl
from dpmp_lab.instructor import nbgrader_plugin, receipts
from dpmp_lab.instructor.nbgrader_plugin import GuardedExecute, HideHiddenTests, OutputLimitExceeded
from dpmp_lab.instructor.server_paths import mask_paths, server_paths


def _cell(source: str, **meta) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = meta
    return cell


def _receipt_output(payload: dict) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={receipts.MIME: payload})


def test_a_receipt_line_comes_and_goes_without_a_trace():
    sources = ["assert f() == 2", "for x in range(3):\n    check(x)\n", "x = 1\n\n"]
    cells = [_cell(s, grade=True) for s in sources]
    nonces = receipts.add(cells, {"dl": "dpmp_lab"})
    assert len(set(nonces.values())) == 3
    for cell, nonce in zip(cells, nonces.values(), strict=True):
        assert nonce in cell.source and compile(cell.source, "<cell>", "exec")
        cell.outputs = [nbformat.v4.new_output("stream", text="ok\n"),
                        _receipt_output({"nonce": nonce})]
    for cell, source, nonce in zip(cells, sources, nonces.values(), strict=True):
        assert receipts.strip(cell) == [{"nonce": nonce}]
        assert cell.source == source and [o.output_type for o in cell.outputs] == ["stream"]


def _clean_state() -> dict:
    receipts.expected_digests()   # imports what a kernel always has loaded (ipykernel)
    return {"nonce": "n1", **receipts.state(None, {}), "guarded": 10}


def test_an_honest_receipt_has_no_problem():
    state = _clean_state()
    assert receipts.problems([state], "n1", receipts.expected_digests()) == []


@pytest.mark.parametrize("change, words", [
    (None, "no receipt"),
    ({"nonce": "another cell's"}, "no receipt"),
    ({"hooks": ["input_transformers_cleanup: <lambda> from __main__"]}, "hooks installed"),
    ({"tracing": ["sys.settrace"]}, "trace functions"),
    ({"shadowed": ["showtraceback"]}, "shell's methods replaced"),
    ({"names": ["dl"]}, "imported names rebound: dl"),
    ({"changed": ["dpmp_lab.check.comm was replaced"]}, "grader's functions changed"),
    ({"guarded": 0}, "record of the grader's functions was emptied"),
    ({"digests": {}}, "differ from the installed code in:"),
])
def test_a_tampered_receipt_says_what_was_tampered_with(change, words):
    state = _clean_state()
    found = [] if change is None else [{**state, **change}]
    problems = receipts.problems(found, "n1", receipts.expected_digests())
    assert any(words in p for p in problems), problems


def test_the_kernel_state_names_foreign_hooks_and_rebound_names():
    import dpmp_lab

    shell = types.SimpleNamespace(
        input_transformers_cleanup=[lambda lines: ["pass\n"]], input_transformers_post=[],
        ast_transformers=[], events=types.SimpleNamespace(callbacks={"post_run_cell": []}),
        user_ns={"dl": object(), "torch": __import__("torch")}, run_cell=print)
    state = receipts.state(shell, {"dl": "dpmp_lab", "torch": "torch", "math": "math"})
    assert state["hooks"] and "<lambda>" in state["hooks"][0]
    assert state["names"] == ["dl"]            # math: not imported yet, not a finding
    assert state["shadowed"] == ["run_cell"]   # print is no IPython method
    shell.user_ns["dl"] = dpmp_lab
    assert receipts.state(shell, {"dl": "dpmp_lab"})["names"] == []


def test_a_replaced_builtin_changes_its_digest(monkeypatch):
    import builtins

    before = receipts.digests()["builtins"]
    monkeypatch.setattr(builtins, "abs", lambda x: 0)
    assert receipts.digests()["builtins"] != before


def test_imported_names_are_what_the_notebooks_imports_bind():
    assert receipts.imported_names(["import torch\nimport torch.distributed as dist\n"
                                    "import dpmp_lab as dl\nfrom torch import nn\nimport os.path"]
                                   ) == {"torch": "torch", "dist": "torch.distributed",
                                         "dl": "dpmp_lab", "nn": "torch:nn", "os": "os"}


def test_output_past_a_cells_limit_ends_the_run_and_says_so():
    run = GuardedExecute(sandbox=False, cell_output_bytes=1000, notebook_output_bytes=5000)
    cell = _cell("print('x' * 2000)")
    message = {"msg_type": "stream", "content": {"name": "stdout", "text": "x" * 2000},
               "parent_header": {}}
    with pytest.raises(OutputLimitExceeded, match="one cell printed more than"):
        run.process_message(message, cell, 0)
    assert "output limit" in run.found["limit"]


def test_feedback_masks_every_hidden_line_wherever_it_shows():
    nb = nbformat.v4.new_notebook()
    test = _cell("check(f)\n### BEGIN HIDDEN TESTS\nassert f(3) == 9, 'three squared'\n"
                 "### END HIDDEN TESTS\n", grade=True, solution=False, grade_id="t",
                 points=1, locked=True)
    test.outputs = [nbformat.v4.new_output(
        "error", ename="AssertionError", evalue="three squared",
        traceback=["\x1b[0;31m----> 3\x1b[0m \x1b[38;5;28;01massert\x1b[39;00m f(\x1b[38;5;241m3"
                   "\x1b[39m) \x1b[38;5;241m==\x1b[39m \x1b[38;5;241m9\x1b[39m, "
                   "\x1b[38;5;124m'three squared'\x1b[39m", "AssertionError: three squared"]),
        nbformat.v4.new_output("stream", text="CELL assert f(3) == 9, 'three squared'\nok\n")]
    nb.cells = [test]
    HideHiddenTests().preprocess(nb, {})
    assert "assert f(3)" not in nb.cells[0].source and "check(f)" in nb.cells[0].source
    text = "\n".join(nb.cells[0].outputs[0].traceback) + nb.cells[0].outputs[1].text
    assert "assert f(3) == 9" not in text and nbgrader_plugin.HIDDEN_LINE in text
    assert "ok" in text and "AssertionError: three squared" in text


def test_feedback_masks_the_servers_paths_and_keeps_the_frames(tmp_path, monkeypatch):
    """A traceback through the package, torch and the standard library names the files as
    `dpmp_lab/...`, `<site-packages>/...` and `<python>/...`; the grader's scratch course (the
    feedback step's working directory) is `<course>`."""
    package = os.path.dirname(dl.__file__)
    torch_file = torch.distributed.__file__
    stdlib = os.path.dirname(os.__file__)
    monkeypatch.chdir(tmp_path)
    nb = nbformat.v4.new_notebook()
    cell = _cell("check(f)\n", grade=True, solution=False, grade_id="t", points=1, locked=True)
    trace = (f'File \x1b[0;32m{package}/check/numbers.py:12\x1b[0m, in close\n'
             f'  File "{torch_file}", line 3, in all_reduce\n'
             f'  File "{stdlib}/threading.py", line 9\n'
             f'  File "{tmp_path}/autograded/ann/00_launch/x.py", line 1\n'
             f'  File "{tmp_path}2/x.py", line 1\n')
    cell.outputs = [nbformat.v4.new_output("error", ename="CheckFailed", evalue=trace,
                                           traceback=[trace]),
                    nbformat.v4.new_output("stream", name="stderr", text=trace)]
    nb.cells = [cell]
    HideHiddenTests().preprocess(nb, {})
    for text in (nb.cells[0].outputs[0].traceback[0], nb.cells[0].outputs[0].evalue,
                 nb.cells[0].outputs[1].text):
        assert package not in text and os.path.dirname(torch_file) not in text
        assert f"{stdlib}/" not in text and f"{tmp_path}/" not in text
        assert "dpmp_lab/check/numbers.py:12" in text
        assert '"<site-packages>/torch/distributed/__init__.py", line 3' in text
        assert '"<python>/threading.py", line 9' in text
        assert '"<course>/autograded/ann/00_launch/x.py"' in text
        assert f'"{tmp_path}2/x.py"' in text   # another folder that only starts the same


def test_server_paths_name_the_most_precise_folder_first():
    places = server_paths([("/srv/course", "<course>")])
    lengths = [len(p) for p, _ in places]
    assert lengths == sorted(lengths, reverse=True)
    assert ("/srv/course", "<course>") in places
    assert mask_paths("/srv/course/a.py and /srv/courses/b.py", places) == (
        "<course>/a.py and /srv/courses/b.py")
    home = os.path.expanduser("~")
    tilde = server_paths([(f"{home}/work/c", "<course>")])
    assert mask_paths("~/work/c/x.py", tilde) == "<course>/x.py"
    assert mask_paths("no path here", []) == "no path here"
