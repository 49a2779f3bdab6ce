"""`transpose_cancellation` (level 2): a Transpose of a Transpose is one Transpose, or none
when the two permutations undo each other."""

from __future__ import annotations

import onnx

from opwarden.ir.graph import Node
from opwarden.passes.match import is_std
from opwarden.passes.rewrite import PassResult, Rewriter


def _perm(node: Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    x = node.inputs[0]
    if x is None or x.fact.ndim is None:
        return None
    return list(range(x.fact.ndim))[::-1]


def transpose_cancellation(rw: Rewriter) -> PassResult:
    """Transpose after Transpose: the identity (both removed) or one composed Transpose."""
    res = PassResult()
    for node in rw.graph.nodes:
        if not is_std(node, "Transpose") or id(node) in rw.removed:
            continue
        x = node.inputs[0]
        first = x.producer if x is not None else None
        if not is_std(first, "Transpose") or first.graph is not rw.graph or id(first) in rw.removed:
            continue
        p1, p2 = _perm(first), _perm(node)
        if p1 is None or p2 is None or len(p1) != len(p2):
            continue
        q = [p1[i] for i in p2]
        src = first.inputs[0]
        if q == list(range(len(q))) and rw.bypass(node, node.outputs[0], src):
            rw.remove(node)
            res.details["cancelled"] += 1
        else:  # (an identity perm here writes a graph output straight from src)
            rw.set_input(node, 0, src)
            rw.absorb(node, [first])
            node.attrs["perm"] = q
            if hasattr(node, "attr_types"):
                node.attr_types["perm"] = onnx.AttributeProto.INTS
            res.details["composed"] += 1
        res.changes += 1
    return res
