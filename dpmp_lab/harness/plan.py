"""Which process runs each cell of a graded notebook, and which of the learner's names the tests
read: decided from the notebook's own cells alone (their source as the gradebook holds it), never
from what the learner wrote.

    learner's cells            the learner's kernel (in the sandbox), and nowhere else
    the graded test cells      the harness (remote.py), and nowhere else: the hidden tests
                               never reach a process that runs the learner's code
    the notebook's other cells the learner's kernel, where the learner's code may need what
    (imports, helpers, demos)  they define; also the harness when a later harness cell reads a
                               name one binds, or one runs a line magic (%load_ext); the
                               harness alone when one reads a name only a test cell binds

A cell that both run shows the learner's kernel's output. The learner's names are those the
harness's cells read (through the functions they call) that no harness cell binds.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from dpmp_lab.harness.cells import EVERYTHING, WRITES, read_cells

SHELL_NAMES = frozenset({"get_ipython", "display", "In", "Out", "exit", "quit", "open"})


class Kind(enum.Enum):
    """Whose a code cell is."""

    LEARNER = "learner"   # an answer cell, or a cell the learner added or changed
    OWN = "own"           # the notebook's own, not graded
    TEST = "test"         # the notebook's own, graded


class Where(enum.Enum):
    """Where a code cell runs."""

    LEARNER = "learner"
    HARNESS = "harness"
    BOTH = "both"         # the learner's kernel's output is kept


@dataclass(frozen=True)
class Plan:
    where: dict[int, Where]        # code cell index -> where it runs
    learner_names: frozenset[str]  # what the harness asks the learner's kernel for

    def runs_in_learner(self, index: int) -> bool:
        return self.where.get(index) in (Where.LEARNER, Where.BOTH)

    def runs_in_harness(self, index: int) -> bool:
        return self.where.get(index) in (Where.HARNESS, Where.BOTH)


def _line_magic(source: str) -> bool:
    return any(line.lstrip().startswith("%") and not line.lstrip().startswith("%%")
               for line in source.splitlines())


def plan(cells: Sequence[tuple[Kind, str] | None]) -> Plan:
    """The plan of a notebook: `cells` in order, (kind, source) for each code cell, None for
    the others. Only the sources of OWN and TEST cells are read."""
    reading = read_cells([c[1] if c is not None and c[0] is not Kind.LEARNER else None
                          for c in cells])
    where: dict[int, Where] = {}
    test_binds: set[str] = set()
    own_binds: set[str] = set()
    for i, cell in enumerate(cells):
        if cell is None:
            continue
        kind = cell[0]
        if kind is Kind.LEARNER:
            where[i] = Where.LEARNER
        elif kind is Kind.TEST:
            where[i] = Where.HARNESS
            test_binds |= set(reading.binds[i]) - own_binds
        else:
            reads = reading.reads[i] - {EVERYTHING, WRITES}
            where[i] = Where.HARNESS if reads & (test_binds - own_binds) else Where.LEARNER
            own_binds |= set(reading.binds[i])
    # from the end: an own cell the harness needs, for a name a later harness cell reads
    needed: set[str] = set()
    for i in sorted(where, reverse=True):
        if where[i] is Where.HARNESS:
            needed |= reading.reads[i]
        elif cells[i][0] is Kind.OWN and (set(reading.binds[i]) & needed
                                          or _line_magic(cells[i][1])):
            where[i] = Where.BOTH
            needed |= reading.reads[i]
    harness = [i for i, w in where.items() if w is not Where.LEARNER]
    bound = set().union(*(reading.binds[i] for i in harness))
    read = set().union(*(reading.reads[i] for i in harness))
    names = read - bound - {EVERYTHING, WRITES} - set(dir(builtins)) - SHELL_NAMES
    return Plan(where, frozenset(names))


__all__ = ["SHELL_NAMES", "Kind", "Plan", "Where", "plan"]
