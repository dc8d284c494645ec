"""dpmp_lab/harness/cells.py: which cells the one-kernel grading re-runs after a changed cell."""

from __future__ import annotations

from dpmp_lab.harness.cells import EVERYTHING, cell_names, cells_to_rerun, read_cells


def test_names_read_and_bound_through_magics_defs_and_lambdas():
    names = cell_names("import torch\nfrom a.b import c as d\ndef f(x):\n    return g(x) + y\n"
                       "h = lambda: k\nz = f(1)\n")
    assert {"torch", "d", "f", "h", "z"} == names.binds
    assert names.definitions == {"torch", "d", "f"}
    assert names.inside["f"] >= {"g", "y"} and names.inside["h"] >= {"k"}
    magic = cell_names("%%distributed -n 2\nout = model(x)\n")
    assert {"model", "x"} <= magic.reads and "out" in magic.binds
    assert "x" in cell_names("print(globals()['x'])").reads
    assert EVERYTHING in cell_names("print(globals()[input()])").reads
    assert EVERYTHING not in cell_names("def f():\n    return globals()").reads
    assert "globals" in cell_names("def f():\n    global q\n    q = 1\n").inside["f"]
    assert EVERYTHING in cell_names("%run other.py").reads


def test_a_change_reaches_readers_through_functions_and_mutation():
    cells = ["import torch",                       # 0
             "def answer(x):\n    return x * 2",   # 1 the learner's (changed)
             "def check():\n    return answer(3)",  # 2 a helper that calls it later
             "model = [1]",                        # 3 unrelated, but read by 6
             "assert check() == 6",                # 4 reads answer through check
             "other = torch.ones(2)",              # 5 unrelated: skipped
             "model.append(answer(1))",            # 6 reads answer, mutates model
             "assert len(model) == 2",             # 7 reads the mutated model
             None,                                 # 8 markdown
             "assert other.sum() == 2"]            # 9 unrelated: skipped
    assert cells_to_rerun(cells, {1}) == {1, 2, 3, 4, 6, 7}
    # a change after everything it could reach: itself only
    assert cells_to_rerun(cells, {9}) == {9}


def test_a_cell_that_reaches_the_whole_namespace_spoils_all_after_it():
    cells = ["x = 1", "y = 2", "globals().update(q=1)", "z = 3", "w = 4"]
    assert cells_to_rerun(cells, {1}) == {1, 2, 3, 4}
    assert cells_to_rerun(["a = 1", "b = a", "c = 3"], {0}) == {0, 1}
    # a function that reads the namespace does so when it is called, not where it is defined
    cells = ["x = 1", "def names():\n    return sorted(globals())", "y = 2", "print(names())",
             "z = 3"]
    assert cells_to_rerun(cells, {2}) == {2, 3}
    assert cells_to_rerun(cells, {0}) == {0, 1, 2, 3}


def test_reading_the_namespace_is_not_writing_it():
    reader = cell_names("for n in ('a', 'b'):\n    v = globals()[n]\nprint(globals().get('c'))")
    assert {"a", "b", "c"} <= reader.reads and EVERYTHING not in reader.reads | reader.binds
    whole = cell_names("print(sorted(globals()))\nv = globals()[f'x{1}']")
    assert EVERYTHING in whole.reads and EVERYTHING not in whole.binds
    for writer in ("globals()['a'] = 1", "globals().update(a=1)", "exec('a = 1')",
                   "get_ipython().user_ns['a'] = 1"):
        assert EVERYTHING in cell_names(writer).binds, writer
    cells = ["a = 1", "b = 2", "assert globals()['a'] == 1", "c = 3", "print(globals())"]
    # the last reads every name: what skipped cells since the change bound must be there
    assert cells_to_rerun(cells, {0}) == {0, 1, 2, 3, 4}
    assert cells_to_rerun(cells[:4], {0}) == {0, 2}


def test_a_function_defined_and_launched_in_one_cell_reads_what_its_body_reads():
    cells = ["def answer():\n    return 1",
             "def check():\n    assert answer() == 1\n\ndl.launch(check, world_size=2)",
             "other = 2"]
    names = cell_names(cells[1])
    assert "check" in names.reads and "answer" in names.inside["check"]
    assert cells_to_rerun(cells, {0}) == {0, 1}


def test_a_cell_that_only_defines_does_not_read_what_its_functions_call():
    # 03's layers: MyMLP names MyLinear in a body, which calls f when used, not when defined
    cells = ["def f(x):\n    return x",
             "class MyLinear:\n    def forward(self, x: Width = 1):\n        return f(x)\n\n"
             "class MyMLP:\n    def __init__(self):\n        self.fc = MyLinear()",
             "MyMLP().fc.forward(1)",
             "Width = int"]
    assert {"MyLinear", "f"}.isdisjoint(cell_names(cells[1]).reads)
    reads = read_cells(cells).reads
    assert "f" not in reads[1] and "f" in reads[2]
    # an annotation is read where the function is defined
    assert "Width" in cell_names(cells[1]).reads
    assert "MyLinear" in cell_names("class MyLinear:\n    pass\n\nlayer = MyLinear()").reads


def test_names_a_block_binds_before_reading_them_are_not_read_from_earlier_cells():
    names = cell_names("for tp, (seed, *rest) in ((2, (0,)),):\n    check(tp, seed, rest)\n"
                       "with open(p) as f:\n    text = f.read()\n"
                       "try:\n    v = go()\nexcept E as err:\n    show(err)\nelse:\n    use(v)\n"
                       "if a:\n    both = 1\n    one = 1\nelse:\n    both = 2\n"
                       "print(both, one, tp)")
    assert {"seed", "rest", "f", "err", "v", "both"}.isdisjoint(names.reads)
    assert "tp" not in cell_names("for tp in (2, 4):\n    check(tp)").reads
    # after the loop (it may not have run) and after one branch only, the earlier values
    assert {"check", "p", "go", "E", "show", "use", "a", "one", "tp"} <= names.reads
    assert "tp" in cell_names("for tp in range(n):\n    pass\nprint(tp)").reads
    assert "x" in cell_names("for i in (1,):\n    print(x)\n    x = i").reads


def test_a_called_function_that_writes_the_namespace_spoils_every_later_cell():
    cells = ["x = 1",
             "def put(**values):\n    globals().update(values)",
             "def swap(**values):\n    saved = dict(globals())\n    globals().update(values)\n"
             "    try:\n        yield\n    finally:\n        globals().update(saved)",
             "y = 2",
             "put(z=3)",
             "w = 4",
             "print(w)"]
    assert "*=" in cell_names(cells[1]).inside["put"]
    assert cells_to_rerun(cells, {3}) == {3, 4, 5, 6}
    # a swap that puts back what it replaced, declared as one: reaches nothing
    cells[4] = "with swap(z=3):\n    pass"
    assert cells_to_rerun(cells, {3}) == {3, 4, 5, 6}
    assert cells_to_rerun(cells, {3}, swaps=frozenset({"swap"})) == {3}


def test_names_a_cell_uses_only_under_a_swap_are_not_read_by_it():
    # 03's tests of Exercise 3 launch with the library's f standing in for the learner's
    cells = ["def f(x):\n    return x",
             "class Layer:\n    def forward(self, x):\n        return f(x) + g(x)",
             "def g(x):\n    return x",
             "with stand_ins(f=library_f):\n    Layer().forward(1)",
             "print(2)"]
    assert cells_to_rerun(cells, {0}) == {0, 1, 2, 3}
    assert cells_to_rerun(cells, {0}, stood_in={3: frozenset({"f"})}) == {0}
    # what the cell reads through other names is still read
    assert cells_to_rerun(cells, {2}, stood_in={3: frozenset({"f"})}) == {2, 3}
