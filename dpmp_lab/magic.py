"""%%distributed: run one notebook cell on N ranks.

    %load_ext dpmp_lab

    %%distributed -n 4
    import torch, torch.distributed as dist
    t = torch.ones(2, device=dl.device()) * dist.get_rank()
    dist.all_reduce(t)
    print(t)                  # printed by every rank, as "[rank r] tensor([6., 6.])"
    t.sum().item()            # the last expression: one value per rank, shown as Out[...]

What the cell sees in each rank:
  * its own code, run as a fresh module: an initialised default process group, and
    dl.rank(), dl.world_size(), dl.device() (nothing is injected into the namespace);
  * the notebook variables it reads (functions, classes, tensors, modules), sent by value
    when the cell starts. Assignments in the cell stay in the ranks: they do not change the
    notebook's variables. Use `-o name` to keep the LaunchResult, or return values.
Options: -n/--nproc, --backend, --timeout, --start-method, -o/--out, --trace, which
shows a table of every rank's communication under the cell, --device-audit (audit.py), and
--debug (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks).
"""

from __future__ import annotations

import ast
import builtins
import itertools
import linecache
import re
from typing import Any

import dpmp_lab.viz as viz
from dpmp_lab.launcher.launch import launch
from dpmp_lab.launcher.serialize import dumps

__all__ = ["names_read", "register", "run_cell"]

_cells = itertools.count(1)

# IPython's own bookkeeping names: never what a cell means by a variable.
_IPYTHON_NAMES = re.compile(r"In|Out|get_ipython|exit|quit|_+|_\d+|_i+\d*|_[iod]h")


def run_cell(source: str, filename: str, names: dict[str, Any]) -> Any:
    """Run a cell's code in this rank; return the value of its last expression, if any."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace.update(names)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def names_read(source: str) -> set[str]:
    """Every plain name the code reads anywhere (nested functions included)."""
    return {
        node.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Load, ast.Del))
    }


def register(ipython: Any) -> None:
    """Register %%distributed in this IPython (what `%load_ext dpmp_lab` does)."""
    # IPython is imported here, not at the top: every rank of a %%distributed cell imports
    # this module (for run_cell), and none of them needs IPython.
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
    from IPython.display import display

    @magic_arguments()
    @argument("-n", "--nproc", type=int, default=4, help="number of ranks (world size)")
    @argument("--backend", default="auto", help="auto, gloo or nccl")
    @argument("--timeout", type=float, default=120.0, help="seconds before a hang is reported")
    @argument("--start-method", default="forkserver", help="forkserver, fork or spawn")
    @argument("--trace", action="store_true", help="show each rank's communication")
    @argument("--device-audit", action="store_true",
              help="run on the CPU as if each rank had a GPU; fail where data is misplaced")
    @argument("--debug", action="store_true",
              help="torch's checks (TORCH_DISTRIBUTED_DEBUG=DETAIL): a mismatched collective "
                   "fails at once, naming each rank's op and shapes")
    @argument("-o", "--out", default=None, help="store the LaunchResult in this variable")
    def distributed(line: str, cell: str):
        """Run this cell on N ranks, each with an initialised process group."""
        opts = parse_argstring(distributed, line)
        source = ipython.transform_cell(cell)
        filename = f"<distributed-cell-{next(_cells)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)

        user_ns = ipython.user_ns
        names = {}
        for name in sorted(names_read(source)):
            if name not in user_ns or _IPYTHON_NAMES.fullmatch(name):
                continue
            try:
                dumps(user_ns[name])
            except Exception as exc:
                raise ValueError(
                    f"the cell reads the notebook variable `{name}` "
                    f"({type(user_ns[name]).__name__}), which cannot be sent to the ranks: "
                    f"{type(exc).__name__}: {exc}. Create it inside the cell instead."
                ) from exc
            names[name] = user_ns[name]

        res = launch(run_cell, source, filename, names, world_size=opts.nproc,
                     backend=opts.backend, timeout=opts.timeout,
                     start_method=opts.start_method, trace=opts.trace,
                     device_audit=True if opts.device_audit else None, debug=opts.debug)
        if opts.out:
            user_ns[opts.out] = res
        if opts.trace:
            display(viz.comm(res))
        if any(v is not None for v in res.values):
            return res.values
        return None

    ipython.register_magic_function(distributed, magic_kind="cell", magic_name="distributed")
