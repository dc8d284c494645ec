"""Wrong answers to 03_tensor_parallel, and the graded cells each must lose (all others keep points).

Each wrong answer is the solution cell with one mistake edited in, so a variant differs from the
solution by exactly the lines shown here (and stops working if those lines change).
Dependencies between exercises are real: Exercise 3 builds on the learner's f and g, Exercise 4
on the layers of Exercise 3, so a mistake there also costs the later cells that use it.
"""

from tests.course_variants import solution_editor

_edit = solution_editor("03_tensor_parallel")


COLUMN = ["column_tests", "column_comm_tests"]
F_AND_G = ["f_and_g_tests", "f_and_g_comm_tests"]
MLP = ["mlp_tests", "mlp_comm_tests"]
ATTENTION = ["attention_tests", "attention_comm_tests"]
SEQUENCE = ["sequence_parallel_tests", "sequence_parallel_comm_tests"]

VARIANTS = [
    # -- Exercise 1: the column split by hand --
    {"name": "all_reduce where the forward's all_gather belongs",
     "replace": _edit("column", (
         "    blocks = [torch.empty_like(Y_i) for _ in range(dist.get_world_size(group))]\n"
         "    dist.all_gather(blocks, Y_i, group=group)\n"
         "    return torch.cat(blocks, dim=1)",
         "    dist.all_reduce(Y_i, group=group)\n"
         "    return Y_i")),
     "loses": COLUMN},
    {"name": "dX not all-reduced: each rank keeps only its own term",
     "replace": _edit("column", (
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM, group=group)\n", "")),
     "loses": COLUMN},
    {"name": "dX averaged over the ranks, as data parallelism averages gradients",
     "replace": _edit("column", (
         "    return dW_i, dX\n",
         "    return dW_i, dX / dist.get_world_size(group)\n")),
     "loses": ["column_tests"]},
    {"name": "global rank instead of the rank in the group (only a 2 x 2 grid shows it)",
     "replace": _edit("column",
                      ("tp, i = dist.get_world_size(group), dist.get_rank(group)",
                       "tp, i = dist.get_world_size(group), dist.get_rank()"),
                      ("i, width = dist.get_rank(group), W_i.shape[1]",
                       "i, width = dist.get_rank(), W_i.shape[1]")),
     "loses": ["column_tests"]},
    {"name": "right numbers, dX summed through an all_gather of every term",
     "replace": _edit("column", (
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM, group=group)\n"
         "    return dW_i, dX",
         "    terms = [torch.empty_like(dX) for _ in range(dist.get_world_size(group))]\n"
         "    dist.all_gather(terms, dX, group=group)\n"
         "    return dW_i, sum(terms)")),
     "loses": ["column_comm_tests"]},
    # -- Exercise 2: f and g --
    {"name": "f and g swapped: f all-reduces in forward, g in backward",
     "replace": _edit("f_and_g",
                      ("        ctx.group = group\n        return x",
                       "        out = x.clone()\n"
                       "        dist.all_reduce(out, group=group)\n"
                       "        return out"),
                      ("        return grad, None",
                       "        out = grad.clone()\n"
                       "        dist.all_reduce(out, group=ctx.group)\n"
                       "        return out, None"),
                      ("        total = grad.clone()\n"
                       "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n"
                       "        return total, None",
                       "        return grad, None"),
                      ("        total = x.clone()\n"
                       "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)\n"
                       "        return total",
                       "        ctx.group = group\n        return x")),
     # same counts per phase in the MLP and attention (an all-reduce moved from g to f forward,
     # another from f to g backward): only the numbers show it there
     "loses": F_AND_G + ["mlp_tests", "attention_tests"]},
    {"name": "g all-reduces the gradient again in backward (counted tp times)",
     "replace": _edit("f_and_g",
                      ("        total = x.clone()\n",
                       "        ctx.group = group\n        total = x.clone()\n"),
                      ("        return grad, None",
                       "        total = grad.clone()\n"
                       "        dist.all_reduce(total, group=ctx.group)\n"
                       "        return total, None")),
     "loses": F_AND_G + MLP + ATTENTION},
    # -- Exercise 3: column then row --
    {"name": "row layer adds its bias before the reduction",
     "replace": _edit("mlp", (
         "reduce_from_tp_region(F.linear(x, self.weight), self.group) + self.bias",
         "reduce_from_tp_region(F.linear(x, self.weight, self.bias), self.group)")),
     "loses": ["mlp_tests", "attention_tests"]},
    {"name": "column layer keeps columns of nn.Linear.weight (the wrong dim)",
     "replace": _edit("mlp", (
         "self.weight = nn.Parameter(dense.weight.detach()[mine].clone())",
         "self.weight = nn.Parameter(dense.weight.detach()[:, mine].clone())")),
     "loses": MLP + ATTENTION},
    {"name": "row layer all-gathers its partial sums where an all-reduce belongs",
     "replace": _edit("mlp", (
         "        return reduce_from_tp_region(F.linear(x, self.weight), self.group) + self.bias",
         "        partial = F.linear(x, self.weight)\n"
         "        parts = [torch.empty_like(partial) for _ in range(dist.get_world_size("
         "self.group))]\n"
         "        dist.all_gather(parts, partial.detach(), group=self.group)\n"
         "        return torch.cat(parts, dim=-1) + self.bias.repeat(len(parts))")),
     "loses": MLP + ATTENTION},
    {"name": "layers built on the library's f and g (dl.tp) instead of the learner's own",
     "replace": _edit("mlp",
                      ("F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)",
                       "F.linear(dl.tp.copy_to_tp_region(x, self.group), self.weight, self.bias)"),
                      ("return reduce_from_tp_region(F.linear(x, self.weight), self.group)",
                       "return dl.tp.reduce_from_tp_region(F.linear(x, self.weight), self.group)")),
     # the graders switch dl.tp off inside the ranks; the comm cells only count
     "loses": ["mlp_tests", "attention_tests"]},
    # -- Exercise 4: attention --
    {"name": "one f per projection: three all-reduces in backward",
     "replace": _edit("attention", (
         "        x = copy_to_tp_region(x, self.group)      # one f for q, k and v\n"
         "        q, k, v = (F.linear(x, lin.weight, lin.bias) for lin in (self.q, self.k, "
         "self.v))",
         "        q, k, v = self.q(x), self.k(x), self.v(x)")),
     "loses": ["attention_comm_tests"]},
    {"name": "checks that d_model splits instead of the heads",
     "replace": _edit("attention", (
         "        if attn.n_heads % tp:\n", "        if attn.q.out_features % tp:\n")),
     "loses": ["attention_tests"]},
    # -- Exercise 5: sequence parallelism --
    {"name": "right numbers, all-reduce then keep my part instead of a reduce-scatter",
     "replace": _edit("sequence_parallel", (
         "        out = x.new_empty((x.shape[0] // tp, *x.shape[1:]))\n"
         "        dist.reduce_scatter_single(out, x.contiguous(), group=group)\n"
         "        return out",
         "        total = x.clone()\n"
         "        dist.all_reduce(total, group=group)\n"
         "        return total.chunk(tp, dim=0)[dist.get_rank(group)].contiguous()")),
     "loses": ["sequence_parallel_comm_tests"]},
    {"name": "all-gather's backward keeps its part of the gradient without summing",
     "replace": _edit("sequence_parallel", (
         "        out = grad.new_empty((grad.shape[0] // tp, *grad.shape[1:]))\n"
         "        dist.reduce_scatter_single(out, grad.contiguous(), group=ctx.group)\n"
         "        return out, None",
         "        return grad.chunk(tp, dim=0)[dist.get_rank(ctx.group)].contiguous(), None")),
     "loses": SEQUENCE},
    {"name": "sequence-parallel bias added before the reduce-scatter",
     "replace": _edit("sequence_parallel", (
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2), self.group) + self.b2",
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2, self.b2), self.group)")),
     "loses": ["sequence_parallel_tests"]},
    # -- recall --
    {"name": "every recall answer wrong",
     "replace": {"recall": (
         'q_param_sync = True\nq_f_backward = "all_gather"\nq_mlp_all_reduces = 4\n'
         'q_what_tp_sends = "a"\nq_sp_bytes = "c"\nq_activation_mib = 4\n')},
     "loses": ["recall_param_sync", "recall_f_backward", "recall_mlp_all_reduces",
               "recall_what_tp_sends", "recall_sp_bytes", "recall_activation_mib"]},
]
