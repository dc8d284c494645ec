"""bootstrap.py and the install files: which torch each machine gets, which extras each command
installs, and environment.yml saying the same as constraints.txt and pyproject.toml."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, fake_nvidia_smi


@pytest.fixture(scope="module")
def bootstrap():
    spec = importlib.util.spec_from_file_location("bootstrap_under_test", ROOT / "bootstrap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]


def test_each_command_installs_extras_that_exist_and_dev_holds_the_others(bootstrap):
    have = extras()
    assert {e for wanted in bootstrap.EXTRAS.values() for e in wanted} <= set(have)
    [itself] = [r for r in have["dev"] if r.startswith("dpmp_lab[")]
    assert set(itself.removeprefix("dpmp_lab[").removesuffix("]").split(",")) == (
        bootstrap.HOLDS["dev"] - {"dev"})
    assert "pytest" in have["dev"] and "pytest" not in have["course"] + have["instructor"]
    assert "nbgrader" in have["instructor"] and "matplotlib" in have["instructor"]


def test_a_gpu_course_or_hub_gets_the_tested_torch_from_pypi_and_everything_else_the_cpu_build(
        bootstrap, monkeypatch, tmp_path):
    version = bootstrap.tested_torch()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    pip_calls = []
    real_run = bootstrap.subprocess.run

    def run(cmd, *args, **kwargs):   # nvidia-smi runs; pip is only recorded
        if "pip" in cmd:
            pip_calls.append(cmd[3:])
            return subprocess.CompletedProcess(cmd, 0)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(bootstrap.subprocess, "run", run)
    for purpose, gpus, have, want in [
            ("course", 8, None, f"torch=={version}"), ("hub", 8, None, f"torch=={version}"),
            ("course", 0, None, f"torch=={version}+cpu"), ("hub", 0, None, f"torch=={version}+cpu"),
            ("test", 8, None, f"torch=={version}+cpu"),
            # a CPU build left by the tests goes where the course or the hub finds a GPU
            ("hub", 8, f"{version}+cpu", f"torch=={version}"),
            ("course", 0, f"{version}+cpu", f"torch=={version}+cpu"),
            ("hub", 8, "2.9.1+cu128", "torch==2.9.1+cu128")]:
        monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / f"bin{gpus}", gpus))
        monkeypatch.setattr(bootstrap, "installed_torch", lambda python, have=have: have)
        pip_calls.clear()
        constraints, said = bootstrap.constraints_for(purpose, tmp_path / "python")
        torch_lines = [line.split(";")[0].strip() for line in constraints.splitlines()
                       if line.startswith("torch")]
        assert want in torch_lines, (purpose, gpus, have, torch_lines)
        assert len(torch_lines) == (2 if want.endswith("+cpu") and not have else 1)
        replaced = have is not None and "+cpu" in have and gpus > 0 and purpose != "test"
        assert pip_calls == ([["uninstall", "-y", "torch"]] if replaced else []), pip_calls
        assert ("replacing the CPU build" in said) == replaced


def test_uv_installs_from_what_pip_is_configured_with(bootstrap, monkeypatch, tmp_path):
    """uv reads no pip configuration: the indexes, wheel folders, constraints and certificate
    pip would use reach uv as its arguments, the environment's over the install section's over
    the global one, as pip reads them."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nextra-index-url = file:///a/simple file:///b/simple\n"
                      "find-links = /global-wheels\nno-index = false\n"
                      "[install]\nfind-links = /install-wheels\n")
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_CONSTRAINT", "/somewhere/caps.txt")
    monkeypatch.setenv("PIP_CERT", "/somewhere/ca.pem")
    args, env = bootstrap.uv_sources(Path(sys.executable))
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-strategy", "unsafe-best-match") in pairs   # pip's: every index counts
    assert [v for k, v in pairs if k == "--extra-index-url"] == ["file:///a/simple",
                                                                 "file:///b/simple"]
    assert [v for k, v in pairs if k == "--find-links"] == ["/install-wheels"]
    assert [v for k, v in pairs if k == "--constraint"] == ["/somewhere/caps.txt"]
    assert "--no-index" not in args and env == {"SSL_CERT_FILE": "/somewhere/ca.pem"}
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert "--no-index" in bootstrap.uv_sources(Path(sys.executable))[0]


def test_constraints_pin_the_uv_that_installs(bootstrap):
    assert re.search(r"^uv==\d", bootstrap.CONSTRAINTS.read_text(), re.M)


def test_environment_yml_pins_the_tested_torch_as_the_cpu_build_with_existing_extras(
        bootstrap):
    text = (ROOT / "environment.yml").read_text()
    version = bootstrap.tested_torch()
    assert f'torch=={version}+cpu ; sys_platform == "linux"' in text
    assert f"torch=={version}`" in text          # what the header says a GPU server uses
    assert bootstrap.CPU_INDEX in text
    [named] = re.findall(r"-e \.\[([\w,]+)\]", text)
    assert set(named.split(",")) <= set(extras())


def test_the_hub_installs_jupyterhub_with_the_course_and_the_pinned_proxy(bootstrap):
    have = extras()
    [itself] = [r for r in have["hub"] if r.startswith("dpmp_lab[")]
    assert set(itself.removeprefix("dpmp_lab[").removesuffix("]").split(",")) == (
        bootstrap.HOLDS["hub"] - {"hub"})
    assert "jupyterhub" in have["hub"]
    assert re.search(r"^jupyterhub==\d", (ROOT / "constraints.txt").read_text(), re.M)
    wanted = json.loads((ROOT / "deploy" / "package.json").read_text())["dependencies"]
    lock = json.loads((ROOT / "deploy" / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/configurable-http-proxy"]["version"]
    assert wanted == {"configurable-http-proxy": pinned}
    assert bootstrap.PROXY.relative_to(ROOT).parts[:2] == ("deploy", "node_modules")


def test_without_npm_the_hub_stops_with_how_to_get_it_and_the_tests_go_on(
        bootstrap, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bootstrap, "PROXY", tmp_path / "no-proxy")
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="apt-get install npm"):
        bootstrap.ensure_proxy(required=True)
    bootstrap.ensure_proxy(required=False)
    assert "the JupyterHub test will skip" in capsys.readouterr().out


def test_the_learners_config_goes_where_every_nbgrader_of_the_environment_reads_it(
        bootstrap, tmp_path):
    """Validate reads nbgrader_config.py from the server's working directory and jupyter's
    config path, not from the notebook's folder: course/nbgrader_config.py reaches a notebook
    fetched into a learner's home only as {sys.prefix}/etc/jupyter/nbgrader_config.py, put
    there by pyproject's data-files (a plain install) and by bootstrap (an editable one)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert data["data-files"]["etc/jupyter"] == [
        str(bootstrap.LEARNER_CONFIG.relative_to(ROOT))]
    venv = tmp_path / "venv"
    dest = bootstrap.install_learner_config(venv)
    assert dest == venv / "etc" / "jupyter" / "nbgrader_config.py"
    assert dest.read_text() == bootstrap.LEARNER_CONFIG.read_text()
    dest.write_text("c = get_config()\n")     # an older version: replaced
    bootstrap.install_learner_config(venv)
    assert dest.read_text() == bootstrap.LEARNER_CONFIG.read_text()


VALIDATE_CONFIG = """
from nbgrader.preprocessors import Execute
from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler
from nbgrader.validator import Validator
config = ValidateAssignmentHandler.load_config(None)   # what Validate's handler reads
print(Execute(parent=Validator(config=config)).timeout)
"""


def test_validate_in_a_learners_home_runs_with_the_courses_cell_timeout(tmp_path):
    """nbgrader 0.9.6's Validate button, in a server started in a learner's home where a
    notebook was fetched (no nbgrader_config.py there, none in ~/.jupyter): the course's 600 s
    per cell, not nbgrader's 30 s (this environment was set up by bootstrap.py)."""
    home = tmp_path / "learner"
    (home / "01_collectives").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["HOME"] = str(home)
    done = subprocess.run([sys.executable, "-c", VALIDATE_CONFIG], cwd=home, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = re.search(r"Execute\.timeout = (\d+)", (ROOT / "course" / "nbgrader_config.py")
                         .read_text()).group(1)
    assert done.stdout.split()[-1] == expected == "600", (
        f"Validate's cell timeout here is {done.stdout.split()[-1]} s: is "
        f"{sys.prefix}/etc/jupyter/nbgrader_config.py there? (`python3 bootstrap.py test` "
        "puts it there)")
