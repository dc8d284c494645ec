"""Wrong answers to 01_collectives, and the graded cells each must lose (all others keep points)."""

# -- exercise 1: all_reduce = reduce_scatter + all_gather ----------------------------------------

HALVES_WITH_ALL_REDUCE = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    out = x.detach().clone()
    dist.all_reduce(out)
    return out
'''

HALVES_WITHOUT_PADDING = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    flat = x.detach().flatten().clone()
    mine = flat.new_empty(flat.numel() // n)
    dist.reduce_scatter_single(mine, flat)
    full = flat.new_empty(flat.numel())
    dist.all_gather_single(full, mine)
    return full.view(x.shape)
'''

HALVES_KEEPS_THE_PADDING = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    flat = x.detach().flatten()
    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    mine = flat.new_empty(flat.numel() // n)
    dist.reduce_scatter_single(mine, flat)
    full = flat.new_empty(flat.numel())
    dist.all_gather_single(full, mine)
    return full if full.numel() != x.numel() else full.view(x.shape)
'''

HALVES_AVERAGE_INSTEAD_OF_SUM = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    flat = x.detach().flatten()
    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    mine = flat.new_empty(flat.numel() // n)
    dist.reduce_scatter_single(mine, flat)
    mine /= n
    full = flat.new_empty(flat.numel())
    dist.all_gather_single(full, mine)
    return full[:x.numel()].view(x.shape)
'''

HALVES_CHANGES_ITS_INPUT = '''
def all_reduce_by_halves(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    flat = torch.cat([x.detach().flatten(), x.new_zeros((-x.numel()) % n)])
    mine = flat.new_empty(flat.numel() // n)
    dist.reduce_scatter_single(mine, flat)
    full = flat.new_empty(flat.numel())
    dist.all_gather_single(full, mine)
    x.zero_()
    return full[:x.numel()].view(x.shape)
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

RING_THE_OTHER_WAY_ROUND = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me + step) % n, (me + step + 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, left, right)
        chunks[recv_i] += incoming
    for step in range(n - 1):
        send_i, recv_i = (me - 1 + step) % n, (me + step) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, left, right)
        chunks[recv_i] = incoming
''' + _RING_TAIL

RING_OVERWRITES_INSTEAD_OF_ADDING = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me - step) % n, (me - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, right, left)
        chunks[recv_i] = incoming
    for step in range(n - 1):
        send_i, recv_i = (me + 1 - step) % n, (me - step) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, right, left)
        chunks[recv_i] = incoming
''' + _RING_TAIL

RING_WITHOUT_ALL_GATHER = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me - step) % n, (me - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], incoming, right, left)
        chunks[recv_i] += incoming
''' + _RING_TAIL

RING_WITH_BLOCKING_SENDS = _RING_HEAD + '''
    for step in range(n - 1):
        send_i, recv_i = (me - step) % n, (me - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], dst=right)
        dist.recv(incoming, src=left)
        chunks[recv_i] += incoming
    for step in range(n - 1):
        send_i, recv_i = (me + 1 - step) % n, (me - step) % n
        incoming = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], dst=right)
        dist.recv(incoming, src=left)
        chunks[recv_i] = incoming
''' + _RING_TAIL

# -- exercise 3: sizes ----------------------------------------------------------------------------

_ESTIMATES = '''

gradient_mib = nbytes((1024, 1024)) / 2**20
activation_mib = nbytes((8, 128, 4096)) / 2**20
ring_mib_per_rank = 2 * (8 - 1) / 8 * gradient_mib
'''

COUNTS_ELEMENTS_NOT_BYTES = '''
def nbytes(shape: tuple, dtype: torch.dtype = torch.float32) -> int:
    return math.prod(shape)
''' + _ESTIMATES

ALLOCATES_THE_TENSOR = '''
def nbytes(shape: tuple, dtype: torch.dtype = torch.float32) -> int:
    return torch.empty(shape, dtype=dtype).nbytes
''' + _ESTIMATES

MEGABYTES_NOT_MEBIBYTES = '''
def nbytes(shape: tuple, dtype: torch.dtype = torch.float32) -> int:
    return math.prod(shape) * dtype.itemsize


gradient_mib = nbytes((1024, 1024)) / 10**6
activation_mib = nbytes((8, 128, 4096)) / 10**6
ring_mib_per_rank = 2 * (8 - 1) / 8 * gradient_mib
'''

RING_BYTES_AS_IF_WHOLE_TENSORS = '''
def nbytes(shape: tuple, dtype: torch.dtype = torch.float32) -> int:
    return math.prod(shape) * dtype.itemsize


gradient_mib = nbytes((1024, 1024)) / 2**20
activation_mib = nbytes((8, 128, 4096)) / 2**20
ring_mib_per_rank = (8 - 1) * gradient_mib
'''

VARIANTS = [
    {"name": "dist.all_reduce instead of reduce_scatter + all_gather",
     "replace": {"halves": HALVES_WITH_ALL_REDUCE}, "loses": ["halves_tests"]},
    {"name": "no padding: fails when the ranks do not divide the length",
     "replace": {"halves": HALVES_WITHOUT_PADDING}, "loses": ["halves_tests"]},
    {"name": "padding not cut off",
     "replace": {"halves": HALVES_KEEPS_THE_PADDING}, "loses": ["halves_tests"]},
    {"name": "average instead of sum",
     "replace": {"halves": HALVES_AVERAGE_INSTEAD_OF_SUM}, "loses": ["halves_tests"]},
    {"name": "the caller's tensor is overwritten",
     "replace": {"halves": HALVES_CHANGES_ITS_INPUT}, "loses": ["halves_tests"]},
    {"name": "ring that calls dist.all_reduce (right numbers, wrong communication)",
     "replace": {"ring": RING_CALLS_ALL_REDUCE}, "loses": ["ring_comm_tests"]},
    {"name": "whole tensors passed around the ring (right numbers, (N-1) x K bytes)",
     "replace": {"ring": RING_PASSES_WHOLE_TENSORS}, "loses": ["ring_comm_tests"]},
    {"name": "ring in the other direction (right numbers, wrong neighbours)",
     "replace": {"ring": RING_THE_OTHER_WAY_ROUND}, "loses": ["ring_comm_tests"]},
    {"name": "reduce-scatter overwrites instead of adding (right messages, wrong sum)",
     "replace": {"ring": RING_OVERWRITES_INSTEAD_OF_ADDING}, "loses": ["ring_numbers_tests"]},
    {"name": "all-gather phase forgotten",
     "replace": {"ring": RING_WITHOUT_ALL_GATHER},
     "loses": ["ring_numbers_tests", "ring_comm_tests"]},
    {"name": "blocking send then recv on every rank (deadlock, ended by the timeout)",
     "replace": {"ring": RING_WITH_BLOCKING_SENDS},
     "loses": ["ring_numbers_tests", "ring_comm_tests"]},
    {"name": "elements counted instead of bytes",
     "replace": {"estimate": COUNTS_ELEMENTS_NOT_BYTES}, "loses": ["estimate_tests"]},
    {"name": "tensor allocated to measure its size",
     "replace": {"estimate": ALLOCATES_THE_TENSOR}, "loses": ["estimate_tests"]},
    {"name": "MB (10**6) instead of MiB (2**20)",
     "replace": {"estimate": MEGABYTES_NOT_MEBIBYTES}, "loses": ["estimate_tests"]},
    {"name": "ring traffic estimated as (N-1) whole tensors",
     "replace": {"estimate": RING_BYTES_AS_IF_WHOLE_TENSORS}, "loses": ["estimate_tests"]},
    {"name": "recall 1: all_reduce returns a new tensor",
     "replace": {"recall_1": 'answer_1 = "c"'}, "loses": ["recall_1_tests"]},
    {"name": "recall 2: gloo compresses",
     "replace": {"recall_2": 'answer_2 = "a"'}, "loses": ["recall_2_tests"]},
    {"name": "recall 3: gradients grow with the batch",
     "replace": {"recall_3": "grad_factor = 2\nactivation_factor = 2"},
     "loses": ["recall_3_tests"]},
    {"name": "recall 4: blocking sends are buffered",
     "replace": {"recall_4": 'answer_4 = "a"'}, "loses": ["recall_4_tests"]},
]
