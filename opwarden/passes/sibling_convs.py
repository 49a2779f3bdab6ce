"""`sibling_conv_merge` (level 2): sibling 1x1 convolutions of one input as one.

Unpadded 1x1 convolutions of one input with the same strides and activation (Inception's
branch heads) become one FusedConv producing all their output channels, then a Split back
into the original outputs: one GEMM reads the input once and has a wider output, which
costs less than the separate convolutions even with the Split's copies.
"""

from __future__ import annotations

import numpy as np
import onnx

from opwarden.contract import TensorFact
from opwarden.ir.graph import Node, Value
from opwarden.passes.match import ACT_TYPES, const_conv, joined_bias
from opwarden.passes.rewrite import PassResult, Rewriter, part_name


def _pointwise_key(rw: Rewriter, node: Node) -> tuple[tuple, tuple] | None:
    """(what sibling 1x1 convolutions must share to become one: (input, strides, activation,
    params); node's const_conv) or None unless node is an unpadded 1x1 const_conv with
    float32 input and output."""
    c = const_conv(rw, node)
    if c is None or c[0].shape[2:] != (1, 1) or any(c[2]):
        return None
    x, y = node.inputs[0], node.outputs[0]
    if y.fact.dtype != "float32" or x.fact.dtype != "float32":
        return None
    return (id(x), c[3], c[5], c[6]), c


def _split(rw: Rewriter, first: Node, y_all: Value, outs: list[Value], sizes: list[int],
           opset: int, parts: list[Node]) -> Node:
    """Split y_all along the channels into `outs` (sizes as an input from opset 13)."""
    split_ins: list[Value | None] = [y_all]
    split_attrs: dict = {"axis": 1}
    split_types = {"axis": onnx.AttributeProto.INT}
    if opset >= 13:
        split_ins.append(rw.new_const(f"{first.name}_siblings_split",
                                      np.array(sizes, np.int64)))
    else:
        split_attrs["split"] = sizes
        split_types["split"] = onnx.AttributeProto.INTS
    return rw.make_node("Split", split_ins, outs, split_attrs,
                        name=f"{part_name(parts)}_split", parts=parts, domain="",
                        opset=opset, attr_types=split_types)


def _merge(rw: Rewriter, group: list[tuple[Node, tuple]], strides, act, params,
           opset: int) -> None:
    """Replace the group's convolutions by one FusedConv and a Split, where the first was."""
    members = [n for n, _ in group]
    convs = [c for _, c in group]
    ws = [c[0] for c in convs]
    sizes = [int(w.shape[0]) for w in ws]
    first = members[0]
    w_all = rw.new_const(f"{first.name}_siblings_W", np.concatenate(ws, axis=0))
    b_all = rw.new_const(f"{first.name}_siblings_B",
                         joined_bias([c[1] for c in convs], sizes))
    y0 = first.outputs[0]
    shape = None
    if y0.fact.shape is not None and len(y0.fact.shape) == 4:
        shape = (y0.fact.shape[0], sum(sizes), *y0.fact.shape[2:])
    y_all = rw.new_value(f"{first.name}_siblings", TensorFact("float32", shape))
    attrs = {"strides": list(strides), "kernel_shape": [1, 1], "group": 1}
    types = {"strides": onnx.AttributeProto.INTS, "kernel_shape": onnx.AttributeProto.INTS,
             "group": onnx.AttributeProto.INT}
    if act:
        attrs.update(activation=act, activation_params=list(params))
        types.update(ACT_TYPES)
    x = first.inputs[0]
    outs = [n.outputs[0] for n in members]
    for n in members:
        rw.remove(n)
    merged = rw.make_node("FusedConv", [x, w_all, b_all], [y_all], attrs,
                          name=part_name(members), parts=members, attr_types=types)
    split = _split(rw, first, y_all, outs, sizes, opset, members)
    rw.place(merged, first)
    rw.place(split, first)


def sibling_conv_merge(rw: Rewriter) -> PassResult:
    """Sibling 1x1 convolutions of one input with the same strides and activation -> one
    FusedConv producing all their output channels, then a Split back into the original
    outputs (see the module docstring)."""
    res = PassResult()
    groups: dict[tuple, list[tuple[Node, tuple]]] = {}
    for node in rw.graph.nodes:
        found = _pointwise_key(rw, node)
        if found is not None:
            groups.setdefault(found[0], []).append((node, found[1]))
    opset = rw.model.opsets.get("", 1)
    for (_x, strides, act, params), group in groups.items():
        if len(group) < 2:
            continue
        _merge(rw, group, strides, act, params, opset)
        res.details["1x1 convolutions merged"] += len(group)
        res.details["merged groups"] += 1
        res.changes += len(group)
    return res
