"""`activation_after_maxpool` (level 2): an activation moves after the max pool reading it.

A non-decreasing activation (`match.MONOTONE`) commutes with max pooling, so act then
MaxPool (or GlobalMaxPool) becomes the pool then act when the pool's output is smaller: the
activation then passes over the pooled tensor only, just written, instead of the larger one
(SqueezeNet's stem and fire modules, ResNet's and Inception's stems, VGG's block ends). The
activation may be its own node or a FusedConv's; exact, NaN and Inf included.
"""

from __future__ import annotations

import math

from opwarden.passes.match import FLOAT, MONOTONE, activation_of, fused_activation, is_std, monotone
from opwarden.passes.rewrite import (
    PassResult,
    Rewriter,
    activation_node,
    conv_copy,
    pool_copy,
    static_shape,
)


def activation_after_maxpool(rw: Rewriter) -> PassResult:
    """act then MaxPool (or GlobalMaxPool) becomes the pool then act, for an activation that
    never decreases (see MONOTONE) applied by its own node or by a FusedConv, when the pool's
    output has fewer elements than its input (a quarter of them for a 3x3/2 pool). A moved
    activation can join the elementwise chain after the pool (elementwise_fusion runs
    later)."""
    res = PassResult()
    if rw.model.opsets.get("", 0) < 6:  # (Clip and LeakyRelu as written here)
        return res
    for node in rw.graph.nodes:
        if id(node) in rw.removed or not node.outputs or node.outputs[0] is None:
            continue
        y = node.outputs[0]
        if is_std(node, *MONOTONE):
            fused, act = False, activation_of(rw, node, node.inputs[0]) if node.inputs else None
        else:
            fused, act = True, fused_activation(node)
        if act is None or not monotone(*act) or y.fact.dtype not in FLOAT:
            continue
        pool = rw.single_use(y)
        if not is_std(pool, "MaxPool", "GlobalMaxPool") or pool.inputs[0] is not y:
            continue
        if any(o is not None for o in pool.outputs[1:]):  # MaxPool's Indices
            continue
        out = pool.outputs[0]
        xs, ys = static_shape(y), static_shape(out)
        if xs is None or ys is None or math.prod(ys) >= math.prod(xs) or \
                out.fact.dtype != y.fact.dtype:
            continue
        pooled = rw.new_value(f"{pool.name}_pooled", out.fact)
        rw.remove(pool)
        rw.remove(node)
        if fused:  # the convolution stays, without its activation
            rw.place(conv_copy(rw, node, node.inputs[0], y, False), node)
        src = y if fused else node.inputs[0]
        rw.place(pool_copy(rw, pool, src, pooled), pool)
        rw.place(activation_node(rw, act[0], act[1], pooled, out, f"{pool.name}_{act[0]}",
                                 [node]), pool)
        res.details[f"{act[0]} after {pool.op_type}"] += 1
        res.changes += 1
    return res
