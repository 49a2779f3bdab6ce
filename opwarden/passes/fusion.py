"""Epilogue fusion (level 2): `conv_fusion` and `gemm_fusion`.

A Conv, Gemm or MatMul and what follows it on its output alone (a bias or residual Add, then
an activation) become one FusedConv, FusedGemm or FusedMatMul, whose kernels apply the
epilogue while the output is still in cache. The activation is an activation operator
(`match.activation_of`), the exact Gelu exporters spell out in Div/Erf/Add/Mul nodes
(`gelu.gelu_chain`) or SiLU as Sigmoid and Mul (`match.silu_chain`, activation "Swish").
"""

from __future__ import annotations

from opwarden.ir.graph import Node
from opwarden.passes.gelu import gelu_chain
from opwarden.passes.match import (
    ACT_TYPES,
    CONV_ATTRS,
    FLOAT,
    activation_of,
    is_add,
    is_std,
    known_shape,
    other_input,
    silu_chain,
)
from opwarden.passes.rewrite import PassResult, Rewriter, fuse


def _with_act(rw: Rewriter, nodes: list[Node], attrs: dict) -> None:
    """Extend a chain with the activation after its last node, if there is one: an
    activation operator, the exact Gelu spelled out in Div/Erf/Add/Mul nodes (one pass
    over the tensor instead of six; the result differs from the unfused chain by float32
    rounding only, the kernel rounding once where the chain rounded after each node), or
    SiLU spelled Sigmoid then Mul (match.silu_chain: both nodes read y, so y is not single
    use)."""
    y = nodes[-1].outputs[0]
    c = rw.single_use(y)
    act = activation_of(rw, c, y)
    if act is not None:
        nodes.append(c)
        attrs["activation"], attrs["activation_params"] = act[0], act[1]
        return
    gelu = gelu_chain(rw, y) if y.fact.dtype in FLOAT else None
    if gelu is not None:
        nodes.extend(gelu)
        attrs["activation"], attrs["activation_params"] = "Gelu", [0.0]
        return
    silu = silu_chain(rw, y)
    if silu is not None:
        nodes.extend(silu)
        attrs["activation"], attrs["activation_params"] = "Swish", [1.0]


def conv_fusion(rw: Rewriter) -> PassResult:
    """Conv [+ residual Add] [+ activation] -> FusedConv (bias, Z, activation in one node)."""
    res = PassResult()
    for node in rw.graph.nodes:
        if not is_std(node, "Conv") or id(node) in rw.removed or node.opdef is None:
            continue
        y = node.outputs[0]
        if y is None or y.fact.dtype not in FLOAT:
            continue
        nodes, z = [node], None
        c = rw.single_use(y)
        if c is not None and is_add(c):
            other = other_input(c, y)
            if (other is not None and other.fact.dtype == y.fact.dtype
                    and known_shape(other) is not None and known_shape(other) == known_shape(y)):
                z = other
                nodes.append(c)
        attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}
        core = len(nodes)
        _with_act(rw, nodes, attrs)
        if len(nodes) == 1:
            continue
        b = node.inputs[2] if len(node.inputs) > 2 else None
        ins = [node.inputs[0], node.inputs[1], b, z]
        while ins and ins[-1] is None:
            ins.pop()
        types = {k: t for k, t in getattr(node, "attr_types", {}).items() if k in CONV_ATTRS}
        fuse(rw, res, "FusedConv", nodes, ins, attrs, {**types, **ACT_TYPES}, core)
    return res


def _gemm(rw: Rewriter, res: PassResult, node: Node) -> None:
    """Gemm + activation -> FusedGemm."""
    attrs = dict(node.attrs)
    nodes = [node]
    _with_act(rw, nodes, attrs)
    if len(nodes) > 1:
        types = dict(getattr(node, "attr_types", {}))
        fuse(rw, res, "FusedGemm", nodes, list(node.inputs), attrs, {**types, **ACT_TYPES}, 1)


def _matmul(rw: Rewriter, res: PassResult, node: Node) -> None:
    """MatMul [+ bias Add] [+ activation] -> FusedGemm (2-D, bias of rank <= 2) or
    FusedMatMul."""
    y = node.outputs[0]
    a, bm = node.inputs
    nodes, bias = [node], None
    c = rw.single_use(y)
    if c is not None and is_add(c):
        other = other_input(c, y)
        out = c.outputs[0]
        if (other is not None and other.fact.dtype == y.fact.dtype
                and known_shape(out) is not None and known_shape(out) == known_shape(y)):
            bias = other
            nodes.append(c)
    attrs: dict = {}
    core = len(nodes)
    _with_act(rw, nodes, attrs)
    if len(nodes) == 1:
        return
    two_d = a.fact.ndim == 2 and bm.fact.ndim == 2
    ins = [a, bm] + ([bias] if bias is not None else [])
    if two_d and (bias is None or (bias.fact.ndim is not None and bias.fact.ndim <= 2)):
        fuse(rw, res, "FusedGemm", nodes, ins, attrs, ACT_TYPES, core)
    else:
        fuse(rw, res, "FusedMatMul", nodes, ins, attrs, ACT_TYPES, core)


def gemm_fusion(rw: Rewriter) -> PassResult:
    """Gemm + activation -> FusedGemm; MatMul [+ bias Add] [+ activation] -> FusedGemm (2-D)
    or FusedMatMul."""
    res = PassResult()
    for node in rw.graph.nodes:
        if id(node) in rw.removed or node.opdef is None:
            continue
        y = node.outputs[0] if node.outputs else None
        if y is None or y.fact.dtype not in FLOAT:
            continue
        if is_std(node, "Gemm") and node.opdef.since >= 7:
            _gemm(rw, res, node)
        elif is_std(node, "MatMul"):
            _matmul(rw, res, node)
    return res
