"""`concat_conv_merge` (level 2): a Concat of sibling convolutions as one FusedConv.

A Concat along the channels of convolutions of one input with the same strides, dilations
and activation (SqueezeNet's fire module: a 1x1 and a 3x3 expand) becomes one FusedConv
whose W holds each branch's kernel centred in the largest one, and whose `branches`
attribute lists each branch's channels and kernel size. The Concat's copies and the separate
passes over the input go. The fast kernels run it as one convolution while the input is
finite (a zero tap times a finite input is an exact zero) and branch by branch otherwise, so
NaN and Inf stay where the separate convolutions put them. Convolutions of one kernel size
concatenate exactly (no `branches`).
"""

from __future__ import annotations

import numpy as np
import onnx

from opwarden.ir.graph import Node, Value
from opwarden.passes.match import ACT_TYPES, const_conv, is_std, joined_bias, known_shape
from opwarden.passes.rewrite import PassResult, Rewriter, part_name


def _branch_conv(rw: Rewriter, v: Value, concat: Node) -> tuple | None:
    """(conv node, W, B, (kh, kw), pads, key) when v is output 0 of a const_conv with
    explicit pads, read only by `concat`; key holds what siblings must share (input, strides,
    dilations, activation)."""
    p = v.producer
    if p is None or p.outputs[0] is not v or rw.single_use(v) is not concat:
        return None
    c = const_conv(rw, p)
    if c is None or c[7] != "NOTSET":
        return None
    w, b, pads, strides, dil, act, params, _ = c
    return p, w, b, w.shape[2:], pads, (id(p.inputs[0]), strides, dil, act, params)


def _branches(rw: Rewriter, node: Node) -> list[tuple] | None:
    """The _branch_conv of each input of a channel Concat of 4-D tensors, when they are all
    distinct convolutions sharing one key; else None."""
    if not is_std(node, "Concat") or id(node) in rw.removed or len(node.inputs) < 2:
        return None
    shape = known_shape(node.outputs[0])
    if shape is None or len(shape) != 4 or int(node.attrs.get("axis", 1)) % 4 != 1:
        return None
    parts = [_branch_conv(rw, v, node) if v is not None else None for v in node.inputs]
    if any(q is None for q in parts) or len({id(q[0]) for q in parts}) != len(parts):
        return None
    if len({q[5] for q in parts}) != 1:
        return None
    return parts


def _centred_pads(parts: list[tuple]) -> tuple[int, int, list[int]] | None:
    """(kh, kw, pads) of the merged convolution: the largest kernel's size and pads, when one
    branch has it and every other branch's kernel centred in it reads the same pixels (an
    even size difference, pads smaller by half of it)."""
    kh = max(q[3][0] for q in parts)
    kw = max(q[3][1] for q in parts)
    big = next((q for q in parts if tuple(q[3]) == (kh, kw)), None)
    if big is None:  # (e.g. 1x3 and 3x1: no branch has the whole kernel)
        return None
    dil = parts[0][5][2]
    pads = big[4]
    for q in parts:
        oh, ow = kh - q[3][0], kw - q[3][1]
        if oh % 2 or ow % 2:
            return None
        want = [pads[0] - oh // 2 * dil[0], pads[1] - ow // 2 * dil[1],
                pads[2] - oh // 2 * dil[0], pads[3] - ow // 2 * dil[1]]
        if q[4] != want:
            return None
    return kh, kw, pads


def _merged_weights(parts: list[tuple], kh: int, kw: int) -> tuple[np.ndarray, list[int]]:
    """(W of all branches, each centred in a kh x kw kernel; each branch's output channels)."""
    ms = [int(q[1].shape[0]) for q in parts]
    c = int(parts[0][1].shape[1])
    w_all = np.zeros((sum(ms), c, kh, kw), np.float32)
    m0 = 0
    for q, m in zip(parts, ms, strict=True):
        oh, ow = (kh - q[3][0]) // 2, (kw - q[3][1]) // 2
        w_all[m0:m0 + m, :, oh:oh + q[3][0], ow:ow + q[3][1]] = q[1]
        m0 += m
    return w_all, ms


def concat_conv_merge(rw: Rewriter) -> PassResult:
    """Concat along the channels of sibling convolutions of one input -> one FusedConv with
    `branches` (see the module docstring)."""
    res = PassResult()
    for node in rw.graph.nodes:
        parts = _branches(rw, node)
        found = None if parts is None else _centred_pads(parts)
        if found is None:
            continue
        kh, kw, pads = found
        _x, strides, dil, act, params = parts[0][5]
        w_all, ms = _merged_weights(parts, kh, kw)
        b_all = joined_bias([q[2] for q in parts], ms)
        first = parts[0][0]
        x = first.inputs[0]
        attrs = {"kernel_shape": [kh, kw], "pads": pads, "strides": list(strides),
                 "dilations": list(dil), "group": 1}
        ints = onnx.AttributeProto.INTS
        types = {"kernel_shape": ints, "pads": ints, "strides": ints, "dilations": ints,
                 "group": onnx.AttributeProto.INT}
        if any(tuple(q[3]) != (kh, kw) for q in parts):
            attrs["branches"] = [v for q, m in zip(parts, ms, strict=True)
                                 for v in (m, int(q[3][0]), int(q[3][1]))]
            types["branches"] = ints
        if act:
            attrs.update(activation=act, activation_params=list(params))
            types.update(ACT_TYPES)
        for q in parts:
            rw.remove(q[0])
        rw.remove(node)
        fused = rw.make_node(
            "FusedConv",
            [x, rw.new_const(f"{first.name}_concat_W", w_all),
             rw.new_const(f"{first.name}_concat_B", b_all)],
            [node.outputs[0]], attrs, name=part_name([q[0] for q in parts] + [node]),
            parts=[q[0] for q in parts] + [node], attr_types=types)
        rw.place(fused, node)
        res.details["concats of convolutions merged"] += 1
        res.details["convolutions merged"] += len(parts)
        res.changes += len(parts)
    return res
