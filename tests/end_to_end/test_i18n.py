"""The course in Japanese from the English source: what is cut out for translators, how it is
put back, and the catalogues against the notebooks (dpmp_lab/i18n)."""

from __future__ import annotations

import csv
import json
import re
import shutil

import nbformat
import polib
import pytest

from dpmp_lab import i18n
from dpmp_lab.i18n import units, writing
from dpmp_lab.instructor.course import assignments, repo_root
from tests.support.notebook_sources import translated

ROOT = repo_root()
# the notebooks whose Japanese catalogue is complete: every piece translated, none stale
TRANSLATED = {"ja": ["00_launch", "01_collectives", "02_data_parallel", "03_tensor_parallel",
                     "04_pipeline", "05_hybrid", "06_planning", "07_sharding", "08_performance",
                     "09_context_parallel", "10_pipeline_schedules", "11_expert_parallel"]}


def solution(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)


# --- cutting and putting back -----------------------------------------------------------------

def test_a_markdown_cell_is_cut_at_blank_lines_and_code_and_formulas_stay():
    fence = "```python\nx = 1\n\nprint('a b')\n```"
    source = f"# Title\n\nOne line\nand its next.\n\n{fence}\n\n---\n\n$$a+b$$"
    texts = [p.text for p in units.markdown_pieces(source)]
    assert texts == ["# Title", "One line\nand its next."]
    back = writing.put_back(source, units.markdown_pieces(source), lambda p: p.text.upper())
    assert back == f"# TITLE\n\nONE LINE\nAND ITS NEXT.\n\n{fence}\n\n---\n\n$$a+b$$"


CODE = '''\
def check(n: int) -> None:
    """Say what is wrong with n."""
    total = {"grad x": 1}["grad x"]          # a key: data
    if mode == "fast path":                  # compared: data
        print("as expected:", n)
    assert n > 0, (f"n = {n!r} is not positive "
                   "[hint: x.positive]")
    raise ValueError(f"{n} of {total:.2f} is wrong")
'''


def test_what_a_learner_reads_is_cut_out_and_data_is_not():
    kinds = [(p.kind, p.text) for p in units.code_pieces(CODE)]
    assert kinds == [
        ("string", "Say what is wrong with n."),
        ("comment", "a key: data"),
        ("comment", "compared: data"),
        ("string", "as expected:"),
        ("string", "n = {n!r} is not positive [hint: x.positive]"),
        ("string", "{n} of {total:.2f} is wrong")]


def test_a_translation_keeps_the_code_and_its_fields_and_a_long_string_spans_lines():
    ja = {"Say what is wrong with n.": "n の誤りを言います。",
          "as expected:": "期待どおり：",
          "n = {n!r} is not positive [hint: x.positive]":
              "n = {n!r} は正ではありません。正の数でなければ次の計算に進めないため、ここで止めます "
              "[hint: x.positive]",
          "{n} of {total:.2f} is wrong": "{total:.2f} のうち {n} が違います"}
    out = writing.put_back(CODE, units.code_pieces(CODE), lambda p: ja.get(p.text))
    assert writing.differs(CODE, out) is None
    namespace: dict = {"mode": "slow"}
    exec(compile(out, "<ja>", "exec"), namespace)
    with pytest.raises(AssertionError, match=r"n = -1 は正ではありません。.*\[hint: x.positive\]"):
        namespace["check"](-1)
    with pytest.raises(ValueError, match="1.00 のうち 3 が違います"):
        namespace["check"](3)
    assert namespace["check"].__doc__ == "n の誤りを言います。"
    assert max(len(line) for line in out.splitlines()) < 100


def test_a_joined_string_whose_first_part_is_plain_is_written_back_as_an_f_string():
    source = 'raise ValueError("a plain start, "\n                 f"then {n} in a field")\n'
    out = writing.put_back(source, units.code_pieces(source),
                           lambda p: "まず普通の文、それから{n}が入ります")
    with pytest.raises(ValueError, match="それから3が入ります"):
        exec(compile(out, "<ja>", "exec"), {"n": 3})


def test_differs_names_a_translation_that_would_run_other_code():
    assert writing.differs(CODE, CODE.replace("n > 0", "n >= 0")) == (
        "the code differs, not only its text")
    assert "is data" in writing.differs(CODE, CODE.replace('"fast path"', '"速い"'))
    assert "replacement fields" in writing.differs(CODE, CODE.replace("{n!r}", "{n}"))
    assert writing.differs(CODE, CODE.replace("as expected:", "期待どおり")) is None


def test_magics_and_shell_lines_are_read_around():
    source = "%%distributed 2\nprint('rank says hello')  # a comment\n!ls\n"
    assert [p.text for p in units.code_pieces(source)] == ["rank says hello", "a comment"]


def test_template_parts_keep_a_nested_field_whole():
    parts = units.template_parts("after {', '.join(f'x {i}' for i in a)} and {{literal}}")
    assert parts == [(False, "after "), (True, "{', '.join(f'x {i}' for i in a)}"),
                     (False, " and {{literal}}")]


# --- catalogues -------------------------------------------------------------------------------

def _nb(*markdown: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(m) for m in markdown])


def test_update_moves_shared_pieces_to_common_and_marks_a_changed_one_fuzzy(monkeypatch):
    stored: dict = {}
    monkeypatch.setattr(i18n.catalogue, "load",
                        lambda language, domain: stored.get(domain) or polib.POFile())
    first = i18n.update("ja", {"01_a": _nb("Shared text.", "Only in a, first version."),
                               "02_b": _nb("Shared text.")})
    assert [e.msgid for e in first["common"]][:1] == ["Shared text."]
    assert [e.msgid for e in first["01_a"]] == ["Only in a, first version."]
    first["01_a"][0].msgstr = "a だけ、最初の版。"
    first["common"][0].msgstr = "共通の文。"
    stored.update(first)
    second = i18n.update("ja", {"01_a": _nb("Shared text.", "Only in a, second version."),
                                "02_b": _nb("Something else.")})
    entries = {e.msgid: e for e in second["01_a"]}
    moved = entries["Shared text."]   # now in one notebook only: its translation follows it
    assert moved.msgstr == "共通の文。" and "fuzzy" not in moved.flags
    changed = entries["Only in a, second version."]
    assert changed.msgstr == "a だけ、最初の版。" and "fuzzy" in changed.flags
    assert changed.previous_msgid == "Only in a, first version."
    assert i18n.catalogue.entry_problem(changed).endswith("(fuzzy)")
    assert [e.msgid for e in second["common"] if e.obsolete] == []


def test_every_catalogue_is_in_step_with_its_notebook():
    """What `dpmp-lab translations update` would write is what is committed: a notebook changed
    without updating the catalogues fails here, with the command to run."""
    every = {name: solution(name) for name in assignments(ROOT)}
    for language in i18n.LANGUAGES[1:]:
        for domain, po in i18n.update(language, every).items():
            path = i18n.catalogue_path(language, domain)
            committed = path.read_text(encoding="utf-8") if path.exists() else ""
            assert po.__unicode__() == committed, (
                f"{path.relative_to(ROOT)} is not in step with the notebooks: run "
                f"`dpmp-lab translations update --lang {language}` and translate what it marks")


@pytest.mark.parametrize("language", sorted(TRANSLATED))
def test_the_notebooks_translated_are_those_listed_and_lack_nothing(language):
    """A notebook listed lacks no translation, none is stale, and its translation runs the same
    code (nbgrader grades one hand-in of each in that language:
    tests/end_to_end/test_course.py)."""
    lacking = [line for name in TRANSLATED[language]
               for line in i18n.problems(solution(name), language, name)]
    assert not lacking, "\n".join(lacking[:30])
    assert list(translated(language)) == TRANSLATED[language]


def test_what_only_the_hidden_tests_and_the_answers_say_stays_out_of_the_package():
    """A hidden test's message (a recall's explanation) or a model answer's comment is
    translated in solutions/i18n, which learners never get, not in the package they install;
    nothing in the package is missing from every release."""
    every = {name: i18n.notebook_pieces(solution(name)) for name in assignments(ROOT)}
    shown = {piece.text for pieces in every.values() for _, piece, hidden in pieces
             if not hidden}
    released = {p.text for name in assignments(ROOT) for _, p, _ in i18n.notebook_pieces(
        nbformat.read(ROOT / "course" / name / f"{name}.ipynb", as_version=4))}
    assert shown <= released
    for language in i18n.LANGUAGES[1:]:
        package = {e.msgid for path in i18n.catalogue_path(language, i18n.COMMON).parent.glob(
            "*.po") for e in polib.pofile(str(path))}   # obsolete ones too
        for name, pieces in every.items():
            secret = {piece.text for _, piece, hidden in pieces if hidden} - shown
            assert secret, f"{name}: no hidden test or answer says anything of its own?"
            assert not secret & package, sorted(secret & package)[:3]
            assert secret <= {e.msgid for domain in i18n.domains(name)
                              for e in i18n.load(language, domain)}


def _glossary(language: str) -> list[tuple[str, str]]:
    path = i18n.catalogue_path(language, "glossary").with_suffix(".tsv")
    rows = csv.reader((line for line in path.read_text(encoding="utf-8").splitlines()
                       if line and not line.startswith("#")), delimiter="\t")
    next(rows)
    return [(row[0], row[1]) for row in rows]


@pytest.mark.parametrize("language,name", [(lang, name) for lang, names in TRANSLATED.items()
                                           for name in names])
def test_a_translation_uses_the_glossarys_terms(language, name):
    terms = [(re.compile(rf"\b{english}\b", re.IGNORECASE), japanese)
             for english, japanese in _glossary(language)]
    wrong = []
    for domain in (name, i18n.COMMON):
        for entry in i18n.load(language, domain):
            if entry.obsolete or not entry.msgstr or entry.comment != "markdown":
                continue
            prose = re.sub(r"`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)", "", entry.msgid,
                           flags=re.S)
            wrong += [f"{domain}: {japanese!r} missing for {english.pattern!r} in "
                      f"{entry.msgid[:60]!r}" for english, japanese in terms
                      if english.search(prose) and japanese not in entry.msgstr]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("language", sorted(TRANSLATED))
def test_a_hint_is_introduced_by_the_words_the_class_report_finds(language):
    english, words = i18n.LIKELY_MISTAKE[i18n.SOURCE], i18n.LIKELY_MISTAKE[language]
    wrong = [e.msgid[:70] for name in TRANSLATED[language] for domain in i18n.domains(name)
             for e in i18n.load(language, domain)
             if not e.obsolete and e.msgstr and english in e.msgid and words not in e.msgstr]
    assert not wrong, f"translate {english!r} as {words!r} in: {wrong}"


JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


def test_the_japanese_release_is_the_same_assignment_and_a_learners_copy_opens_in_it(
        tmp_path, capsys, monkeypatch):
    """`release --lang ja` writes course-ja/ beside course/: the same cells, grade ids, points
    and code, checksums nbgrader's Validate accepts, no hidden test; refused where a catalogue
    lacks translations; `learner-copy --lang ja` gives it to learners, and `dpmp-lab lab` then
    opens it with JupyterLab's Japanese."""
    import os

    from nbgrader.utils import compute_checksum

    from dpmp_lab import cli

    name = TRANSLATED["ja"][0]
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / name, root / "solutions" / name)
    assert cli.main(["release", name, "--lang", "ja", "--root", str(root)]) == 0
    assert str(root / "course-ja" / name) in capsys.readouterr().out
    en = nbformat.read(root / "course" / name / f"{name}.ipynb", as_version=4)
    ja = nbformat.read(root / "course-ja" / name / f"{name}.ipynb", as_version=4)
    assert i18n.language_of(ja) == "ja" and i18n.language_of(en) == "en"
    assert [c.metadata.get("nbgrader") and {k: v for k, v in c.metadata.nbgrader.items()
                                            if k != "checksum"} for c in ja.cells] == [
        c.metadata.get("nbgrader") and {k: v for k, v in c.metadata.nbgrader.items()
                                        if k != "checksum"} for c in en.cells]
    for one, two in zip(en.cells, ja.cells, strict=True):
        if two.metadata.get("nbgrader", {}).get("checksum"):
            assert two.metadata.nbgrader.checksum == compute_checksum(two)
        if one.cell_type == "code":
            assert writing.differs(one.source, two.source) is None
    assert sum(bool(JAPANESE.search(c.source)) for c in ja.cells) > len(ja.cells) // 2
    assert not any("HIDDEN TESTS" in c.source for c in ja.cells)

    shutil.copytree(ROOT / "solutions" / "07_sharding", root / "solutions" / "07_sharding")
    if "07_sharding" not in TRANSLATED["ja"]:
        assert cli.main(["release", "07_sharding", "--lang", "ja", "--root", str(root)]) == 2
        assert "catalogues lack" in capsys.readouterr().err

    copy = tmp_path / "for_learners"
    assert cli.main(["learner-copy", str(copy), "--lang", "ja", "--root", str(root)]) == 0
    assert i18n.language_of_folder(copy / "course") == "ja"
    started = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append((argv, env)))
    assert cli.main(["lab", "--dir", str(copy / "course"), "--no-browser"]) == 0
    settings = i18n.lab_settings("ja")
    assert f"--LabApp.app_settings_dir={settings}" in started[0][0]
    assert started[0][1]["DPMP_LAB_LANG"] == "ja"    # the library's messages in Japanese too
    assert json.loads((settings / "overrides.json").read_text())[
        "@jupyterlab/translation-extension:plugin"]["locale"] == "ja_JP"


def test_a_course_in_japanese_is_written_from_the_english_one_the_first_time_it_is_opened(
        tmp_path, capsys):
    """`bootstrap.py course --lang ja` on a fresh checkout: course-ja/ does not exist yet, so
    opening it writes it from course/; a second time it is left as it is."""
    from dpmp_lab import cli
    from dpmp_lab.instructor import course

    name = TRANSLATED["ja"][0]
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / name, root / "solutions" / name)
    assert course.language_release(root, "ja") == root / "course-ja"
    assert not (root / "course-ja").exists()          # no English release to write it from
    assert cli.main(["release", name, "--root", str(root)]) == 0
    written = course.language_release(root, "ja") / name / f"{name}.ipynb"
    assert i18n.language_of(nbformat.read(written, as_version=4)) == "ja"
    stamp = written.stat().st_mtime_ns
    assert course.language_release(root, "ja") / name / f"{name}.ipynb" == written
    assert written.stat().st_mtime_ns == stamp
    assert course.language_release(root) == root / "course"


# -- the library's own messages -----------------------------------------------------------------


def test_every_message_the_library_marks_is_translated_with_the_same_fields():
    """Each `_("...")` and `N_("...")` of the package has a Japanese translation that is not
    stale, with the English's replacement fields; the catalogue holds no other."""
    from dpmp_lab._helpers import PACKAGE_DIR
    from dpmp_lab.i18n import messages

    assert len(messages.marked(PACKAGE_DIR)) >= 40
    assert i18n.library_problems("ja", PACKAGE_DIR) == []
    live = {e.msgid for e in i18n.load("ja", messages.DOMAIN) if not e.obsolete}
    assert live == set(messages.marked(PACKAGE_DIR))


def test_a_marker_holds_one_string_literal_and_a_lookup_of_a_name_is_allowed(tmp_path):
    from dpmp_lab.i18n import messages

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text('X = N_("kept for later")\ny = _("now {n}").format(n=1)\n'
                                  "z = _(X)\n")
    assert messages.marked(package) == {"kept for later": ["pkg/a.py:1"], "now {n}": ["pkg/a.py:2"]}
    (package / "b.py").write_text('w = N_("a {0}" + "b")\n')
    with pytest.raises(ValueError, match=r"pkg/b.py:1: N_\(\) takes one string literal"):
        messages.marked(package)


def test_the_library_speaks_the_language_dpmp_lab_lang_names(monkeypatch):
    """A check's report, its likely mistake and a launch's failure in Japanese under
    DPMP_LAB_LANG=ja; English without it, and for a language the package has no catalogue
    for (the variable is anyone's to set)."""
    import torch

    import dpmp_lab as dl

    def report() -> str:
        with pytest.raises(dl.check.CheckFailed) as caught:
            dl.check.compare([{"g": torch.ones(3) * 3}] * 2, {"g": torch.ones(3)})
        return str(caught.value)

    assert "differs from the reference" in report()
    monkeypatch.setenv("DPMP_LAB_LANG", "ja")
    japanese = report()
    assert "参照値と異なります" in japanese and "考えられる誤り：" in japanese
    assert "[hint: scale.sum_not_divided]" in japanese and "differs" not in japanese
    with pytest.raises(dl.LaunchError) as caught:
        dl.launch(_raises_on_rank_1, world_size=2, timeout=30, stream=False)
    assert "2ランク中、ランク 1 が失敗しました" in str(caught.value), str(caught.value)
    monkeypatch.setenv("DPMP_LAB_LANG", "xx")
    assert "differs from the reference" in report()


def test_the_librarys_tables_read_in_the_language_dpmp_lab_lang_names(monkeypatch):
    """dl.viz's and the library's tables: their headers and titles in Japanese under
    DPMP_LAB_LANG=ja (the cells, ops and group names, are identifiers and stay)."""
    import dpmp_lab as dl

    trace, memory = dl.Trace(), dl.cost.memory(1000, dp=4, zero=1)
    assert "calls" in str(trace.summary()) and "parameters" in str(memory.table())
    monkeypatch.setenv("DPMP_LAB_LANG", "ja")
    summary, state = str(trace.summary()), str(memory.table())
    assert "呼び出し回数" in summary and "このプロセスが発行した通信" in summary, summary
    assert "オプティマイザ状態" in state and "GPUあたりのモデル状態" in state, state
    assert "calls" not in summary and "optimizer" not in state
    schedule, picture = str(dl.pp.one_f_one_b(2, 2)), str(dl.viz.timeline(dl.pp.gpipe(2, 2)))
    assert "マイクロバッチm=2個" in schedule and "ステージ 1" in schedule, schedule
    assert "アイドル" in picture and "タイムステップ" in picture, picture
    prof = dl.bench.Profile(0, [dl.bench.Interval("backward", "mm", 0.0, 2.0)],
                            [dl.bench.Interval("comm", "all_reduce", 1.0, 3.0)], 3.0, [1.0])
    drawn = dl.viz.profile([prof])
    text, svg = str(drawn), drawn._repr_svg_()
    assert "ランク 0" in text and "重なりなし" in text and "隠れていない通信" in text, text
    assert "順伝播" in svg and "profiled" not in svg and "overlap" not in text, svg
    sweep = str(dl.bench.Sweep([dl.bench.SweepRow("all_reduce", 2, 1024, 1e-3, 9e-4)]).table())
    assert "中央値" in sweep and "median" not in sweep, sweep


def _raises_on_rank_1() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("on purpose")


def test_the_grader_runs_both_kernels_in_the_notebooks_language(tmp_path):
    """Both kernels of a graded notebook (the learner's and the harness) see DPMP_LAB_LANG set
    from the notebook's language (i18n.language_of: an allowlisted value, English for a
    language the package does not know)."""
    import asyncio

    from nbclient import NotebookClient

    from dpmp_lab.instructor.two_kernels import harness_beside, run_step

    async def spoken(language: str) -> tuple[str, str]:
        nb = nbformat.v4.new_notebook()
        nb.metadata["dpmp_lab"] = {"language": language}
        nb.cells.append(nbformat.v4.new_code_cell("pass"))
        client = NotebookClient(nb, timeout=120, kernel_name="python3")
        probe = "import os; print(os.environ.get('DPMP_LAB_LANG'))"
        async with harness_beside(client, [], timeout=120) as (harness, _):
            step = nbformat.v4.new_code_cell(probe)
            await client.async_execute_cell(step, 0)
            there = await run_step(harness, probe, 0)
        return (step.outputs[0]["text"].strip(),
                "".join(o.get("text", "") for o in there.outputs).strip())

    assert asyncio.run(spoken("ja")) == ("ja", "ja")
    unknown = nbformat.v4.new_notebook(metadata={"dpmp_lab": {"language": "klingon"}})
    assert i18n.language_of(unknown) == "en"   # what the grader would set for it
