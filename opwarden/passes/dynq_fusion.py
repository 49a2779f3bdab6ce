"""Dynamic-quantization fusion (level 2): the chain onnxruntime.quantization.quantize_dynamic
writes for each MatMul with a constant weight,

    DynamicQuantizeLinear(x) -> MatMulInteger(xq, B, xzp, bzp) -> Cast(float) ->
    Mul(., Mul(x_scale, b_scale)) [-> Add(., bias)]

becomes one com.microsoft DynamicQuantizeMatMul(x, B, b_scale, bzp, bias), as ORT's
MatMulIntegerToFloatFusion and DynamicQuantizeMatMulFusion make it. The result is the chain's
bit for bit: the same uint8 quantization of x (DynamicQuantizeMatMul's all-equal range maps
every value to 0 as DynamicQuantizeLinear's does), the exact integer product, then one float32
multiply by the same float32 scale product and one float32 add. B, b_scale (per tensor or per
column), its zero point and the bias (1-D, one per column) are constants. A
DynamicQuantizeLinear read by several MatMulIntegers (the Q, K and V projections) is computed
by each fused node, and leaves the graph with its last reader (ORT makes those groups
MatMulIntegerToFloat on the shared quantized input instead: the same arithmetic, so the same
result).
"""

from __future__ import annotations

import numpy as np

from opwarden.ir.graph import Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.match import is_add, is_std, other_input
from opwarden.passes.rewrite import PassResult, Rewriter, part_name

MS = "com.microsoft"
FLOAT = 1  # TensorProto.FLOAT


def _producer(rw: Rewriter, v: Value | None, *types: str) -> Node | None:
    n = None if v is None else v.producer
    if n is None or n.graph is not rw.graph or id(n) in rw.removed or not is_std(n, *types):
        return None
    return n


def _scale_mul(rw: Rewriter, mul: Node, y: Value, dql: Node, n: int) -> Value | None:
    """b_scale, if `mul` multiplies y by Mul(dql's scale, a constant per-tensor/column b_scale)."""
    s = other_input(mul, y)
    sm = _producer(rw, s, "Mul")
    a_scale = dql.outputs[1]
    if sm is None or a_scale is None or a_scale not in sm.inputs:
        return None
    b_scale = other_input(sm, a_scale)
    k = rw.const(b_scale)
    if k is None or k.dtype != np.float32 or k.ndim > 1 or k.size not in (1, n):
        return None
    return b_scale


def _bias(rw: Rewriter, y: Value, n: int) -> tuple[Node | None, Value | None]:
    """(Add, bias) if y's only reader adds a constant float32 bias of one value per column."""
    c = rw.single_use(y)
    if c is None or not is_add(c) or c.opdef is None:
        return None, None
    b = other_input(c, y)
    k = rw.const(b)
    if k is None or k.dtype != np.float32 or k.shape != (n,) or c.outputs[0] is None:
        return None, None
    if c.outputs[0].fact.shape != y.fact.shape:
        return None, None
    return c, b


def _group(rw: Rewriter, mmi: Node) -> tuple[list[Node], Node, list] | None:
    """([MatMulInteger, Cast, Mul, (Add)], the DynamicQuantizeLinear, the fused inputs)."""
    a, b = mmi.inputs[0], mmi.inputs[1]
    azp = mmi.inputs[2] if len(mmi.inputs) > 2 else None
    bzp = mmi.inputs[3] if len(mmi.inputs) > 3 else None
    dql = _producer(rw, a, "DynamicQuantizeLinear")
    kb = rw.const(b)
    if dql is None or a is not dql.outputs[0] or azp is not dql.outputs[2] or kb is None:
        return None
    if kb.ndim != 2 or kb.dtype not in (np.int8, np.uint8) or len(dql.outputs) < 3:
        return None
    n = kb.shape[1]
    kz = None if bzp is None else rw.const(bzp)
    if bzp is not None and (kz is None or kz.ndim > 1 or kz.size not in (1, n)):
        return None
    cast = rw.single_use(mmi.outputs[0])
    if cast is None or not is_std(cast, "Cast") or int(kernel_kwargs(cast).get("to", 0)) != FLOAT:
        return None
    y = cast.outputs[0]
    if y is None:
        return None
    mul = rw.single_use(y)
    if mul is None or not is_std(mul, "Mul") or mul.outputs[0] is None:
        return None
    b_scale = _scale_mul(rw, mul, y, dql, n)
    if b_scale is None:
        return None
    add, bias = _bias(rw, mul.outputs[0], n)
    nodes = [mmi, cast, mul] + ([add] if add is not None else [])
    return nodes, dql, [dql.inputs[0], b, b_scale, bzp, bias]


def _drop_if_unread(rw: Rewriter, node: Node | None) -> list[Node]:
    """Remove `node` once nothing live reads any of its outputs (returns it if removed)."""
    if node is None or id(node) in rw.removed:
        return []
    for v in node.outputs:
        if v is not None and (id(v) in rw.outputs or any(id(n) not in rw.removed
                                                         for n, _ in v.uses)):
            return []
    rw.remove(node)
    return [node]


def dynamic_quantize_matmul_fusion(rw: Rewriter) -> PassResult:
    """DynamicQuantizeLinear + MatMulInteger + Cast + Mul [+ Add] -> DynamicQuantizeMatMul."""
    res = PassResult()
    for node in list(rw.graph.nodes):
        if id(node) in rw.removed or not is_std(node, "MatMulInteger") or node.opdef is None:
            continue
        g = _group(rw, node)
        if g is None:
            continue
        nodes, dql, ins = g
        scale_mul = _producer(rw, nodes[2].inputs[1], "Mul") or _producer(
            rw, nodes[2].inputs[0], "Mul")
        out = nodes[-1].outputs[0]
        assert out is not None  # _group took only nodes with an output
        rw.remove_all(nodes)
        helpers = _drop_if_unread(rw, scale_mul)
        helpers += _drop_if_unread(rw, dql)
        rw.model.opsets.setdefault(MS, 1)
        parts = [nodes[0], dql, *([scale_mul] if scale_mul is not None else []), *nodes[1:]]
        fused = rw.make_node("DynamicQuantizeMatMul", ins, [out], {},
                             name=part_name([nodes[0], *nodes[1:]]), parts=parts, domain=MS,
                             opset=rw.model.opsets.get(MS, 1))
        rw.place(fused, nodes[-1])
        res.details["DynamicQuantizeMatMul"] += 1
        res.changes += len(nodes) - 1 + len(helpers)
    return res
