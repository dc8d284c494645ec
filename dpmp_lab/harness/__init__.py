"""The harness: where a graded notebook's tests run, apart from the learner's code.

`cells` reads which names each cell of a notebook reads and binds.
"""

__all__: list[str] = []
