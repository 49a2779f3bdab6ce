"""Attention-core fusion (level 2): `attention_fusion`.

Exporters spell scaled dot-product attention as MatMul(Q, Kt) -> [Mul or Div by a scalar] ->
[Add a position bias] [Add a mask] -> Softmax over the last axis -> [a float32 Cast] ->
MatMul(., V). Each of those
nodes reads and writes the whole (..., S, T) score matrix; as one SoftmaxAttention node
(ops/fused_attention.py) the kernel keeps blocks of it in cache instead. Every intermediate
must be read by the next node alone. Runs before `gemm_fusion`,
which would otherwise take the first MatMul and the bias Add as a FusedMatMul.
"""

from __future__ import annotations

import onnx

from opwarden.ir.graph import Node, Value
from opwarden.passes.match import is_add, is_std, other_input
from opwarden.passes.rewrite import PassResult, Rewriter, fuse

_TYPES = {"scale": onnx.AttributeProto.FLOAT, "divide": onnx.AttributeProto.INT}


def _scalar(rw: Rewriter, v: Value | None) -> float | None:
    """v's value when it is a one-element float constant."""
    k = rw.const(v)
    if k is None or k.size != 1 or k.dtype.kind != "f":
        return None
    return float(k.reshape(-1)[0])


def _last_axis_softmax(node: Node | None) -> bool:
    """A Softmax over the last axis: axis -1 or rank - 1 (opset 1/11 coerce to 2-D at the
    axis, the same rows when it is the last one)."""
    if not is_std(node, "Softmax") or node is None or node.opdef is None:
        return False
    x = node.inputs[0]
    rank = x.fact.ndim if x is not None else None
    axis = int(node.attrs.get("axis", -1 if node.opdef.since >= 13 else 1))
    return axis == -1 or (rank is not None and axis == rank - 1)


def _f32_rank(v: Value | None) -> int | None:
    """v's rank when it is a float32 value of known rank, else None."""
    if v is None or v.fact.dtype != "float32":
        return None
    return v.fact.ndim


def _noop_cast(node: Node | None) -> bool:
    """A Cast of float32 to float32 (exporters leave one after an attention Softmax)."""
    return (node is not None and is_std(node, "Cast") and len(node.inputs) == 1
            and _f32_rank(node.inputs[0]) is not None and _f32_rank(node.outputs[0]) is not None)


def _fuse_at(rw: Rewriter, res: PassResult, mm: Node) -> None:
    q, kt = mm.inputs
    s = mm.outputs[0]
    rank, rq, rk = _f32_rank(s), _f32_rank(q), _f32_rank(kt)
    if rank is None or rq is None or rk is None or rq < 2 or rk < 2 or rank < 3:
        return
    nodes: list[Node] = [mm]
    attrs: dict[str, float | int] = {"scale": 1.0, "divide": 0}
    biases: list[Value] = []
    cur: Value | None = s
    c = rw.single_use(cur)
    if c is not None and is_std(c, "Mul", "Div") and len(c.inputs) == 2:
        k_in = c.inputs[1] if c.inputs[0] is cur else c.inputs[0] if c.op_type == "Mul" else None
        k = _scalar(rw, k_in)
        if k is None or k == 0.0 or k_in is None or k_in is cur or (k_in.fact.ndim or 0) > rank:
            return
        attrs = {"scale": k, "divide": int(c.op_type == "Div")}
        nodes.append(c)
        cur = c.outputs[0]
        c = rw.single_use(cur)
    # Up to two additions (a position bias, then a padding mask), each of rank <= the scores'
    # (a bias that widens the batch broadcasts in the kernel as in the Add).
    while c is not None and is_add(c) and len(biases) < 2 and cur is not None:
        other = other_input(c, cur)
        ro = _f32_rank(other)
        if other is None or ro is None or ro > rank or _f32_rank(c.outputs[0]) != rank:
            return
        biases.append(other)
        nodes.append(c)
        cur = c.outputs[0]
        c = rw.single_use(cur)
    if c is None or not _last_axis_softmax(c):
        return
    nodes.append(c)
    p = c.outputs[0]
    mm2 = rw.single_use(p)
    if mm2 is not None and _noop_cast(mm2):
        nodes.append(mm2)
        p = mm2.outputs[0]
        mm2 = rw.single_use(p)
    if mm2 is None or not is_std(mm2, "MatMul") or mm2.inputs[0] is not p or mm2.inputs[1] is p:
        return
    v = mm2.inputs[1]
    rv = _f32_rank(v)
    if v is None or rv is None or rv < 2:
        return
    nodes.append(mm2)
    if any(id(n) in rw.removed for n in nodes):
        return
    fuse(rw, res, "SoftmaxAttention", nodes, [q, kt, v, *biases], attrs, _TYPES)


def attention_fusion(rw: Rewriter) -> PassResult:
    """MatMul -> [scalar Mul/Div] -> [Add] [Add] -> Softmax(last axis) -> [Cast] -> MatMul ->
    SoftmaxAttention."""
    res = PassResult()
    for node in list(rw.graph.nodes):
        if id(node) in rw.removed or node.opdef is None or not is_std(node, "MatMul"):
            continue
        _fuse_at(rw, res, node)
    return res
