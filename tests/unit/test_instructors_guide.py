"""INSTRUCTORS.md and CITATION.cff say what the notebooks hold: the points and answer cells of
each, every notebook in the table, and every work the notebooks cite among the references."""

from __future__ import annotations

import re

import nbformat
import yaml

from dpmp_lab.instructor import course
from tests.conftest import ROOT

ROW = re.compile(r"^\| `(\d\d_\w+)` \| (\d+) \| (\d+) \|", re.M)
# "Goyal et al. 2017", "McCandlish et al. (2018)", "Patarasuk & Yuan 2009",
# "Milakov & Gimelshein 2018"
CITED = re.compile(r"\b([A-Z][a-zA-Z]+)(?:\s+et\s+al\.,?|\s+&\s+[A-Z][a-zA-Z]+,?)\s+\(?(\d{4})\b")


def test_the_guide_has_each_notebooks_points_and_answer_cells():
    rows = {name: (int(points), int(cells))
            for name, points, cells in ROW.findall((ROOT / "INSTRUCTORS.md").read_text())}
    assert sorted(rows) == course.assignments(ROOT)
    for name, (points, cells) in rows.items():
        nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
        meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
        assert points == sum(m.get("points", 0) for m in meta if m.get("grade")), name
        assert cells == sum(1 for m in meta if m.get("solution")), name


def test_every_work_the_notebooks_cite_is_in_citation_cff():
    refs = yaml.safe_load((ROOT / "CITATION.cff").read_text())["references"]
    held = {(a.get("family-names"), str(r.get("year"))) for r in refs for a in r["authors"]}
    cited = set()
    for name in course.assignments(ROOT):
        nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
        cited |= set(CITED.findall("\n".join(c.source for c in nb.cells)))
    assert len(cited) >= 15, sorted(cited)     # the pattern still finds the house's citations
    assert not cited - held, f"cited in the notebooks, not in CITATION.cff: {sorted(cited - held)}"
