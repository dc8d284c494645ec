"""deploy/jupyterhub_config.py and dpmp_lab/instructor/hub.py: the settings and their errors,
the GPU map, each role's Jupyter config, the pre-spawn hook. The hub itself, end to end with
real accounts and a browser, is tests/end_to_end/test_hub_class.py."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import pwd
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from traitlets.config import Config

from dpmp_lab import i18n
from dpmp_lab.instructor import hub, hub_settings
from dpmp_lab.instructor.hub import HubConfigError, HubSettings
from tests.conftest import ROOT
from tests.support.browser_pages import wait_for


def settings(tmp_path: Path, **changes) -> HubSettings:
    course = tmp_path / "course"
    course.mkdir(exist_ok=True)
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    values = dict(course=course, exchange=tmp_path / "exchange", state=tmp_path / "state",
                  instructors=("teach",), learners=("ada", "bob", "cy"))
    return HubSettings(**{**values, **changes})


def test_round_robin_gives_each_user_a_block_and_shares_gpus_when_users_outnumber_them(
        tmp_path):
    s = settings(tmp_path, gpus=("0", "1", "2", "3"), gpus_per_user=2)
    assert [s.gpus_for(u) for u in ("teach", "ada", "bob", "cy")] == ["0,1", "2,3", "0,1", "2,3"]
    one = settings(tmp_path, gpus=("0", "1", "2"))
    assert [one.gpus_for(u) for u in ("teach", "ada", "bob", "cy")] == ["0", "1", "2", "0"]
    assert settings(tmp_path).gpus_for("ada") == ""        # no GPU: every launch on gloo
    assert one.gpus_for("stranger") == ""


def test_a_fixed_map_wins_over_the_round_robin(tmp_path):
    s = settings(tmp_path, gpus=("0", "1"), gpu_map=hub_settings.parse_gpu_map("bob=1; ada = 0,1"))
    assert (s.gpus_for("ada"), s.gpus_for("bob"), s.gpus_for("cy")) == ("0,1", "1", "1")


@pytest.mark.parametrize("env, message", [
    ({}, "DPMP_LAB_HUB_COURSE is not set"),
    ({"INSTRUCTORS": ""}, "name at least one instructor"),
    ({"LEARNERS": "ada teach"}, "both instructor and learner: teach"),
    ({"LEARNERS": "Ada;rm -rf"}, "not a user name: Ada;rm"),
    ({"GPUS": "0,x"}, "GPUS: not a GPU number: x"),
    ({"GPUS": "0,1", "GPUS_PER_USER": "3"}, "between 1 and the server's 2 GPUs"),
    ({"GPUS_PER_USER": "two"}, "GPUS_PER_USER='two' is not a number"),
    ({"GPUS": "0", "GPU_MAP": "ada=1"}, "no such GPU on this server: 1"),
    ({"GPUS": "0", "GPU_MAP": "eve=0"}, "GPU_MAP names no user of the course: eve"),
    ({"GPU_MAP": "ada:0"}, "'ada:0' is not USER=GPU"),
    ({"LANGUAGE": "fr"}, "LANGUAGE='fr': one of en, ja"),
    ({"LANGUAGE_MAP": "ada=fr"}, "'ada=fr' is not USER=LANGUAGE"),
    ({"LANGUAGE_MAP": "eve=ja"}, "LANGUAGE_MAP names no user of the course: eve"),
    ({"PASSWORD": "short"}, "PASSWORD: at least 8 characters"),
    ({"PYTHON": "/no/such/python"}, "PYTHON=/no/such/python is not a program"),
    ({"MEMORY": "lots"}, "MEMORY='lots': a size such as 4G"),
    ({"MEMORY": "100M"}, "at least 256M"),
    ({"CPUS": "0"}, "CPUS=0.0: a number of CPUs above 0"),
    ({"CPUS": "four"}, "CPUS='four' is not a number"),
    ({"CULL_IDLE": "-1"}, "CULL_IDLE=-1"),
    ({"SSL_CERT": "/etc/hostname"}, "SSL_CERT and DPMP_LAB_HUB_SSL_KEY go together"),
    ({"ROSTER": "/no/such/roster.csv"}, "ROSTER=/no/such/roster.csv: no such file"),
])
def test_bad_settings_are_refused_with_what_is_wrong(tmp_path, env, message):
    course = settings(tmp_path).course
    base = {"COURSE": str(course), "INSTRUCTORS": "teach", "LEARNERS": "ada bob", "GPUS": ""}
    values = {**base, **env} if env else {}
    with pytest.raises(HubConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        HubSettings.from_env({f"DPMP_LAB_HUB_{k}": v for k, v in values.items()})


def test_a_course_root_without_nbgrader_config_is_refused(tmp_path):
    with pytest.raises(HubConfigError, match="no nbgrader_config.py"):
        HubSettings.from_env({"DPMP_LAB_HUB_COURSE": str(tmp_path),
                              "DPMP_LAB_HUB_INSTRUCTORS": "teach"})


def test_learners_get_the_assignment_list_and_instructors_formgrader(tmp_path):
    s = settings(tmp_path, exchange=Path("/srv/x"))
    made = hub.write_role_configs(s)
    learner, instructor = made["learner"], made["instructor"]
    server = json.loads((learner / "jupyter_server_config.json").read_text())
    assert server["ServerApp"]["jpserver_extensions"] == {
        "nbgrader.server_extensions.formgrader": False,
        "nbgrader.server_extensions.course_list": False}
    lab = json.loads((learner / "labconfig" / "page_config.json").read_text())
    assert set(lab["disabledExtensions"]) == {"@jupyter/nbgrader:formgrader",
                                              "@jupyter/nbgrader:course-list",
                                              "@jupyter/nbgrader:create-assignment"}
    assert json.loads((instructor / "jupyter_server_config.json").read_text())["ServerApp"] == {
        "jpserver_extensions": {}}
    learner_nbgrader = (learner / "nbgrader_config.py").read_text()
    assert "c.Exchange.root = '/srv/x'" in learner_nbgrader
    assert "PrivateSubmit" in learner_nbgrader and "CourseDirectory.root" not in learner_nbgrader
    assert f"c.ExchangeFactory.fetch_assignment = {hub.LANGUAGE_FETCH!r}" in learner_nbgrader
    loaded = Config()
    runpy.run_path(str(instructor / "nbgrader_config.py"),
                   {"get_config": lambda: loaded, "load_subconfig": lambda path: None})
    assert loaded.CourseDirectory.root == str(s.course)
    assert loaded.CourseDirectory.course_id == "dpmp_lab"
    assert loaded.ExchangeFactory.collect == "dpmp_lab.instructor.exchange.OwnerCheckedCollect"
    assert loaded.ExchangeFactory.release_assignment == hub.TRANSLATED_RELEASE
    assert oct(s.state.stat().st_mode & 0o777) == "0o711"     # crossed, never listed
    assert oct(s.private.stat().st_mode & 0o777) == "0o700"   # the hub's database, secret
    assert (learner / "nbgrader_config.py").stat().st_mode & 0o004


@pytest.mark.skipif(os.geteuid() != 0, reason="the exchange's folders are given to an account")
def test_the_exchange_is_sticky_and_its_course_folder_the_instructors(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    s = settings(tmp_path, instructors=(me,))
    course = hub.prepare_exchange(s)
    assert oct(s.exchange.stat().st_mode & 0o7777) == "0o1777"
    assert course == s.exchange / "dpmp_lab" and course.stat().st_uid == os.getuid()
    assert oct(course.stat().st_mode & 0o777) == "0o755"
    assert hub.prepare_exchange(s) == course          # again: nothing changes
    os.chown(course, 54321, 54321)                    # made by someone else first
    with pytest.raises(HubConfigError, match="belongs to uid 54321, not to the instructor"):
        hub.prepare_exchange(s)
    with pytest.raises(HubConfigError, match="no account 'nosuchteacher' on this server"):
        hub.prepare_exchange(settings(tmp_path, instructors=("nosuchteacher",)))


def test_pre_spawn_sets_gpus_config_and_folder_by_role(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    s = settings(tmp_path, instructors=(me,), learners=("ada",), gpus=("0", "1"))
    spawner = SimpleNamespace(user=SimpleNamespace(name=me), environment={"KEEP": "1"},
                              notebook_dir="", args=[])
    hub.pre_spawn(s, spawner)
    assert spawner.environment["CUDA_VISIBLE_DEVICES"] == "0"
    assert spawner.environment["KEEP"] == "1"
    assert spawner.environment["JUPYTER_CONFIG_PATH"] == str(s.config_dir("instructor"))
    assert spawner.environment["PATH"].split(os.pathsep)[0] == str(Path(s.python).parent)
    assert spawner.environment["DPMP_LAB_LANG"] == "en" and spawner.args == []
    assert spawner.notebook_dir == str(s.course)


def test_pre_spawn_opens_each_users_course_in_their_language(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    s = settings(tmp_path, instructors=(me,), learners=("ada",),
                 language_map=hub_settings.parse_language_map(f"{me} = ja"))
    assert (s.language_for(me), s.language_for("ada")) == ("ja", "en")
    spawner = SimpleNamespace(user=SimpleNamespace(name=me), environment={}, notebook_dir="",
                              args=["--keep"])
    for _ in range(2):   # a server started again gets its settings once
        hub.pre_spawn(s, spawner)
        assert spawner.environment["DPMP_LAB_LANG"] == "ja"
        assert spawner.args == ["--keep", f"--LabApp.app_settings_dir={i18n.lab_settings('ja')}"]
    assert (i18n.lab_settings("ja") / "overrides.json").is_file()
    assert settings(tmp_path, language="ja").language_for("ada") == "ja"


def fake_release(folder: Path, language: str, grade_id: str = "answer") -> None:
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(metadata={"dpmp_lab": {"language": language}})
    nb.cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {
        "grade_id": grade_id, "points": 1, "grade": True, "solution": True}}))
    nbformat.write(nb, folder / "00_launch.ipynb")
    (folder / "data.txt").write_text(language)


def test_the_exchange_gives_each_learner_the_assignment_in_their_language(tmp_path):
    """nbgrader's own release and fetch, with the hub's exchange classes: the release carries
    the translation beside the English notebooks; a fetch in Japanese gets the Japanese
    notebook under the assignment's name, one in English the English one, neither the hidden
    folder; a fetch that restores a missing file leaves the learner's own notebook alone."""
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    fake_release(root / "course" / "00_launch", "en")
    fake_release(root / "course-ja" / "00_launch", "ja")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    common = [f"--Exchange.root={exchange}", "--CourseDirectory.course_id=dpmp_lab"]

    def nbgrader(*args: str, cwd: Path, **extra: str) -> None:
        done = subprocess.run([sys.executable, "-m", "nbgrader", *args, *common], cwd=cwd,
                              env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    nbgrader("release_assignment", "00_launch", f"--CourseDirectory.root={root}",
             "--CourseDirectory.release_directory=course", "--Exchange.path_includes_course=False",
             f"--ExchangeFactory.release_assignment={hub.TRANSLATED_RELEASE}", cwd=root)
    released = exchange / "dpmp_lab" / "outbound" / "00_launch"
    assert (released / ".translations" / "ja" / "00_launch.ipynb").is_file()
    fetch = ("fetch_assignment", "00_launch", f"--ExchangeFactory.fetch_assignment={hub.LANGUAGE_FETCH}")
    for language in ("ja", "en"):
        home = tmp_path / f"home-{language}"
        home.mkdir()
        nbgrader(*fetch, cwd=home, DPMP_LAB_LANG=language)
        got = home / "00_launch"
        assert sorted(p.name for p in got.iterdir()) == ["00_launch.ipynb", "data.txt"]
        nb = nbformat.read(got / "00_launch.ipynb", as_version=4)
        assert nb.metadata["dpmp_lab"]["language"] == language
        assert (got / "data.txt").read_text() == "en"   # what is not a notebook: the release's
    mine = tmp_path / "home-ja" / "00_launch"
    nbformat.write(nbformat.v4.new_notebook(metadata={"mine": True}), mine / "00_launch.ipynb")
    (mine / "data.txt").unlink()
    nbgrader(*fetch, "--replace", cwd=mine.parent,
             DPMP_LAB_LANG="ja")
    assert nbformat.read(mine / "00_launch.ipynb", as_version=4).metadata == {"mine": True}
    assert (mine / "data.txt").is_file() and not (mine / ".translations").exists()
    # a translation written from an older release (other graded cells) is not released
    shutil.rmtree(root / "course-ja")
    fake_release(root / "course-ja" / "00_launch", "ja", grade_id="older")
    nbgrader("release_assignment", "00_launch", "--force", f"--CourseDirectory.root={root}",
             "--CourseDirectory.release_directory=course", "--Exchange.path_includes_course=False",
             f"--ExchangeFactory.release_assignment={hub.TRANSLATED_RELEASE}", cwd=root)
    assert not (released / ".translations").exists()


def test_the_config_file_sets_up_the_hub_and_says_when_the_proxy_is_missing(
        tmp_path, monkeypatch):
    me = pwd.getpwuid(os.getuid()).pw_name
    s = settings(tmp_path, password="a-test-password", instructors=(me,))
    for key, value in {"COURSE": s.course, "INSTRUCTORS": me, "LEARNERS": "ada bob",
                       "STATE": s.state, "EXCHANGE": s.exchange, "GPUS": "0",
                       "PASSWORD": s.password}.items():
        monkeypatch.setenv(f"DPMP_LAB_HUB_{key}", str(value))
    # this checkout's own modes are checked by test_hub_class, which locks it for its class
    monkeypatch.setattr(hub, "check_checkout", lambda checkout: None)
    c = Config()
    config_file = ROOT / "deploy" / "jupyterhub_config.py"
    proxy = ROOT / "deploy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if proxy.exists():
        runpy.run_path(str(config_file), {"get_config": lambda: c})
        assert c.JupyterHub.authenticator_class == "shared-password"
        assert c.Authenticator.allowed_users == {me, "ada", "bob"}
        assert "admin_users" not in c.Authenticator   # one password for all makes no admin
        assert c.Spawner.cmd == [sys.executable, "-m", "jupyterhub.singleuser"]
        assert c.ConfigurableHTTPProxy.command == [str(proxy)]
        assert callable(c.Spawner.pre_spawn_hook)
        assert c.JupyterHub.db_url == f"sqlite:///{s.state / 'hub' / 'jupyterhub.sqlite'}"
        assert Path(c.JupyterHub.cookie_secret_file).parent == s.private
    with pytest.raises(HubConfigError, match="npm ci --prefix"):
        hub.configure(Config(), s, proxy=tmp_path / "node_modules" / ".bin" / "chp",
                      checkout=tmp_path)
    c = Config()
    hub.configure(c, settings(tmp_path, instructors=(me,)), proxy=Path(sys.executable),
                  checkout=tmp_path)
    assert c.JupyterHub.authenticator_class == "pam"     # system accounts without a password


def test_the_hub_refuses_to_start_without_its_settings_and_says_which(tmp_path):
    """jupyterhub itself, with the deployment's config and no DPMP_LAB_HUB_COURSE: it exits
    at once with the reason, and makes no state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPMP_LAB_HUB_")}
    env["DPMP_LAB_HUB_STATE"] = str(tmp_path / "state")
    done = subprocess.run([str(Path(sys.executable).parent / "jupyterhub"), "-f",
                           str(ROOT / "deploy" / "jupyterhub_config.py"), "--port=0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "DPMP_LAB_HUB_COURSE is not set" in done.stdout + done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "jupyterhub.sqlite").exists()


def test_the_server_gpus_are_what_nvidia_smi_lists(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: a)'\n"
                    "echo 'GPU 1: NVIDIA H200 (UUID: b)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hub_settings.server_gpus() == ("0", "1")
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert hub_settings.server_gpus() == ()

    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], 30)

    monkeypatch.setattr(hub_settings.subprocess, "run", hangs)
    with pytest.raises(HubConfigError, match="did not answer in 30 s: name the GPUs"):
        hub_settings.server_gpus()


def test_the_names_the_hub_writes_into_jupyters_config_resolve():
    """The exchange classes and the server extensions hub.py names as strings exist: a rename
    fails here, not in a learner's server that quietly keeps nbgrader's own submit."""
    for dotted in (hub.PRIVATE_SUBMIT, hub.OWNER_CHECKED_COLLECT, hub.LANGUAGE_FETCH,
                   hub.TRANSLATED_RELEASE, hub.LIMITED_SPAWNER, hub.SYSTEMD_SPAWNER):
        module, _, name = dotted.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), name), type), dotted
    for module in (*hub.LEARNER_SERVER_OFF, hub.ROSTER_SERVICE, "jupyterhub_idle_culler"):
        assert importlib.util.find_spec(module) is not None, module


def test_the_hub_refuses_a_checkout_whose_hidden_tests_others_can_read(tmp_path):
    """solutions/ (the hidden tests), tests/ (wrong answers and fixes), .git and grading's
    state: the hub starts only when no other account may read or enter them."""
    checkout = tmp_path / "checkout"
    for folder in ("solutions/00_launch", "tests/course_variants", ".git", "dpmp_lab", ".venv"):
        (checkout / folder).mkdir(parents=True)
        (checkout / folder).chmod(0o755)
    (checkout / "gradebook.db").write_text("")
    (checkout / "gradebook.db").chmod(0o644)
    with pytest.raises(HubConfigError) as info:
        hub.check_checkout(checkout)
    for name in ("solutions", "tests", ".git", "gradebook.db"):
        assert name in str(info.value)
    assert f"chmod go-rwx {checkout / 'solutions'}" in str(info.value)
    for name in ("solutions", "tests", ".git"):
        (checkout / name).chmod(0o750)        # a group may still enter
    (checkout / "gradebook.db").chmod(0o600)
    assert hub.open_to_others(checkout) == [checkout / n for n in ("solutions", "tests", ".git")]
    for name in ("solutions", "tests", ".git"):
        (checkout / name).chmod(0o700)
    hub.check_checkout(checkout)              # the package and .venv stay readable
    assert hub.open_to_others(checkout) == []


def test_limits_culling_restarts_and_the_roster_are_configured(tmp_path):
    """Where systemd does not run (this machine): LimitedSpawner with the limits; servers left
    running when the hub stops; the culler and the roster's follower as services of the hub's,
    each with its scopes; instructors are admins; the roster's learners may log in; each
    server's kernels culled by Jupyter too; DPMP_LAB_CORES from the CPU share."""
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name,email,lms_user_id\neve,Eve,L,e@x.edu,7\n"
                      "ada,Ada,L,a@x.edu,8\n")
    me = pwd.getpwuid(os.getuid()).pw_name
    s = settings(tmp_path, roster=roster, memory="3G", cpus=2.5, cull_idle=600,
                 gpus=("0", "1"), instructors=(me,))
    assert s.users == (me, "ada", "bob", "cy", "eve") and s.cores == 2
    assert s.gpus_for("eve") == "0"   # after everyone named: nobody else's GPUs move
    c = Config()
    hub.configure(c, s, proxy=Path(sys.executable), checkout=tmp_path)
    assert c.JupyterHub.spawner_class == hub.LIMITED_SPAWNER and not hub.systemd_runs()
    assert (c.Spawner.mem_limit, c.Spawner.cpu_limit) == ("3G", 2.5)
    assert c.JupyterHub.cleanup_servers is False
    assert c.Authenticator.admin_users == {me}
    assert c.Authenticator.allowed_users == {me, "ada", "bob", "cy", "eve"}
    services = {svc["name"]: svc["command"] for svc in c.JupyterHub.services}
    assert services["idle-culler"][-2:] == ["--timeout=600", "--cull-every=200"]
    assert services["roster"][-4:] == ["--roster", str(roster), "--keep", f"{me},ada,bob,cy"]
    scopes = {role["name"]: set(role["scopes"]) for role in c.JupyterHub.load_roles}
    assert scopes["idle-culler"] == {"list:users", "read:users:activity", "read:servers",
                                     "delete:servers"}
    server = json.loads((s.config_dir("learner") / "jupyter_server_config.json").read_text())
    assert server["MappingKernelManager"]["cull_idle_timeout"] == 600
    spawner = SimpleNamespace(user=SimpleNamespace(name="eve"), environment={},
                              notebook_dir="", args=[])
    with pytest.MonkeyPatch.context() as mp:
        account = SimpleNamespace(pw_dir=str(tmp_path), pw_uid=-1)
        mp.setattr(hub.pwd, "getpwnam", lambda name: account)
        hub.pre_spawn(s, spawner)
    assert spawner.environment["DPMP_LAB_CORES"] == "2"
    c = Config()
    hub.configure(c, settings(tmp_path, cull_idle=0, instructors=(me,)),
                  proxy=Path(sys.executable), checkout=tmp_path)
    assert c.JupyterHub.services == [] and "MappingKernelManager" not in json.loads(
        (s.config_dir("learner") / "jupyter_server_config.json").read_text())


def test_another_authenticator_and_the_servers_own_config_plug_in(tmp_path):
    extra = tmp_path / "hub_config.py"
    extra.write_text("c.GenericOAuthenticator.client_id = 'dpmp-lab'\n"
                     "c.Spawner.cpu_limit = 8.0\n")
    extra.chmod(0o644)
    me = pwd.getpwuid(os.getuid()).pw_name
    c = Config()
    hub.configure(c, settings(tmp_path, authenticator="generic-oauth", extra_config=extra,
                              instructors=(me,)),
                  proxy=Path(sys.executable), checkout=tmp_path)
    assert c.JupyterHub.authenticator_class == "generic-oauth"
    assert c.GenericOAuthenticator.client_id == "dpmp-lab"
    assert c.Spawner.cpu_limit == 8.0   # read last: the server's own word wins
    assert c.Authenticator.allowed_users == {me, "ada", "bob", "cy"}
    extra.chmod(0o666)
    with pytest.raises(HubConfigError, match="writable by root alone"):
        settings(tmp_path, extra_config=extra)


def test_a_roster_without_accounts_a_bad_name_or_open_to_all_is_refused(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("first_name,email\nAda,a@x.edu\n")
    with pytest.raises(HubConfigError, match="no `id` column"):
        settings(tmp_path, roster=roster)
    roster.write_text("id\nada\nrobert'); drop\n")
    with pytest.raises(HubConfigError, match="not a user name: robert"):
        settings(tmp_path, roster=roster)
    roster.write_text("id\nada\n")
    roster.chmod(0o666)   # a learner could add strangers or remove the others
    with pytest.raises(HubConfigError, match="any account may write it"):
        settings(tmp_path, roster=roster)


def test_the_roster_follower_adds_and_removes_only_what_the_file_says(tmp_path):
    from dpmp_lab.instructor import hub_roster

    class FakeHub:
        def __init__(self) -> None:
            self.names, self.calls = {"teach", "ada", "old"}, []

        def users(self) -> set[str]:
            return set(self.names)

        def add(self, name: str) -> None:
            self.calls.append(("add", name))
            self.names.add(name)

        def remove(self, name: str) -> None:
            self.calls.append(("remove", name))
            self.names.discard(name)

    api, roster, said = FakeHub(), tmp_path / "roster.csv", []
    roster.write_text("id,email\nnew,n@x.edu\n")
    assert hub_roster.sync(api, roster, {"teach", "ada"}, said.append, settle=0) == (
        {"new"}, {"old"})
    assert api.calls == [("add", "new"), ("remove", "old")] and len(said) == 2
    roster.write_text("")   # an editor's half-written file: nobody is removed
    assert hub_roster.sync(api, roster, {"teach", "ada"}, said.append, settle=0) == (set(), set())
    assert "roster not followed this time" in said[-1] and api.names == {"teach", "ada", "new"}
    roster.write_text("id\n")   # an empty roster, changed a moment ago: not yet
    assert hub_roster.sync(api, roster, {"teach", "ada"}, said.append) == (set(), set())
    assert api.names == {"teach", "ada", "new"}


def test_a_service_of_the_hub_ends_with_the_hub_whatever_it_ignored(tmp_path):
    """A service started through hub.SERVICE by a parent that ignores SIGINT (as a hub started
    in the background does) still stops on it, and ends when its parent is killed."""
    import signal

    import psutil

    parent = subprocess.Popen(
        [sys.executable, "-c", "import signal, subprocess, sys, time\n"
         "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
         f"p = subprocess.Popen([*{list(hub.SERVICE)!r}, 'http.server', '0', '--bind', "
         "'127.0.0.1'])\nprint(p.pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))

    def wait() -> None:   # ended: gone, or dead and not yet reaped by its parent
        def ended() -> bool:
            try:
                return child.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        wait_for(ended, 10, "the service still runs")

    started = lambda: child.cmdline()[1:3] == ["-m", "http.server"]   # noqa: E731 (exec'd)
    wait_for(started, 10, "no service")
    child.send_signal(signal.SIGINT)
    wait()
    parent.kill()
    parent.wait()
    parent = subprocess.Popen(   # the hub killed: its service follows
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen([*{list(hub.SERVICE)!r}, 'http.server', '0', '--bind', "
         "'127.0.0.1'])\nprint(p.pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    wait_for(started, 10, "no service")
    parent.kill()
    parent.wait()
    wait()


def test_the_supervisor_starts_a_killed_hub_again_and_not_one_that_failed_to_start(tmp_path):
    from dpmp_lab.instructor import hub_supervisor

    starts = tmp_path / "starts"
    fake = ("import os, pathlib, signal, sys\n"
            f"p = pathlib.Path({str(starts)!r})\n"
            "n = len(p.read_text()) if p.exists() else 0\n"
            "p.write_text('x' * (n + 1))\n"
            "if n == 0:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "sys.exit(3)\n")
    assert hub_supervisor.main(["-c", fake], command=[sys.executable]) == 3
    assert starts.read_text() == "xx"   # killed: started again; exit 3 at once: not


def test_the_systemd_unit_and_the_example_settings_are_the_checkouts(tmp_path):
    """deploy/dpmp-lab-hub.service runs this checkout's config from /srv/dpmp_lab (the guide's
    place) and stops the hub alone; deploy/hub.env.example holds every setting, valid."""
    unit = (ROOT / "deploy" / "dpmp-lab-hub.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines()
                 if "=" in line and not line.startswith("#"))
    assert lines["KillMode"] == "process" and lines["Restart"] == "on-failure"
    program, _, config = lines["ExecStart"].split()
    for path in (program, config):
        assert path.startswith("/srv/dpmp_lab/"), path
    assert (ROOT / config.removeprefix("/srv/dpmp_lab/")).is_file()
    assert program.removeprefix("/srv/dpmp_lab/") == ".venv/bin/jupyterhub"
    example, active = {}, {}
    for line in (ROOT / "deploy" / "hub.env.example").read_text().splitlines():
        key, _, value = line.lstrip("#").partition("=")
        if key.startswith(hub.PREFIX):
            example[key] = value
            if not line.startswith("#"):
                active[key] = value
    named = {f"{hub.PREFIX}{f.name.upper()}" for f in dataclasses.fields(HubSettings)}
    renamed = {"DPMP_LAB_HUB_LEARNERS", "DPMP_LAB_HUB_INSTRUCTORS"}
    assert named - {"DPMP_LAB_HUB_EXTRA_CONFIG", "DPMP_LAB_HUB_PASSWORD"} <= set(example) | renamed
    course = settings(tmp_path).course
    env = {k: v for k, v in active.items() if not k.endswith(("ROSTER", "PYTHON"))}
    env[f"{hub.PREFIX}COURSE"] = str(course)
    made = HubSettings.from_env(env)
    assert made.memory == "8G" and made.cpus == 4 and made.cull_idle == 3600


def test_a_server_is_not_started_where_no_cgroup_holds_its_memory(monkeypatch):
    """LimitedSpawner refuses to start a server it could not limit, and says why."""
    from dpmp_lab.instructor import hub_spawner, limits

    me = pwd.getpwuid(os.getuid()).pw_name
    spawner = hub_spawner.LimitedSpawner(user=SimpleNamespace(name=me), mem_limit="1G")
    monkeypatch.setattr(limits, "cgroup_mounts", dict)   # a machine without cgroups
    with pytest.raises(RuntimeError, match="would run without its memory limit"):
        spawner.make_preexec_fn(me)
