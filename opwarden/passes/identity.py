"""`identity_elimination` (level 1): nodes that return their input go.

Identity, inference Dropout, a Cast to the same type, a Reshape/Flatten/Squeeze/Unsqueeze/
Expand to the same shape, an identity Transpose and a single-input Concat/Sum/Max/Min/Mean
are bypassed: their readers read the input instead (or, for a graph output, the input's
producer writes the output directly).
"""

from __future__ import annotations

import math

from opwarden.ir.graph import Node
from opwarden.passes.rewrite import PassResult, Rewriter, static_shape

_SINGLE_INPUT_IDENTITY = frozenset({"Concat", "Sum", "Max", "Min", "Mean"})
_SAME_SHAPE_IDENTITY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})


def _is_noop(rw: Rewriter, node: Node) -> bool:
    x, y = node.inputs[0] if node.inputs else None, node.outputs[0]
    if x is None or y is None or x.kind != "tensor":
        return False
    if any(v is not None and (v.uses or id(v) in rw.outputs) for v in node.outputs[1:]):
        return False  # a second output (Dropout's mask) is still read
    t = node.op_type
    if t == "Identity":
        return True
    if t == "Dropout":
        if node.opdef.since < 7:
            return bool(node.attrs.get("is_test", 0))
        if node.opdef.since < 12:
            return True
        mode = node.inputs[2] if len(node.inputs) > 2 else None
        if mode is None:
            return True
        c = rw.const(mode)
        return c is not None and c.size == 1 and not bool(c.reshape(-1)[0])
    if x.fact.dtype is None or y.fact.dtype != x.fact.dtype:
        return False
    if t == "Cast":
        return True
    if t in _SINGLE_INPUT_IDENTITY:
        return len(node.inputs) == 1
    if t in _SAME_SHAPE_IDENTITY:
        sx, sy = static_shape(x), static_shape(y)
        if sy is None and t == "Reshape":
            sy = _reshape_target(rw, node, sx)
        return sx is not None and sx == sy
    if t == "Transpose":
        perm = node.attrs.get("perm")
        if perm is None:
            return x.fact.ndim is not None and x.fact.ndim <= 1
        return list(perm) == list(range(len(perm)))
    return False


def _reshape_target(rw: Rewriter, node: Node, sx: tuple[int, ...] | None):
    """The static output shape of a Reshape with a constant shape input, if computable."""
    shape = rw.const(node.inputs[1]) if len(node.inputs) > 1 else None
    if sx is None or shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu":
        return None
    allowzero = int(node.attrs.get("allowzero", 0))
    dims = [int(d) for d in shape]
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(sx):
                return None
            d = sx[i]
        out.append(d)
    if out.count(-1) > 1:
        return None
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known <= 0 or math.prod(sx) % known:
            return None
        out[out.index(-1)] = math.prod(sx) // known
    return tuple(out) if math.prod(out) == math.prod(sx) else None


def identity_elimination(rw: Rewriter) -> PassResult:
    """Drop nodes that return their input: Identity, inference Dropout, Cast to the same type,
    Reshape/Flatten/Squeeze/Unsqueeze/Expand to the same shape, identity Transpose,
    single-input Concat/Sum/Max/Min/Mean."""
    res = PassResult()
    for node in rw.graph.nodes:
        if node.domain or node.opdef is None or id(node) in rw.removed:
            continue
        if not _is_noop(rw, node):
            continue
        if rw.bypass(node, node.outputs[0], node.inputs[0]):
            rw.remove(node)
            res.details[node.op_type] += 1
            res.changes += 1
    return res
