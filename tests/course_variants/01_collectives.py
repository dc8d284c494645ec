"""Wrong answers to 01_collectives, and the graded cells each must lose (all others keep points).

"visible": the visible test cells that already fail on the learner's side, before hand-in."""

from tests.course_variants import solution_editor

_edit = solution_editor("01_collectives")

# -- exercise 1: all_reduce = reduce_scatter + all_gather ----------------------------------------

HALVES_WITH_ALL_REDUCE = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    out = x.detach().clone()
    dist.all_reduce(out)
    return out
'''

HALVES_WITHOUT_PADDING = _edit("halves", (
    "    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])\n", ""))

HALVES_PADS_A_WHOLE_ROUND_TOO_MANY = _edit("halves", (
    "flat.new_zeros((-flat.numel()) % n)", "flat.new_zeros(n - flat.numel() % n)"))

HALVES_KEEPS_THE_PADDING = _edit("halves", (
    "return full[:x.numel()].view(x.shape)",
    "return full if full.numel() != x.numel() else full.view(x.shape)"))

# any other error: a typo, an exception of the learner's own
HALVES_WITH_A_TYPO = _edit("halves", ("flat = x.detach().flatten()", "flat = x.detach().flaten()"))

HALVES_AVERAGE_INSTEAD_OF_SUM = _edit("halves", (
    "    dist.reduce_scatter_single(mine, flat)\n",
    "    dist.reduce_scatter_single(mine, flat)\n    mine /= n\n"))

HALVES_CHANGES_ITS_INPUT = _edit("halves", (
    "    return full[:x.numel()].view(x.shape)",
    "    x.zero_()\n    return full[:x.numel()].view(x.shape)"))

# pads by hand, then hands over to the library (switched off while the exercise is graded)
HALVES_CALLS_THE_LIBRARY = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    flat = x.detach().flatten()
    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    return dl.collectives.all_reduce_by_halves(flat)[:x.numel()].view(x.shape)
'''

# -- exercise 2: the ring -------------------------------------------------------------------------

_RING_HEAD = '''
def ring_all_reduce(x: torch.Tensor) -> torch.Tensor:
    n, me = dist.get_world_size(), dist.get_rank()
    right, left = (me + 1) % n, (me - 1) % n
    chunks = [c.clone() for c in torch.tensor_split(x.detach().flatten(), n)]
'''
_RING_TAIL = '''
    return torch.cat(chunks).view(x.shape)
'''

RING_CALLS_ALL_REDUCE = _RING_HEAD + '''
    out = torch.cat(chunks)
    dist.all_reduce(out)
    chunks = [out]
''' + _RING_TAIL

RING_CALLS_THE_LIBRARY = _RING_HEAD + '''
    chunks = [dl.collectives.ring_all_reduce(x.detach().flatten())]
''' + _RING_TAIL

RING_PASSES_WHOLE_TENSORS = _RING_HEAD + '''
    total = torch.cat(chunks)
    passing = total.clone()
    for step in range(n - 1):
        incoming = torch.empty_like(passing)
        exchange(passing, incoming, right, left)
        total += incoming
        passing = incoming
    chunks = [total]
''' + _RING_TAIL

# the same ring mirrored: right numbers, but every message goes to the left neighbour
RING_THE_OTHER_WAY_ROUND = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me + step + 1) % n, (me + step + 2) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, left, right)
        chunks[recv_i] += incoming
    for step in range(n - 1):
        send_i, recv_i = (me + step) % n, (me + step + 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, left, right)
        chunks[recv_i] = incoming
''' + _RING_TAIL

RING_OVERWRITES_INSTEAD_OF_ADDING = _edit("ring", (
    "chunks[recv_i] += incoming", "chunks[recv_i] = incoming.clone()"))

RING_WITHOUT_ALL_GATHER = _edit("ring", (
    "    for step in range(n - 1):                       # all-gather\n"
    "        send_i, recv_i = (me - step) % n, (me - step - 1) % n\n"
    "        incoming = torch.empty_like(chunks[recv_i])\n"
    "        exchange(chunks[send_i], incoming, right, left)\n"
    "        chunks[recv_i] = incoming\n", ""))

RING_WITH_BLOCKING_SENDS = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me - step - 1) % n, (me - step - 2) % n
        incoming = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], dst=right)
        dist.recv(incoming, src=left)
        chunks[recv_i] += incoming
    for step in range(n - 1):
        send_i, recv_i = (me - step) % n, (me - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], dst=right)
        dist.recv(incoming, src=left)
        chunks[recv_i] = incoming
''' + _RING_TAIL

# -- exercise 3: sizes ----------------------------------------------------------------------------

COUNTS_ELEMENTS_NOT_BYTES = _edit("estimate", (
    "return math.prod(shape) * dtype.itemsize", "return math.prod(shape)"))

ALLOCATES_THE_TENSOR = _edit("estimate", (
    "return math.prod(shape) * dtype.itemsize", "return torch.empty(shape, dtype=dtype).nbytes"))

NBYTES_FROM_THE_LIBRARY = _edit("estimate", (
    "return math.prod(shape) * dtype.itemsize", "return dl.cost.tensor_bytes(shape, dtype)"))

MEGABYTES_NOT_MEBIBYTES = _edit("estimate", (
    "gradient_mib = nbytes((1024, 1024)) / 2**20\n"
    "activation_mib = nbytes((8, 128, 4096)) / 2**20",
    "gradient_mib = nbytes((1024, 1024)) / 10**6\n"
    "activation_mib = nbytes((8, 128, 4096)) / 10**6"))

RING_BYTES_AS_IF_WHOLE_TENSORS = _edit("estimate", (
    "ring_mib_per_rank = 2 * (8 - 1) / 8 * gradient_mib",
    "ring_mib_per_rank = (8 - 1) * gradient_mib"))

VARIANTS = [
    {"name": "dist.all_reduce instead of reduce_scatter + all_gather",
     "replace": {"halves": HALVES_WITH_ALL_REDUCE}, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["what this exercise rebuilds"]},
    {"name": "no padding: fails when the ranks do not divide the length",
     "replace": HALVES_WITHOUT_PADDING, "loses": ["halves_tests"], "visible": ["halves_tests"],
     "visible_says": ["pad with zeros first"]},
    {"name": "a typo (an AttributeError): no hint about sizes",
     "replace": HALVES_WITH_A_TYPO, "loses": ["halves_tests"], "visible": ["halves_tests"],
     "visible_says": ["has no attribute 'flaten'"], "visible_never_says": ["pad with zeros"]},
    {"name": "pads n zeros when n already divides the length (more bytes than needed)",
     "replace": HALVES_PADS_A_WHOLE_ROUND_TOO_MANY, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["bytes of all_gather"]},
    {"name": "padding not cut off",
     "replace": HALVES_KEEPS_THE_PADDING, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["has shape (6,), expected (5,)"]},
    {"name": "average instead of sum",
     "replace": HALVES_AVERAGE_INSTEAD_OF_SUM, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["1/2 of the reference"]},
    {"name": "the caller's tensor is overwritten",
     "replace": HALVES_CHANGES_ITS_INPUT, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["must be unchanged"]},
    {"name": "pads, then hands over to dl.collectives (switched off while graded)",
     "replace": {"halves": HALVES_CALLS_THE_LIBRARY}, "loses": ["halves_tests"],
     "visible": ["halves_tests"], "visible_says": ["switched off"]},
    {"name": "ring that calls dist.all_reduce (right numbers, wrong communication)",
     "replace": {"ring": RING_CALLS_ALL_REDUCE}, "loses": ["ring_comm_tests"],
     "visible": ["ring_comm_tests"], "visible_says": ["exchange(send, recv, dst, src)"]},
    {"name": "ring handed over to dl.collectives (switched off while graded)",
     "replace": {"ring": RING_CALLS_THE_LIBRARY},
     "loses": ["ring_numbers_tests", "ring_comm_tests"],
     "visible": ["ring_numbers_tests", "ring_comm_tests"], "visible_says": ["switched off"]},
    {"name": "whole tensors passed around the ring (right numbers, (N-1) x K bytes)",
     "replace": {"ring": RING_PASSES_WHOLE_TENSORS}, "loses": ["ring_comm_tests"],
     "visible": ["ring_comm_tests"], "visible_says": ["about 1/N of the tensor"]},
    {"name": "ring in the other direction (right numbers, wrong neighbours)",
     "replace": {"ring": RING_THE_OTHER_WAY_ROUND}, "loses": ["ring_comm_tests"],
     "visible": ["ring_comm_tests"], "visible_says": ["sends only to its right neighbour"]},
    {"name": "reduce-scatter overwrites instead of adding (right messages, wrong sum)",
     "replace": RING_OVERWRITES_INSTEAD_OF_ADDING, "loses": ["ring_numbers_tests"],
     "visible": ["ring_numbers_tests"]},
    {"name": "all-gather phase forgotten",
     "replace": RING_WITHOUT_ALL_GATHER, "loses": ["ring_numbers_tests", "ring_comm_tests"],
     "visible": ["ring_numbers_tests", "ring_comm_tests"]},
    {"name": "blocking send then recv on every rank (deadlock, ended by the timeout)",
     "replace": {"ring": RING_WITH_BLOCKING_SENDS},
     "loses": ["ring_numbers_tests", "ring_comm_tests"],
     "visible": ["ring_numbers_tests", "ring_comm_tests"],
     "visible_says": ["pass each chunk with the notebook's exchange"]},
    {"name": "elements counted instead of bytes",
     "replace": COUNTS_ELEMENTS_NOT_BYTES, "loses": ["estimate_tests"],
     "visible": ["estimate_tests"], "visible_says": ["elements, not bytes"]},
    {"name": "tensor allocated to measure its size",
     "replace": ALLOCATES_THE_TENSOR, "loses": ["estimate_tests"],
     "visible": ["estimate_tests"], "visible_says": ["the tensor was created to measure it"]},
    {"name": "nbytes hands over to dl.cost.tensor_bytes (switched off while graded)",
     "replace": NBYTES_FROM_THE_LIBRARY, "loses": ["estimate_tests"],
     "visible": ["estimate_tests"], "visible_says": ["switched off"]},
    {"name": "MB (10**6) instead of MiB (2**20)",
     "replace": MEGABYTES_NOT_MEBIBYTES, "loses": ["estimate_tests"],
     "visible": ["estimate_tests"], "visible_says": ["MB (10**6 bytes) instead of MiB"]},
    {"name": "ring traffic estimated as (N-1) whole tensors",
     "replace": RING_BYTES_AS_IF_WHOLE_TENSORS, "loses": ["estimate_tests"],
     "visible": ["estimate_tests"], "visible_says": ["not whole tensors"]},
    {"name": "prediction: the reduce-scatter leaves the whole sum",
     "replace": {"predict_rs": "predicted_rank1 = [60, 64, 68, 72]"},
     "loses": ["predict_rs_tests"]},
    {"name": "recall 1: reduce is the same as all_reduce",
     "replace": {"recall_1": 'answer_1 = "a"'}, "loses": ["recall_1_tests"]},
    {"name": "recall 2: the ring's time stays flat (bandwidth term only)",
     "replace": {"recall_2": 'answer_2 = "c"'}, "loses": ["recall_2_tests"]},
    {"name": "recall 3: gradients grow with the batch",
     "replace": {"recall_3": "grad_factor = 2\nactivation_factor = 2"},
     "loses": ["recall_3_tests"]},
    {"name": "recall 4: blocking sends are buffered on gloo",
     "replace": {"recall_4": 'answer_4 = "a"'}, "loses": ["recall_4_tests"]},
    {"name": "recall 5: the ring's time without its latencies",
     "replace": {"recall_5": "ring_ms = 2 * (1024 - 1) / 1024 * 64 * 2**20 / 1e11 * 1e3"},
     "loses": ["recall_5_tests"]},
]
