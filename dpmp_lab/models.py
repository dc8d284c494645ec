"""Small deterministic models and synthetic data, for exercises, references and tests.

    model = dl.models.TinyGPT(dl.models.GPTConfig(), seed=0)
    idx, targets = dl.models.token_batch(batch_size=8, seq_len=16, vocab_size=64, seed=1)
    loss = dl.models.lm_loss(model(idx), targets)

Every model is built from a seed without touching the global RNG, so a reference in the
notebook kernel and the ranks build bitwise-identical weights. Sizes default to tiny: a
training step of TinyGPT on 4-8 CPU ranks takes milliseconds.

TinyGPT is written as a sequence of pieces, embed -> blocks -> head, because pipeline
parallelism cuts it between pieces (`model.pieces()`), and its attention uses separate q, k,
v and output projections so tensor parallelism can split them by heads without reshuffling.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpmp_lab.i18n.messages import _


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with torch's RNG seeded, restoring the caller's RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        if torch.cuda.is_available():
            torch.manual_seed(seed)
        else:   # the CPU's generator is all there is; torch.manual_seed would also queue a
            # seed for each device this build knows, formatting the stack for each (7 % of a
            # graded rank's own work in 04)
            torch.default_generator.manual_seed(seed)
        yield


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Build and run a block in `dtype` (e.g. torch.float64 to compare against a reference
    without float32 rounding), restoring the previous default afterwards. None: unchanged."""
    before = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# -- MLP --------------------------------------------------------------------------------------


class TinyMLP(nn.Module):
    """Linear -> GELU -> ... -> Linear; `layers` is an nn.Sequential, ready to be cut."""

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 8, n_hidden: int = 2,
                 seed: int = 0):
        super().__init__()
        with seeded(seed):
            dims = [d_in] + [d_hidden] * n_hidden + [d_out]
            layers: list[nn.Module] = []
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
                layers.append(nn.Linear(a, b))
                if i < len(dims) - 2:
                    layers.append(nn.GELU())
            self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def regression_batch(batch_size: int = 64, d_in: int = 16, d_out: int = 8,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) with y a fixed linear function of x plus a little noise: something to fit."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.Generator().manual_seed(12345)
    w = torch.randn(d_in, d_out, generator=teacher) / math.sqrt(d_in)
    x = torch.randn(batch_size, d_in, generator=g)
    y = x @ w + 0.01 * torch.randn(batch_size, d_out, generator=g)
    return x, y


# -- TinyGPT ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(_("d_model={d_model} is not divisible by n_heads={n_heads}").format(
                d_model=self.d_model, n_heads=self.n_heads))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q, k, v and output projections."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(attend(self.q(x), self.k(x), self.v(x), self.head_dim))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Causal attention over heads packed in the last dim: (B, T, H*hd) -> (B, T, H*hd).

    Shared by the dense model and the tensor-parallel one (which packs only its own heads).
    """
    b, t, width = q.shape
    heads = width // head_dim

    def split(z: torch.Tensor) -> torch.Tensor:
        return z.view(b, t, heads, head_dim).transpose(1, 2)

    scores = split(q) @ split(k).transpose(-2, -1) / math.sqrt(head_dim)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1) @ split(v)
    return out.transpose(1, 2).reshape(b, t, width)


class MLP(nn.Module):
    """fc1 -> GELU -> fc2: the block Megatron splits column-then-row."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config.d_model, config.n_heads)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    """Token plus learned position embedding: (B, T) token ids -> (B, T, d_model)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Head(nn.Module):
    """Final layer norm and the projection to vocabulary logits (not tied to the embedding,
    so the first and last pipeline stages share no parameter)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.d_model)
        self.proj = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


class TinyGPT(nn.Module):
    """A GPT small enough for CPU ranks: embed -> n_layers blocks -> head."""

    def __init__(self, config: GPTConfig | None = None, seed: int = 0):
        super().__init__()
        self.config = config or GPTConfig()
        with seeded(seed):
            self.embed = Embed(self.config)
            self.blocks = nn.ModuleList(Block(self.config) for _ in range(self.config.n_layers))
            self.head = Head(self.config)

    def pieces(self) -> list[nn.Module]:
        """[embed, block 0, ..., block n-1, head]: the places a pipeline may cut."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def token_batch(batch_size: int = 8, seq_len: int = 16, vocab_size: int = 64,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, targets) from a learnable rule: each sequence counts up by its own step, modulo
    the vocabulary, and targets are the inputs shifted by one. Loss falls fast when it learns.
    """
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=g)
    step = torch.randint(1, 4, (batch_size, 1), generator=g)
    seq = (start + step * torch.arange(seq_len + 1)) % vocab_size
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# -- sharding data over data-parallel ranks ---------------------------------------------------


def shard_range(n: int, rank: int, world: int) -> range:
    """Indices [start, stop) of rank's contiguous share of n samples.

    Disjoint, together complete, and balanced: sizes differ by at most one (the first
    n % world ranks get one more), the same split as torch.tensor_split.
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(_("rank {rank} is not in a world of {world}").format(
            rank=rank, world=world))
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def shard_batch(batch: torch.Tensor, rank: int, world: int, *, even: bool = True) -> torch.Tensor:
    """Rank's contiguous share of a batch along dim 0 (batch 64, 4 ranks -> 16 rows each).

    even=True (the default) refuses a batch that does not divide evenly, because data
    parallel averages per-rank mean losses, which equals the full-batch mean only when every
    rank has the same number of samples.
    """
    n = batch.shape[0]
    if even and n % world:
        raise ValueError(_("a batch of {n} does not split evenly over {world} ranks: the mean "
                           "of per-rank means would not be the full-batch mean (use a batch "
                           "divisible by {world}, or even=False)").format(n=n, world=world))
    r = shard_range(n, rank, world)
    return batch[r.start:r.stop]


__all__ = ["MLP", "Block", "CausalSelfAttention", "Embed", "GPTConfig", "Head", "TinyGPT",
           "TinyMLP", "attend", "default_dtype", "lm_loss", "regression_batch", "seeded",
           "shard_batch", "shard_range", "token_batch"]
