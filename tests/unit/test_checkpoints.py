"""checkpoints.py: the one-kernel grading's saved namespaces, and when two values are the same."""

from __future__ import annotations

import collections
import copy
import dataclasses
import random
import threading

import torch

from tests.support.checkpoints import Checkpoints, same


def _defined(source: str, namespace: dict) -> object:
    exec(source, namespace)
    return namespace["f"]


def test_functions_are_the_same_only_with_the_same_code_defaults_and_closures():
    namespace: dict = {}
    one = _defined("def f(x, y=1):\n    return x + y\n", namespace)
    assert same(one, _defined("def f(x, y=1):\n    return x + y\n", namespace))   # re-run cell
    assert not same(one, _defined("def f(x, y=2):\n    return x + y\n", namespace))
    assert not same(one, _defined("def f(x, y=1):\n    return x - y\n", namespace))
    assert not same(one, _defined("def f(x, y=1):\n    return x + y\n", {}))   # other globals

    def make(k):
        def f():
            return k
        return f

    assert same(make([1]), make([1])) and not same(make(1), make(2))
    assert same([one], [_defined("def f(x, y=1):\n    return x + y\n", namespace)])


def test_values_tensors_and_objects_compare_by_what_a_later_cell_could_read():
    assert same(float("nan"), float("nan")) and not same(1, 1.0) and not same(1, True)
    assert same({"a": [1, (2, 3)]}, {"a": [1, (2, 3)]})
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})   # the order a loop would see
    assert same(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert not same(torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert not same(torch.ones(4)[::2], torch.ones(2))      # a view: its strides differ
    x = torch.ones(2, requires_grad=True)
    assert not same(x * 2, (x * 2).detach().requires_grad_())   # a graph is not a value
    model = torch.nn.Linear(2, 2)
    twin = copy.deepcopy(model)
    assert same(model, twin) and same(torch.optim.SGD(model.parameters(), lr=0.1),
                                      torch.optim.SGD(twin.parameters(), lr=0.1))
    with torch.no_grad():
        twin.weight[0, 0] += 1
    assert not same(model, twin)

    @dataclasses.dataclass
    class Point:
        x: int
        ys: list

    assert same(Point(1, [2]), Point(1, [2])) and not same(Point(1, [2]), Point(1, [3]))
    assert same(collections.defaultdict(list, a=[1]), collections.defaultdict(list, a=[1]))
    loop, other = [], []
    loop.append(loop)
    other.append(other)
    assert same(loop, other)


def test_what_cannot_be_read_is_never_the_same():
    assert not same(threading.Lock(), threading.Lock())       # state in C, no reduction
    assert not same((i for i in ()), (i for i in ()))
    assert not same(type("A", (), {}), type("A", (), {}))     # a class defined again
    assert not same({object()}, {object()})


def test_restore_puts_back_the_saved_namespace_except_what_is_kept():
    points = Checkpoints()
    namespace = {"a": [1], "b": 2, "_": "shell", "__dpmp_checkpoints": points}
    random.seed(0)
    points.save(namespace, 3)
    drawn = random.random()
    namespace["a"].append(5)
    namespace.update(b=3, c=4)
    assert points.differs(namespace, 3) == ["a", "b", "c"]
    points.restore(namespace, 3, keep=("b",))
    assert namespace == {"a": [1], "b": 3, "_": "shell", "__dpmp_checkpoints": points}
    assert random.random() == drawn and points.differs(namespace, 3) == ["b"]
    del namespace["b"]
    assert points.differs(namespace, 3) == ["b"]     # held by only one of the two
    points.restore(namespace, 3)
    assert points.differs(namespace, 3) == []
    namespace["a"].append(6)
    assert points.saved[3][0]["a"] == [1]            # put back as a copy


def test_restore_keeps_the_objects_that_hold_the_saved_values_already():
    points = Checkpoints()
    weights = torch.ones(2)
    namespace = {"weights": weights, "steps": [weights], "lr": 0.1}
    points.save(namespace, 0)
    namespace["lr"] = 0.2
    namespace["steps"] = [weights, weights]
    points.restore(namespace, 0, keep=("steps",))
    assert namespace["weights"] is weights and namespace["steps"][1] is weights
    assert namespace["lr"] == 0.1


def test_only_the_names_later_cells_read_are_compared_and_put_back():
    cp = Checkpoints()
    cp.save({"a": 1, "b": [1, 2], "c": torch.zeros(2)}, 3)
    ns = {"a": 2, "b": [1, 3], "c": torch.zeros(2), "d": 4}
    assert cp.differs(ns, 3) == ["a", "b", "d"]
    assert cp.differs(ns, 3, only=("b", "c")) == ["b"]   # what no later cell reads is left out
    cp.restore(ns, 3, only=("b", "d"))
    assert ns["b"] == [1, 2] and "d" not in ns and ns["a"] == 2   # "a" not read later: as it was
