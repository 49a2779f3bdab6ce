"""`dead_code_elimination` (level 1): nodes whose outputs nothing reads go."""

from __future__ import annotations

from opwarden.ir.graph import Node
from opwarden.passes.rewrite import PassResult, Rewriter


def dead_code_elimination(rw: Rewriter) -> PassResult:
    """Remove nodes none of whose outputs is read or is a graph output."""
    res = PassResult()
    # Uses lost to removed readers are counted and the use lists filtered once at the end:
    # removing readers one by one rescans a value's uses per reader (quadratic when a value
    # that transpose cancellation left feeding thousands of dead nodes is read by all).
    dropped: dict[int, int] = {}
    dead: list[Node] = []
    for node in reversed(rw.graph.nodes):
        if id(node) in rw.removed:
            continue
        if any(v is not None and (len(v.uses) > dropped.get(id(v), 0) or id(v) in rw.outputs)
               for v in node.outputs):
            continue
        for v in node.inputs:
            if v is not None:
                dropped[id(v)] = dropped.get(id(v), 0) + 1
        dead.append(node)
        res.details[node.op_type] += 1
        res.changes += 1
    rw.remove_all(dead)
    return res
