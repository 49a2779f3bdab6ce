"""BatchNormalization folding: `conv_bn_folding` and `bn_to_affine` (level 2).

An inference BatchNormalization with constant parameters is a per-channel affine map
y -> y * scale + shift, and so is a Mul/Add/Sub/Div by a per-channel constant. A chain of
such single-use steps after a Conv folds into the Conv's weights and bias
(`conv_bn_folding`); after anything else, the BatchNormalization and the steps after it
become one Mul and one Add by per-channel constants (`bn_to_affine`), which
`scale_into_conv` and elementwise fusion take further.
"""

from __future__ import annotations

import numpy as np

from opwarden.ir.graph import Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.match import channel_vector, is_add, is_std, other_input
from opwarden.passes.rewrite import PassResult, Rewriter


def _bn_affine(rw: Rewriter, bn: Node, m: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) of an inference BatchNormalization with constant parameters."""
    if not is_std(bn, "BatchNormalization") or bn.opdef is None or len(bn.outputs) != 1:
        return None
    kw = kernel_kwargs(bn)
    if kw.get("training_mode", 0):
        return None
    params = [rw.const(v) for v in bn.inputs[1:5]]
    if len(params) != 4 or any(p is None or p.shape != (m,) or p.dtype.kind != "f"
                               for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(var + float(kw.get("epsilon", 1e-5)))
    return s, bias - mean * s


def _affine_step(rw: Rewriter, c: Node, y: Value, rank: int, m: int):
    """(scale, shift) if consumer c of y is a per-channel affine map of y, else None."""
    if c.inputs and c.inputs[0] is y and is_std(c, "BatchNormalization"):
        return _bn_affine(rw, c, m)
    if not is_std(c, "Mul", "Add", "Sum", "Sub", "Div") or c.opdef is None:
        return None
    if c.op_type != "Sum" and c.opdef.since < 7:
        return None  # legacy broadcast attributes
    z = other_input(c, y)
    k = rw.const(z)
    if k is None or k.dtype.name != y.fact.dtype:
        return None
    vec = channel_vector(k, rank, m)
    if vec is None:
        return None
    ones, zeros = np.ones(m), np.zeros(m)
    if c.op_type == "Mul":
        return vec, zeros
    if is_add(c):
        return ones, vec
    if c.op_type == "Sub" and c.inputs[0] is y:
        return ones, -vec
    if c.op_type == "Div" and c.inputs[0] is y:
        return 1.0 / vec, zeros
    return None


def _absorb_affine(rw: Rewriter, y: Value, rank: int, m: int, scale, shift, parts: list):
    """Fold the chain of single-use affine consumers after y (appended to `parts`); (last
    value, scale, shift, n)."""
    n = 0
    while True:
        c = rw.single_use(y)
        if c is None or c.outputs[0] is None or len(c.outputs) != 1:
            break
        step = _affine_step(rw, c, y, rank, m)
        if step is None:
            break
        s, t = step
        scale, shift = scale * s, shift * s + t
        rw.remove(c)
        parts.append(c)
        y = c.outputs[0]
        n += 1
    return y, scale, shift, n


def conv_bn_folding(rw: Rewriter) -> PassResult:
    """Fold BatchNormalization, and Mul/Add/Sub/Div by per-channel constants, into the
    preceding Conv's weights and bias."""
    res = PassResult()
    for node in rw.graph.nodes:
        if not is_std(node, "Conv") or id(node) in rw.removed or node.opdef is None:
            continue
        w = rw.const(node.inputs[1])
        bv = node.inputs[2] if len(node.inputs) > 2 else None
        b = rw.const(bv) if bv is not None else None
        y = node.outputs[0]
        if w is None or w.dtype.kind != "f" or (bv is not None and b is None) or y is None:
            continue
        if y.fact.dtype is not None and y.fact.dtype != w.dtype.name:
            continue
        m = w.shape[0]
        shift = b.astype(np.float64) if b is not None else np.zeros(m)
        parts: list[Node] = []
        last, scale, shift, n = _absorb_affine(rw, y, w.ndim, m, np.ones(m), shift, parts)
        if not n:
            continue
        # In W's own dtype: the scale is rounded once, and large weights are not converted
        # to float64 and back at load.
        new_w = w * scale.astype(w.dtype).reshape((m,) + (1,) * (w.ndim - 1))
        wv = rw.new_const(f"{node.name}_W_folded", new_w)
        bv2 = rw.new_const(f"{node.name}_B_folded", shift.astype(w.dtype))
        rw.set_input(node, 1, wv)
        if len(node.inputs) < 3:
            node.inputs.append(None)
        rw.set_input(node, 2, bv2)
        node.outputs[0] = last
        last.producer = node
        rw.absorb(node, parts)
        res.details["folded_nodes"] += n
        res.details["convs"] += 1
        res.changes += n
    return res


def bn_to_affine(rw: Rewriter) -> PassResult:
    """An inference BatchNormalization not after a Conv (and the per-channel Mul/Add after it)
    becomes one Mul and one Add by per-channel constants, ready for elementwise fusion."""
    res = PassResult()
    default = rw.model.opsets.get("", 0)
    if default < 7:
        return res
    for node in rw.graph.nodes:
        if not is_std(node, "BatchNormalization") or id(node) in rw.removed:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x is None or y is None or x.fact.ndim is None or x.fact.ndim < 2:
            continue
        if x.fact.dtype not in ("float32", "float64"):
            continue
        sc = rw.const(node.inputs[1]) if len(node.inputs) > 1 else None
        if sc is None:
            continue
        m, rank = sc.shape[0] if sc.ndim == 1 else -1, x.fact.ndim
        first = _bn_affine(rw, node, m)
        if first is None:
            continue
        parts = [node]
        last, scale, shift, n = _absorb_affine(rw, y, rank, m, *first, parts)
        dt = np.dtype(x.fact.dtype)
        cshape = (m,) + (1,) * (rank - 2)
        s = rw.new_const(f"{node.name}_scale", scale.astype(dt).reshape(cshape))
        t = rw.new_const(f"{node.name}_shift", shift.astype(dt).reshape(cshape))
        mid = rw.new_value(f"{node.name}_scaled", last.fact)
        mul = rw.make_node("Mul", [x, s], [mid], {}, name=f"{node.name}_mul", parts=parts,
                           domain="", opset=default)
        add = rw.make_node("Add", [mid, t], [last], {}, name=f"{node.name}_add", parts=parts,
                           domain="", opset=default)
        rw.remove(node)
        anchor = node
        rw.place(mul, anchor)
        rw.place(add, anchor)
        res.details["BatchNormalization"] += 1
        res.details["absorbed"] += n
        res.changes += 1
    return res
