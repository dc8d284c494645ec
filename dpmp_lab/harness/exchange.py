"""The exchange folder between the two kernels of a graded notebook: the file names of the
harness's request n and of the learner's kernel's answer to it, and the most bytes an answer may
hold. No torch here: the grader's own process, which relays them (instructor/two_kernels.py),
never loads it."""

REQUEST = "in-{}"          # the harness's request n, in the exchange folder
ANSWER = "out-{}"          # the learner's kernel's answer to it
MAX_BYTES = 256 * 2**20    # of one answer, read within that bound and decoded within it

__all__ = ["ANSWER", "MAX_BYTES", "REQUEST"]
