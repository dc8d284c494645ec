"""Mixture of experts, and expert parallelism over an ep group (all-to-all dispatch and combine).

    moe = MoE(d_model=16, d_ff=32, n_experts=4, top_k=2)          # every expert, one process
    out, aux = moe(x)                                            # x: (..., d_model)
    ep = MoE.from_dense(moe, ep_group)                           # this rank's experts only
    out, aux = ep(x_mine)                                        # = moe(x_mine), fewer weights

A router (one linear layer) scores every token against every expert; each token goes to its
top_k experts, and the output is the experts' outputs weighted by the router's probabilities
(the gates). Each expert takes at most `capacity = ceil(capacity_factor * tokens * top_k /
n_experts)` tokens per call, so the work per expert is fixed and the buffers have one shape;
assignments beyond it are dropped (their contribution is zero: the token passes through the
layer's residual connection). Priority goes to first choices, then to second choices, each in
token order (GShard). The gates are the router's probabilities (Switch's form); GShard and
Mixtral renormalise the top-k gates to sum to 1. Fixed capacity is a choice: dropless MoE
(MegaBlocks, DeepSeek-V3) sends each expert exactly its tokens, with variable all-to-all split
sizes.

Expert parallel: the ep group's ranks each hold n_experts / ep experts and their own tokens.
Every rank routes its tokens and packs them into an (n_experts, capacity, d_model) buffer, as
on one process; one all_to_all sends rank j the rows of j's experts (dispatch), the local
experts run on the tokens of every rank, and a second all_to_all sends the results back
(combine). Backward runs the same two all-to-alls in reverse. The router is replicated: its
gradient, like the non-expert weights', is averaged by data parallelism over all dp ranks. An
expert's weights live on one rank per ep group, so its gradient is reduced over the
expert-data-parallel group only: the ranks with the same ep rank in the different ep groups.

The load-balancing loss (Switch Transformer): n_experts * sum_i f_i P_i, with f_i the share of
token assignments routed to expert i and P_i the mean router probability of expert i. It is 1
when routing is uniform and grows as tokens crowd onto a few experts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dpmp_lab._helpers import whole_number
from dpmp_lab._torch_helpers import member_group
from dpmp_lab.i18n.messages import N_, _


class Routing(NamedTuple):
    """Where each of the top_k x tokens assignments goes, choice-major (all first choices, then
    all second choices): token index, expert, gate, slot in the (experts x capacity) buffer,
    and whether it fits (kept) or is dropped."""

    token: torch.Tensor
    expert: torch.Tensor
    gate: torch.Tensor
    slot: torch.Tensor
    kept: torch.Tensor
    capacity: int


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * top_k / n_experts)."""
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def route(probs: torch.Tensor, top_k: int, capacity_factor: float) -> Routing:
    """Top-k routing with capacity, from router probabilities (tokens, n_experts)."""
    tokens, n_experts = probs.shape
    cap = capacity(tokens, n_experts, top_k, capacity_factor)
    gate, expert = probs.topk(top_k, dim=-1)                      # (tokens, top_k)
    expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)   # choice-major
    token = torch.arange(tokens, device=probs.device).repeat(top_k)
    # an assignment's place in its expert's queue: how many went to that expert before it
    place = F.one_hot(expert, n_experts).cumsum(dim=0).gather(1, expert.unsqueeze(1))[:, 0] - 1
    kept = place < cap
    return Routing(token, expert, gate, expert * cap + place, kept, cap)


def load_balancing_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """n_experts * sum_i f_i P_i (Switch): f_i from the assignments (before dropping), P_i the
    mean probability; only P carries a gradient."""
    n_experts = probs.shape[-1]
    f = torch.bincount(expert, minlength=n_experts).to(probs.dtype) / expert.numel()
    return n_experts * (f * probs.mean(dim=0)).sum()


def dispatch(x: torch.Tensor, r: Routing, n_experts: int) -> torch.Tensor:
    """Pack the kept assignments' tokens into an (n_experts, capacity, d) buffer (empty slots
    are zeros)."""
    buf = x.new_zeros(n_experts * r.capacity, x.shape[-1])
    buf = buf.index_copy(0, r.slot[r.kept], x[r.token[r.kept]])
    return buf.view(n_experts, r.capacity, x.shape[-1])


def combine(y: torch.Tensor, r: Routing, tokens: int) -> torch.Tensor:
    """Each token's output: the sum over its kept assignments of gate x expert output."""
    y = y.reshape(-1, y.shape[-1])
    picked = y[r.slot[r.kept]] * r.gate[r.kept].unsqueeze(-1)
    return y.new_zeros(tokens, y.shape[-1]).index_add(0, r.token[r.kept], picked)


class _AllToAll(torch.autograd.Function):
    """Forward: all_to_all_single over the ep group, dim 0 cut into equal parts (part j goes to
    rank j); backward: the same all-to-all on the gradient (it sends each part back home)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Part j of x's dim 0 goes to rank j of the group; part i of the result came from rank i."""
    return _AllToAll.apply(x, group)


class MoE(nn.Module):
    """A mixture-of-experts MLP layer: router, top-k routing with capacity, experts
    (d_model -> d_ff -> d_model, GELU). With ep_group, this rank holds only its
    n_experts / ep experts (expert e lives on rank e // (n_experts / ep)).

    forward(x) returns (output with x's shape, load-balancing loss); `last_dropped` holds the
    number of assignments dropped by the last call (on this rank's tokens)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 1,
                 capacity_factor: float = 1.25, ep_group: dist.ProcessGroup | None = None, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts),
                            ("top_k", top_k)):
            whole_number(name, value)
        if top_k > n_experts:
            raise ValueError(_("top_k={top_k} is more than the {n} experts").format(
                top_k=top_k, n=n_experts))
        if not capacity_factor > 0:
            raise ValueError(_("capacity_factor must be > 0, not {value}").format(
                value=capacity_factor))
        self.ep = 1
        if ep_group is not None:
            member_group(ep_group, "ep", N_("expert-parallel"), "dl.ProcessGrid(ep=...).ep_group")
            self.ep = dist.get_world_size(ep_group)
            if n_experts % self.ep:
                raise ValueError(_("{n} experts do not split evenly over ep = {ep} ranks: "
                                   "choose a number of experts divisible by ep").format(
                    n=n_experts, ep=self.ep))
        self.d_model, self.d_ff, self.n_experts, self.top_k = d_model, d_ff, n_experts, top_k
        self.capacity_factor, self.ep_group = capacity_factor, ep_group
        self.n_local = n_experts // self.ep
        kw = {"device": device, "dtype": dtype}
        self.router = nn.Linear(d_model, n_experts, bias=False, **kw)
        self.w1 = nn.Parameter(torch.empty(self.n_local, d_model, d_ff, **kw))
        self.w2 = nn.Parameter(torch.empty(self.n_local, d_ff, d_model, **kw))
        self.last_dropped = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Experts drawn like nn.Linear's weights (uniform, bound 1 / sqrt(fan_in))."""
        nn.init.uniform_(self.w1, -1 / math.sqrt(self.d_model), 1 / math.sqrt(self.d_model))
        nn.init.uniform_(self.w2, -1 / math.sqrt(self.d_ff), 1 / math.sqrt(self.d_ff))

    @property
    def first_expert(self) -> int:
        """Global index of this rank's first expert."""
        return 0 if self.ep_group is None else dist.get_rank(self.ep_group) * self.n_local

    @classmethod
    def from_dense(cls, dense: MoE, ep_group: dist.ProcessGroup) -> MoE:
        """This rank's experts of a one-process MoE (and a copy of its router)."""
        if not isinstance(dense, MoE) or dense.ep_group is not None:
            raise TypeError(_("MoE.from_dense takes a MoE holding every expert (no ep_group)"))
        layer = cls(dense.d_model, dense.d_ff, dense.n_experts, dense.top_k,
                    dense.capacity_factor, ep_group, device=dense.w1.device,
                    dtype=dense.w1.dtype)
        mine = slice(layer.first_expert, layer.first_expert + layer.n_local)
        with torch.no_grad():
            layer.router.weight.copy_(dense.router.weight)
            layer.w1.copy_(dense.w1[mine])
            layer.w2.copy_(dense.w2[mine])
        return layer

    def experts(self, h: torch.Tensor) -> torch.Tensor:
        """The local experts on their rows: (n_local, tokens, d_model) -> same shape."""
        return torch.bmm(F.gelu(torch.bmm(h, self.w1)), self.w2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[-1] != self.d_model:
            raise ValueError(_("x's last dim must be d_model = {d_model}, got shape "
                               "{shape}").format(d_model=self.d_model, shape=tuple(x.shape)))
        flat = x.reshape(-1, self.d_model)
        probs = torch.softmax(self.router(flat), dim=-1)
        r = route(probs, self.top_k, self.capacity_factor)
        self.last_dropped = int((~r.kept).sum())
        buf = dispatch(flat, r, self.n_experts)                    # (E, C, d)
        if self.ep_group is None:
            y = self.experts(buf)
        else:
            y = self._expert_parallel(buf)
        out = combine(y, r, flat.shape[0])
        return out.view(x.shape), load_balancing_loss(probs, r.expert)

    def _expert_parallel(self, buf: torch.Tensor) -> torch.Tensor:
        e, c, d = buf.shape
        n, local = self.ep, self.n_local
        got = all_to_all(buf, self.ep_group)                        # (n src, local, C, d)
        h = got.view(n, local, c, d).transpose(0, 1).reshape(local, n * c, d)
        y = self.experts(h).view(local, n, c, d).transpose(0, 1).reshape(e, c, d)
        return all_to_all(y, self.ep_group)                         # back to the tokens' ranks

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, n_experts={self.n_experts}, "
                f"top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"local experts {self.first_expert}..{self.first_expert + self.n_local - 1}")


__all__ = ["MoE", "Routing", "all_to_all", "capacity", "combine", "dispatch",
           "load_balancing_loss", "route"]
