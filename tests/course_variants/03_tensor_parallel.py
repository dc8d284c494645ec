"""Wrong answers to 03_tensor_parallel, and the graded cells each must lose (all others keep points).

Each wrong answer is the solution cell with one mistake edited in, so a variant differs from the
solution by exactly the lines shown here (and stops working if those lines change).
Exercises 3 and 4 build on earlier pieces, but their tests run with the library's versions of
those pieces (dl.tp's f and g, and its column/row layers for the attention), so a mistake costs
only the cells of the exercise where it is made: the variants of f and g, and of the layers,
prove it by losing nothing else. `visible` names the test cells a learner sees fail before
hand-in (hidden tests stripped), `visible_says` words of the hint they show.
"""

import json
import re

from tests.course_variants import SOLUTIONS, solution_editor

_edit = solution_editor("03_tensor_parallel")


def _blank(grade_id: str) -> dict[str, str]:
    """The solution cell `grade_id` as the release hands it out: every solution block raises."""
    path = SOLUTIONS / "03_tensor_parallel" / "03_tensor_parallel.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    [src] = ["".join(c["source"]) for c in cells
             if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    return {grade_id: re.sub(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION",
                             r"\1raise NotImplementedError()", src, flags=re.S)}


COLUMN = ["column_tests", "column_comm_tests"]
F_AND_G = ["f_and_g_tests", "f_and_g_comm_tests"]
MLP = ["mlp_tests", "mlp_comm_tests"]
ATTENTION = ["attention_tests", "attention_comm_tests"]
SEQUENCE = ["sequence_parallel_tests", "sequence_parallel_comm_tests"]
RECALL = {"answer_param_sync": 'q_param_sync = "c"', "answer_f_backward": 'q_f_backward = "a"',
          "answer_group_rank": 'q_group_rank = "d"', "answer_what_tp_sends": 'q_what_tp_sends = "b"',
          "answer_sp_bytes": 'q_sp_norm_grad = "c"', "answer_ring_mib": "q_ring_mib = 224",
          "answer_predict_params": "predict_rank_params = 144"}


def _recall(grade_id: str, answer: str) -> dict[str, str]:
    """The recall answer cell `grade_id` with `answer` in place of the right one."""
    return _edit(grade_id, ("SOLUTION\n" + RECALL[grade_id], "SOLUTION\n" + answer))


VARIANTS = [
    # -- Exercise 1: the column split by hand --
    {"name": "all_reduce where the forward's all_gather belongs",
     "replace": _edit("column", (
         "    blocks = [torch.empty_like(Y_i) for _ in range(dist.get_world_size(group))]\n"
         "    dist.all_gather(blocks, Y_i, group=group)\n"
         "    return torch.cat(blocks, dim=1)",
         "    dist.all_reduce(Y_i, group=group)\n"
         "    return Y_i")),
     "loses": COLUMN, "visible": COLUMN},
    {"name": "dX not all-reduced: each rank keeps only its own term",
     "replace": _edit("column", (
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM, group=group)\n", "")),
     "loses": COLUMN, "visible": COLUMN, "visible_says": ["this rank's own term"]},
    {"name": "dX averaged over the ranks, as data parallelism averages gradients",
     "replace": _edit("column", (
         "    return dW_i, dX\n",
         "    return dW_i, dX / dist.get_world_size(group)\n")),
     "loses": ["column_tests"], "visible": ["column_tests"],
     "visible_says": ["dX was divided by the group size"]},
    {"name": "global rank instead of the rank in the group (only a dp x tp grid shows it)",
     "replace": _edit("column",
                      ("tp, i = dist.get_world_size(group), dist.get_rank(group)",
                       "tp, i = dist.get_world_size(group), dist.get_rank()"),
                      ("i, width = dist.get_rank(group), W_i.shape[1]",
                       "i, width = dist.get_rank(), W_i.shape[1]")),
     # ranks 2 and 3 take an empty block: wrong numbers, and nothing in their all_gather
     "loses": COLUMN, "visible": COLUMN,
     "visible_says": ["dist.get_rank(group), the rank inside the group"]},
    {"name": "global rank modulo tp instead of the rank in the group (strided groups show it)",
     "replace": _edit("column",
                      ("tp, i = dist.get_world_size(group), dist.get_rank(group)",
                       "tp = dist.get_world_size(group)\n    i = dist.get_rank() % tp"),
                      ("i, width = dist.get_rank(group), W_i.shape[1]",
                       "i, width = dist.get_rank() % dist.get_world_size(group), W_i.shape[1]")),
     "loses": ["column_tests"], "visible": ["column_tests"], "visible_says": ["tp.group_rank"]},
    {"name": "W.chunk(tp, 1)[dist.get_rank()]: out of range on ranks 2 and 3",
     "replace": _edit("column", (
         "    width = W.shape[1] // tp\n"
         "    return W[:, i * width:(i + 1) * width].contiguous()",
         "    return W.chunk(tp, 1)[dist.get_rank()].contiguous()")),
     "loses": COLUMN, "visible": COLUMN, "visible_says": ["tp.group_rank"]},
    {"name": "column_shard sized for a group of 2 (hard-coded tp = 2; the tp = 4 check shows it)",
     "replace": _edit("column", ("    width = W.shape[1] // tp\n", "    width = W.shape[1] // 2\n")),
     "loses": COLUMN, "visible": ["column_tests"], "visible_says": ["tp.group_size"]},
    {"name": "dX summed over all ranks: the all_reduce without group=",
     "replace": _edit("column", (
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM, group=group)\n",
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM)\n")),
     "loses": COLUMN, "visible": COLUMN, "visible_says": ["not over the tp group"]},
    {"name": "right numbers, dX summed through an all_gather of every term",
     "replace": _edit("column", (
         "    dist.all_reduce(dX, op=dist.ReduceOp.SUM, group=group)\n"
         "    return dW_i, dX",
         "    terms = [torch.empty_like(dX) for _ in range(dist.get_world_size(group))]\n"
         "    dist.all_gather(terms, dX, group=group)\n"
         "    return dW_i, sum(terms)")),
     "loses": ["column_comm_tests"], "visible": ["column_comm_tests"]},
    {"name": "the library's shard instead of the learner's own (dl.tp is off while graded)",
     "replace": _edit("column", (
         "    tp, i = dist.get_world_size(group), dist.get_rank(group)\n"
         "    width = W.shape[1] // tp\n"
         "    return W[:, i * width:(i + 1) * width].contiguous()",
         "    return dl.tp.shard_tensor(W, group, dim=1)")),
     "loses": COLUMN, "visible": COLUMN, "visible_says": ["switched off"]},
    # -- Exercise 2: f and g. The MLP and the attention are tested with dl.tp's f and g, so
    # these lose Exercise 2's cells only (they used to cost Exercises 3 and 4 as well) --
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
     "loses": F_AND_G, "visible": F_AND_G, "visible_says": ["f and g swapped?"]},
    {"name": "g all-reduces the gradient again in backward (counted tp times)",
     "replace": _edit("f_and_g",
                      ("        total = x.clone()\n",
                       "        ctx.group = group\n        total = x.clone()\n"),
                      ("        return grad, None",
                       "        total = grad.clone()\n"
                       "        dist.all_reduce(total, group=ctx.group)\n"
                       "        return total, None")),
     "loses": F_AND_G, "visible": F_AND_G, "visible_says": ["g's backward all-reduced"]},
    {"name": "f's backward all-reduce without group=: summed over every rank",
     "replace": _edit("f_and_g", (
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n",
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM)\n")),
     "loses": F_AND_G, "visible": F_AND_G, "visible_says": ["not over the tp group"]},
    {"name": "g's forward all-reduces its input in place (the caller's tensor is overwritten)",
     "replace": _edit("f_and_g", (
         "        total = x.clone()\n"
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)\n"
         "        return total",
         "        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)\n"
         "        return x")),
     "loses": ["f_and_g_tests"], "visible": ["f_and_g_tests"],
     "visible_says": ["summed into its input in place"]},
    {"name": "f's backward all-reduces the incoming gradient in place (an expanded view)",
     "replace": _edit("f_and_g", (
         "        total = grad.clone()\n"
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n"
         "        return total, None",
         "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n"
         "        return grad, None")),
     "loses": ["f_and_g_comm_tests"], "visible": ["f_and_g_comm_tests"],
     "visible_says": ["whose elements share memory"]},
    {"name": "f's backward averages the group's gradients instead of summing them",
     "replace": _edit("f_and_g", (
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n"
         "        return total, None",
         "        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n"
         "        return total / dist.get_world_size(ctx.group), None")),
     "loses": ["f_and_g_tests"], "visible": ["f_and_g_tests"],
     "visible_says": ["tp.f_backward_mean"]},
    {"name": "g's backward hands each rank 1/tp of the gradient",
     "replace": _edit("f_and_g", (
         "        return grad, None\n        ### END SOLUTION\n\n\ndef copy_to_tp_region",
         "        return grad / dist.get_world_size(ctx.group), None\n"
         "        ### END SOLUTION\n\n\ndef copy_to_tp_region"),
         ("        total = x.clone()\n", "        ctx.group = group\n        total = x.clone()\n")),
     "loses": ["f_and_g_tests"], "visible": ["f_and_g_tests"],
     "visible_says": ["tp.g_backward_split"]},
    {"name": "right answer another way: f returns a view, copies made another way",
     "replace": _edit("f_and_g",
                      ("        ctx.group = group\n        return x",
                       "        ctx.group = group\n        return x.view_as(x)"),
                      ("        total = grad.clone()\n",
                       "        total = torch.empty_like(grad, memory_format=torch.contiguous_format)"
                       "\n        total.copy_(grad)\n"),
                      ("        total = x.clone()\n", "        total = x.detach().contiguous().clone()\n")),
     "loses": []},
    # -- Exercise 3: column then row --
    {"name": "no f in front of the column layer: x's gradient is this rank's own term",
     "replace": _edit("mlp", ("F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)",
                              "F.linear(x, self.weight, self.bias)")),
     "loses": MLP, "visible": MLP, "visible_says": ["tp.missing_f"]},
    {"name": "row layer stores b / tp and adds it before g: right outputs, wrong parameter",
     "replace": _edit("mlp",
                      ("self.bias = nn.Parameter(dense.bias.detach().clone())",
                       "self.bias = nn.Parameter(dense.bias.detach().clone() / tp)"),
                      ("reduce_from_tp_region(F.linear(x, self.weight), self.group) + self.bias",
                       "reduce_from_tp_region(F.linear(x, self.weight, self.bias), self.group)")),
     "loses": ["mlp_tests"], "visible": ["mlp_tests"], "visible_says": ["tp.row_bias_split"]},
    {"name": "row layer adds its bias before the reduction",
     "replace": _edit("mlp", (
         "reduce_from_tp_region(F.linear(x, self.weight), self.group) + self.bias",
         "reduce_from_tp_region(F.linear(x, self.weight, self.bias), self.group)")),
     # the attention is tested with the library's row layer: only the MLP shows it
     "loses": ["mlp_tests"], "visible": ["mlp_tests"], "visible_says": ["added before g"]},
    {"name": "column layer keeps columns of nn.Linear.weight (the wrong dim)",
     "replace": _edit("mlp", (
         "self.weight = nn.Parameter(dense.weight.detach()[mine].clone())",
         "self.weight = nn.Parameter(dense.weight.detach()[:, mine].clone())")),
     "loses": MLP, "visible": MLP},
    {"name": "row layer all-gathers its partial sums where an all-reduce belongs",
     "replace": _edit("mlp", (
         "        return reduce_from_tp_region(F.linear(x, self.weight), self.group) + self.bias",
         "        partial = F.linear(x, self.weight)\n"
         "        parts = [torch.empty_like(partial) for _ in range(dist.get_world_size("
         "self.group))]\n"
         "        dist.all_gather(parts, partial.detach(), group=self.group)\n"
         "        return torch.cat(parts, dim=-1) + self.bias.repeat(len(parts))")),
     "loses": MLP, "visible": MLP},
    {"name": "both layers take their shard by the global rank",
     "replace": _edit("mlp",
                      ("        tp, i = dist.get_world_size(group), dist.get_rank(group)\n"
                       "        rows = ",
                       "        tp, i = dist.get_world_size(group), dist.get_rank()\n"
                       "        rows = "),
                      ("        tp, i = dist.get_world_size(group), dist.get_rank(group)\n"
                       "        cols = ",
                       "        tp, i = dist.get_world_size(group), dist.get_rank()\n"
                       "        cols = ")),
     "loses": ["mlp_tests"], "visible": ["mlp_tests"],
     "visible_says": ["dist.get_rank(group), the rank inside the group"]},
    {"name": "both layers sized for a group of 2 (hard-coded tp = 2; the tp = 4 check shows it)",
     "replace": _edit("mlp",
                      ("        tp, i = dist.get_world_size(group), dist.get_rank(group)\n"
                       "        rows = ",
                       "        tp, i = 2, dist.get_rank(group)\n"
                       "        rows = "),
                      ("        tp, i = dist.get_world_size(group), dist.get_rank(group)\n"
                       "        cols = ",
                       "        tp, i = 2, dist.get_rank(group)\n"
                       "        cols = ")),
     # the partial sums still add up to y at tp = 4 (ranks 2 and 3 hold empty shards), and the
     # all-reduces carry the same bytes: only the shards' shapes show it
     "loses": ["mlp_tests"], "visible": ["mlp_tests"], "visible_says": ["tp.group_size"]},
    {"name": "Exercise 3 not attempted: the tests of Exercises 4 and 5 still run on their own",
     "replace": _blank("mlp"), "loses": MLP, "visible": MLP},
    {"name": "the library's layers instead of the learner's own (switched off while graded)",
     "replace": _edit("mlp",
                      ("        self.fc1 = MyColumnParallelLinear(mlp.fc1, group)\n"
                       "        self.fc2 = MyRowParallelLinear(mlp.fc2, group)",
                       "        self.fc1 = dl.tp.ColumnParallelLinear.from_dense(mlp.fc1, group)\n"
                       "        self.fc2 = dl.tp.RowParallelLinear.from_dense(mlp.fc2, group)")),
     "loses": MLP, "visible": MLP},
    {"name": "right answer another way: the layers call dl.tp's f and g (allowed)",
     "replace": _edit("mlp",
                      ("F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)",
                       "F.linear(dl.tp.copy_to_tp_region(x, self.group), self.weight, self.bias)"),
                      ("return reduce_from_tp_region(F.linear(x, self.weight), self.group)",
                       "return dl.tp.reduce_from_tp_region(F.linear(x, self.weight), self.group)")),
     "loses": []},
    {"name": "f and g swapped, and the layers call CopyToTPRegion.apply directly",
     "replace": {**_edit("f_and_g",
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
                 **_edit("mlp",
                         ("F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)",
                          "F.linear(CopyToTPRegion.apply(x, self.group), self.weight, self.bias)"),
                         ("return reduce_from_tp_region(F.linear(x, self.weight), self.group)",
                          "return ReduceFromTPRegion.apply(F.linear(x, self.weight), self.group)"))},
     # the tests of Exercises 3 and 4 stand the library's f and g in for these names too
     "loses": F_AND_G},
    # -- Exercise 4: attention (tested with the library's layers, f and g) --
    {"name": "one f per projection: three all-reduces in backward",
     "replace": _edit("attention", (
         "        x = copy_to_tp_region(x, self.group)      # one f for q, k and v\n"
         "        q, k, v = (F.linear(x, lin.weight, lin.bias) for lin in (self.q, self.k, "
         "self.v))",
         "        q, k, v = self.q(x), self.k(x), self.v(x)")),
     "loses": ["attention_comm_tests"], "visible": ["attention_comm_tests"],
     "visible_says": ["tp.attn_one_f"]},
    {"name": "attention without f: x's gradient is this rank's own term",
     "replace": _edit("attention", (
         "        x = copy_to_tp_region(x, self.group)      # one f for q, k and v\n", "")),
     "loses": ATTENTION, "visible": ATTENTION, "visible_says": ["tp.missing_f"]},
    {"name": "output projection cut by its output features too (column-parallel)",
     "replace": _edit("attention", ("        self.o = MyRowParallelLinear(attn.o, group)",
                                    "        self.o = MyColumnParallelLinear(attn.o, group)")),
     "loses": ATTENTION, "visible": ATTENTION, "visible_says": ["tp.attn_split_kinds"]},
    {"name": "q, k and v cut by their input features (row-parallel), o by its output features",
     "replace": _edit("attention",
                      ("        self.q = MyColumnParallelLinear(attn.q, group)\n"
                       "        self.k = MyColumnParallelLinear(attn.k, group)\n"
                       "        self.v = MyColumnParallelLinear(attn.v, group)\n"
                       "        self.o = MyRowParallelLinear(attn.o, group)",
                       "        self.q = MyRowParallelLinear(attn.q, group)\n"
                       "        self.k = MyRowParallelLinear(attn.k, group)\n"
                       "        self.v = MyRowParallelLinear(attn.v, group)\n"
                       "        self.o = MyColumnParallelLinear(attn.o, group)")),
     "loses": ATTENTION, "visible": ATTENTION, "visible_says": ["tp.attn_split_kinds"]},
    {"name": "the output summed over the group again after the row-parallel projection",
     "replace": _edit("attention", (
         "        return self.o(dl.models.attend(q, k, v, self.head_dim))",
         "        return reduce_from_tp_region(self.o(dl.models.attend(q, k, v, self.head_dim)),\n"
         "                                     self.group)")),
     "loses": ATTENTION, "visible": ATTENTION, "visible_says": ["tp.attn_double_g"]},
    {"name": "right answer another way: q, k and v fused into one matrix behind one f",
     "replace": _edit("attention", (
         "        x = copy_to_tp_region(x, self.group)      # one f for q, k and v\n"
         "        q, k, v = (F.linear(x, lin.weight, lin.bias) for lin in (self.q, self.k, "
         "self.v))",
         "        lins = (self.q, self.k, self.v)\n"
         "        qkv = F.linear(copy_to_tp_region(x, self.group),\n"
         "                       torch.cat([lin.weight for lin in lins]),\n"
         "                       torch.cat([lin.bias for lin in lins]))\n"
         "        q, k, v = qkv.chunk(3, dim=-1)")),
     "loses": []},
    {"name": "checks that d_model splits instead of the heads",
     "replace": _edit("attention", (
         "        if attn.n_heads % tp:\n", "        if attn.q.out_features % tp:\n")),
     "loses": ["attention_tests"], "visible": ["attention_tests"],
     "visible_says": ["1.5 heads"]},
    {"name": "checks that the width of a head splits instead of the number of heads",
     "replace": _edit("attention", (
         "        if attn.n_heads % tp:\n", "        if attn.head_dim % tp:\n")),
     "loses": ["attention_tests"], "visible": ["attention_tests"],
     "visible_says": ["tp.heads_split"]},
    {"name": "head_dim divided by tp along with everything else",
     "replace": _edit("attention", (
         "        self.head_dim = attn.head_dim\n", "        self.head_dim = attn.head_dim // tp\n")),
     "loses": ["attention_tests"], "visible": ["attention_tests"]},
    # -- Exercise 5: sequence parallelism --
    {"name": "right numbers, all-reduce then keep my part instead of a reduce-scatter",
     "replace": _edit("sequence_parallel", (
         "        out = x.new_empty((x.shape[0] // tp, *x.shape[1:]))\n"
         "        dist.reduce_scatter_single(out, x.contiguous(), group=group)\n"
         "        return out",
         "        total = x.clone()\n"
         "        dist.all_reduce(total, group=group)\n"
         "        return total.chunk(tp, dim=0)[dist.get_rank(group)].contiguous()")),
     "loses": ["sequence_parallel_comm_tests"], "visible": ["sequence_parallel_comm_tests"],
     "visible_says": ["not an all-reduce followed by keeping a slice"]},
    {"name": "all-gather's backward keeps its part of the gradient without summing",
     "replace": _edit("sequence_parallel", (
         "        out = grad.new_empty((grad.shape[0] // tp, *grad.shape[1:]))\n"
         "        dist.reduce_scatter_single(out, grad.contiguous(), group=ctx.group)\n"
         "        return out, None",
         "        return grad.chunk(tp, dim=0)[dist.get_rank(ctx.group)].contiguous(), None")),
     "loses": SEQUENCE, "visible": SEQUENCE},
    {"name": "sequence-parallel bias added before the reduce-scatter",
     "replace": _edit("sequence_parallel", (
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2), self.group) + self.b2",
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2, self.b2), self.group)")),
     "loses": ["sequence_parallel_tests"], "visible": ["sequence_parallel_tests"],
     "visible_says": ["b2 was added before the reduce-scatter"]},
    {"name": "b2's gradient all-reduced inside the layer (Megatron does it in its grad sync)",
     "replace": _edit("sequence_parallel", (
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2), self.group) + self.b2",
         "ReduceScatterToSequenceRegion.apply(F.linear(h, self.w2), self.group)"
         " + copy_to_tp_region(self.b2, self.group)")),
     "loses": SEQUENCE, "visible": SEQUENCE, "visible_says": ["tp.sp_replicated_grad"],
     "visible_never_says": ["added before the reduce-scatter"]},
    # -- recall --
    {"name": "every recall answer wrong",
     "replace": {**_recall("answer_param_sync", 'q_param_sync = "a"'),
                 **_recall("answer_f_backward", 'q_f_backward = "b"'),
                 **_recall("answer_group_rank", 'q_group_rank = "a"'),
                 **_recall("answer_what_tp_sends", 'q_what_tp_sends = "c"'),
                 **_recall("answer_sp_bytes", 'q_sp_norm_grad = "a"'),
                 **_recall("answer_ring_mib", "q_ring_mib = 128"),
                 **_recall("answer_predict_params", "predict_rank_params = 138")},
     "loses": ["recall_param_sync", "recall_f_backward", "recall_group_rank",
               "recall_what_tp_sends", "recall_sp_bytes", "recall_ring_mib",
               "recall_predict_params"]},
    {"name": "ring bytes: 2 x the tensor, forgetting the (n-1)/n",
     "replace": _recall("answer_ring_mib", "q_ring_mib = 256"),
     "loses": ["recall_ring_mib"]},
    {"name": "ring bytes within the stated tolerance (right)",
     "replace": _recall("answer_ring_mib", "q_ring_mib = 224.4"),
     "loses": []},
]
