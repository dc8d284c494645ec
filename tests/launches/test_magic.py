"""magic.py: %%distributed in an IPython shell of this process: what a cell reads is sent by
value, what it assigns stays in the ranks, the last expression comes back per rank, and a
variable that cannot be sent is refused by name before anything starts. (In a real kernel,
with rank lines and errors as a learner sees them: test_notebook.py.)"""

from __future__ import annotations

import threading

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import dpmp_lab as dl
from dpmp_lab.magic import names_read, run_cell

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def shell():
    """A shell of our own, not the singleton, and no history database on disk."""
    config = Config()
    config.HistoryManager.enabled = False
    sh = InteractiveShell(config=config)
    sh.run_line_magic("load_ext", "dpmp_lab")
    yield sh
    sh.cleanup()


def run(shell, line: str, body: str):
    return shell.run_cell_magic("distributed", line, body)


def test_run_cell_returns_the_last_expression_and_sees_the_names_given():
    assert run_cell("y = x + 1\ny * 2", "<t>", {"x": 3}) == 8
    assert run_cell("y = x + 1", "<t>", {"x": 3}) is None


def test_names_read_sees_nested_functions_and_not_assignments():
    names = names_read("a = b\ndef f():\n    return c\nclass K:\n    v = d\ndel e")
    assert {"b", "c", "d", "e"} <= names and "a" not in names


def test_the_cell_gets_notebook_values_and_changes_none_of_them(warm, shell):
    shell.user_ns.update(w=torch.arange(3.0), scale=10, dl=dl)   # a module goes by name
    values = run(shell, "-n 2 -o res", "w = w * scale + dl.rank()\nw.sum().item()")
    assert values == [30.0, 33.0]
    assert torch.equal(shell.user_ns["w"], torch.arange(3.0))   # assigned in the ranks only
    assert isinstance(shell.user_ns["res"], dl.LaunchResult)
    assert shell.user_ns["res"].values == values
    assert run(shell, "-n 2", "x = 1") is None                   # no last expression


def test_a_variable_that_cannot_be_sent_is_refused_by_name(warm, shell):
    shell.user_ns["lock"] = threading.Lock()
    with pytest.raises(ValueError, match="notebook variable `lock` .*Create it inside the cell"):
        run(shell, "-n 2", "print(lock)")


def test_ipythons_own_names_are_not_sent(warm, shell):
    shell.run_cell("1 + 1")   # binds _, _1, Out
    assert run(shell, "-n 2", "'_' in globals(), 'Out' in globals()") == [(False, False)] * 2


def test_a_rank_that_raises_is_a_launch_error_naming_it(warm, shell):
    body = "import dpmp_lab as dl\nassert dl.rank() == 0, 'only rank 0 may pass'"
    with pytest.raises(dl.LaunchError) as info:
        run(shell, "-n 2 --timeout 20", body)
    assert "rank 1 raised AssertionError: only rank 0 may pass" in str(info.value)
    assert "rank 0 raised" not in str(info.value)


def test_debug_turns_on_torchs_checks_in_the_ranks(warm, shell, monkeypatch):
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    body = "import torch.distributed as dist\ndist.get_debug_level().name"
    assert run(shell, "-n 2 --debug", body) == ["DETAIL", "DETAIL"]
    assert run(shell, "-n 2", body) == ["OFF", "OFF"]
