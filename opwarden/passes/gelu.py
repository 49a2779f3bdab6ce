"""The exact Gelu as exporters spell it out: for the epilogue fusion (`fusion`) and, where no
epilogue took it, as one node (`gelu_fusion`).

ONNX has a Gelu operator only from opset 20, so exports before it write
x * 0.5 * (1 + erf(x / sqrt 2)) over five or six nodes, in any of a few orders. `gelu_chain`
returns those nodes when they are all of a value's readers, so a Conv/Gemm/MatMul epilogue
takes them as its activation. `gelu_fusion` (level 2, after the epilogue fusions) rewrites
each chain left, whatever produces x (a DynamicQuantizeMatMul, a Cast, an Add of a residual),
as one com.microsoft Gelu, as ORT's GeluFusion does: one pass over the tensor on the compiled
loop instead of six NumPy passes.
"""

from __future__ import annotations

import math

from opwarden.ir.graph import Node, Value
from opwarden.passes.match import FLOAT, is_std, known_shape, other_input
from opwarden.passes.rewrite import PassResult, Rewriter, part_name

MS = "com.microsoft"


def _scalar(rw: Rewriter, v: Value | None, want: float) -> bool:
    """v is a one-element constant equal to `want` up to float32 rounding."""
    k = rw.const(v)
    if k is None or k.size != 1 or k.dtype.kind != "f":
        return False
    return abs(float(k.reshape(-1)[0]) - want) <= 1e-6 * abs(want)


def _binary(node: Node | None, op_type: str, v: Value) -> Value | None:
    """node's other input when node is the standard binary `op_type` reading v once."""
    return other_input(node, v) if is_std(node, op_type) and node.opdef is not None else None


def _scaled_input(rw: Rewriter, erf: Node) -> tuple[Value, Node] | None:
    """(x, the scaling node) when erf reads x / sqrt 2 (a Div) or x * sqrt 0.5 (a Mul), its
    result read by erf alone."""
    u = erf.inputs[0] if erf.inputs else None
    scale = u.producer if u is not None else None
    if scale is None or rw.single_use(u) is not erf or id(scale) in rw.removed:
        return None
    if is_std(scale, "Div") and len(scale.inputs) == 2 and _scalar(rw, scale.inputs[1],
                                                                    math.sqrt(2.0)):
        x = scale.inputs[0]
    elif is_std(scale, "Mul") and len(scale.inputs) == 2:
        a, b = scale.inputs
        x = a if _scalar(rw, b, math.sqrt(0.5)) else b if _scalar(rw, a, math.sqrt(0.5)) else None
    else:
        return None
    if x is None or x is u:
        return None
    return x, scale


def _erf_gelu(rw: Rewriter, erf: Node) -> tuple[Value, list[Node]] | None:
    """(x, nodes from the scaling to the last Mul) when `erf` is the middle of an exporter's
    exact Gelu, x * 0.5 * (1 + erf(x / sqrt 2)) in any of its usual orders:
    Div(x, sqrt2) or Mul(x, 1/sqrt2) -> Erf -> Add 1 -> then Mul x and Mul 0.5 (either
    first), or Mul with Mul(x, 0.5). Every intermediate has this chain as its only use."""
    found = _scaled_input(rw, erf)
    if found is None:
        return None
    x, scale = found
    e = erf.outputs[0]
    add = rw.single_use(e)
    one = _binary(add, "Add", e)
    if one is None or not _scalar(rw, one, 1.0):
        return None
    t = add.outputs[0]
    m1 = rw.single_use(t)
    other = _binary(m1, "Mul", t)
    if other is None:
        return None
    nodes = [scale, erf, add, m1]
    if other is x:  # (x * (1 + erf)) * 0.5
        last = rw.single_use(m1.outputs[0])
        half = _binary(last, "Mul", m1.outputs[0])
        if half is None or not _scalar(rw, half, 0.5):
            return None
        nodes.append(last)
    elif _scalar(rw, other, 0.5):  # ((1 + erf) * 0.5) * x
        last = rw.single_use(m1.outputs[0])
        if _binary(last, "Mul", m1.outputs[0]) is not x:
            return None
        nodes.append(last)
    else:  # (x * 0.5) * (1 + erf)
        h = other.producer
        if (h is None or id(h) in rw.removed or rw.single_use(other) is not m1
                or not _scalar(rw, _binary(h, "Mul", x), 0.5)):
            return None
        nodes.insert(0, h)
    y = nodes[-1].outputs[0]
    if x.fact.dtype not in FLOAT or y.fact.dtype != x.fact.dtype:
        return None
    if known_shape(x) is None or known_shape(x) != known_shape(y):
        return None  # (a broadcasting constant would change the shape)
    return x, nodes


def gelu_chain(rw: Rewriter, y: Value) -> list[Node] | None:
    """The nodes of an exporter's exact Gelu of y (see _erf_gelu) when they are all of y's
    readers; None otherwise."""
    if id(y) in rw.outputs or not rw.local_uses(y):
        return None
    for n, _ in y.uses:
        if not is_std(n, "Div", "Mul") or id(n) in rw.removed:
            continue
        erf = rw.single_use(n.outputs[0])
        if not is_std(erf, "Erf") or erf.opdef is None:
            continue
        found = _erf_gelu(rw, erf)
        if found is None or found[0] is not y:
            continue
        chain = found[1]
        if all(any(u is c for c in chain) for u, _ in y.uses):
            return chain
    return None


def gelu_fusion(rw: Rewriter) -> PassResult:
    """Each exact Gelu chain on float32 as one com.microsoft Gelu(x) (the chain's result: its
    last node's output). float32 only: the kernels of com.microsoft Gelu compute in float32,
    and float16 chains compute in float32 anyway once fp16_islands has run."""
    res = PassResult()
    for erf in list(rw.graph.nodes):
        if id(erf) in rw.removed or not is_std(erf, "Erf") or erf.opdef is None:
            continue
        found = _erf_gelu(rw, erf)
        if found is None:
            continue
        x, nodes = found
        y = nodes[-1].outputs[0]
        if x.fact.dtype != "float32" or y is None or any(id(n) in rw.removed for n in nodes):
            continue
        rw.remove_all(nodes)
        rw.model.opsets.setdefault(MS, 1)
        fused = rw.make_node("Gelu", [x], [y], {}, name=part_name(nodes), parts=nodes,
                             domain=MS, opset=rw.model.opsets.get(MS, 1))
        rw.place(fused, nodes[-1])
        res.details["Gelu"] += 1
        res.changes += len(nodes) - 1
    return res
