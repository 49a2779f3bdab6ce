"""QDQ fusion: DequantizeLinear -> Conv / MatMul / Gemm -> QuantizeLinear groups become the
integer operators ONNX Runtime's CPU optimizer makes of them (its QDQSelectorActionTransformer),
so that they run as integer GEMMs with one requantization, as there.

- Conv whose input and constant weight come through DequantizeLinear (a bias, if any, through
  one of an int32 constant) and whose output goes only into a QuantizeLinear -> QLinearConv.
- MatMul of two dequantized inputs into a QuantizeLinear -> QLinearMatMul.
- Gemm of dequantized A and B (a bias, if any, dequantized int32; beta 1), with or without
  the QuantizeLinear -> com.microsoft QGemm (float output without it).
- Add of two dequantized 8-bit inputs of one type, per tensor, into a QuantizeLinear of that
  type -> com.microsoft QLinearAdd.
- MaxPool between a DequantizeLinear and a QuantizeLinear of the same per-tensor parameters
  -> MaxPool on the 8-bit tensor (exact: see _maxpool).

ORT's conditions are kept, since the fused operators round differently from the float chain
(one requantization of the exact integer sum instead of a float convolution rounded by the
QuantizeLinear), except for int8 activations: uint8 always; int8 too where our integer GEMM
runs on VNNI (_activation_types), where ORT 1.32 fuses some int8 groups but not every one,
so int8 answers agree with ORT's within the quantized tolerance, not always bit for bit (it
fuses none on AVX2; Gemm also takes int8 with an int8 B); the output type is the
activation's; scales and zero points are constants, per tensor except the weight's, which may
be per output channel (axis 0 of a Conv weight, the column axis of a MatMul / Gemm B); no
16-bit or 4-bit types; an intermediate output is read by the QuantizeLinear alone and is no
graph output. A Relu or Clip between the operator and the QuantizeLinear is dropped when the
quantization alone saturates to the same values (Relu: zero point at the type's minimum;
Clip: bounds outside the quantized range), as ORT drops it.

It runs at level 1, before constant folding would turn the weights' DequantizeLinear into
float constants (ORT runs it at its level 2; the result is ORT's at either level within the
quantized tolerance, exactly so where ORT fuses). A DequantizeLinear read by other nodes too
stays for them.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx

from opwarden.ir.graph import Node, Value
from opwarden.ops.cast import int_range
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.match import CONV_ATTRS, is_std
from opwarden.passes.rewrite import PassResult, Rewriter, part_name

MS = "com.microsoft"
_8BIT = ("uint8", "int8")


@functools.cache
def _activation_types() -> tuple[str, ...]:
    """The activation types fused here: int8 as well where the compiled integer GEMM runs
    (AVX512-VNNI or AVX2: its signed inputs are shifted to unsigned exactly); ORT fuses some
    of them on VNNI."""
    from opwarden.kernels.cpu.quant_native import FAST_ISAS, isa

    return _8BIT if isa() in FAST_ISAS else ("uint8",)


class _DQ:
    """A live DequantizeLinear producing a value: its node and (x, scale, zero point)."""

    def __init__(self, node: Node, x: Value, scale: Value | None, zp: Value | None, axis: int,
                 scale_arr: np.ndarray, zp_arr: np.ndarray | None) -> None:
        self.node, self.x, self.scale, self.zp, self.axis = node, x, scale, zp, axis
        self.scale_arr, self.zp_arr = scale_arr, zp_arr

    @property
    def dtype(self) -> str | None:
        """The quantized input's type."""
        return self.x.fact.dtype

    @property
    def per_tensor(self) -> bool:
        """Scale and zero point are single values."""
        return self.scale_arr.size == 1 and self.scale_arr.ndim <= 1 and (
            self.zp_arr is None or self.zp_arr.size == 1)


def _dq(rw: Rewriter, v: Value | None) -> _DQ | None:
    """The DequantizeLinear writing v, if its scale and zero point are constants and it is not
    blocked."""
    node = None if v is None else v.producer
    if (node is None or not is_std(node, "DequantizeLinear") or id(node) in rw.removed
            or node.graph is not rw.graph or node.opdef is None):
        return None
    kw = kernel_kwargs(node)
    if int(kw.get("block_size", 0) or 0) or int(kw.get("output_dtype", 0) or 0) not in (0, 1):
        return None
    x, scale = node.inputs[0], node.inputs[1]
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    s = rw.const(scale)
    z = None if zp is None else rw.const(zp)
    if x is None or s is None or s.dtype != np.float32 or (zp is not None and z is None):
        return None
    return _DQ(node, x, scale, zp, int(kw.get("axis", 1)), s, z)


def _q_after(rw: Rewriter, y: Value | None, out_type: str | None
             ) -> tuple[list[Node], Node] | None:
    """([redundant Relu/Clip], QuantizeLinear) reading y alone, per tensor, writing out_type."""
    if y is None:
        return None
    c = rw.single_use(y)
    act: list[Node] = []
    if c is not None and (is_std(c, "Relu") or is_std(c, "Clip")) and c.inputs[0] is y:
        if c.outputs[0] is None:
            return None
        act, c = [c], rw.single_use(c.outputs[0])
    if c is None or not is_std(c, "QuantizeLinear") or c.inputs[0] is not (
            act[0].outputs[0] if act else y) or c.opdef is None:
        return None
    kw = kernel_kwargs(c)
    if int(kw.get("block_size", 0) or 0) or int(kw.get("precision", 0) or 0) not in (0, 1):
        return None
    s = rw.const(c.inputs[1])
    zv = c.inputs[2] if len(c.inputs) > 2 else None
    z = None if zv is None else rw.const(zv)
    q_out = c.outputs[0]
    if s is None or s.size != 1 or s.dtype != np.float32 or zv is None or z is None \
            or z.size != 1 or q_out is None or q_out.fact.dtype != out_type:
        return None
    if act and not _redundant(rw, act[0], float(s.reshape(-1)[0]), int(z.reshape(-1)[0]),
                              z.dtype):
        return None
    return act, c


def _redundant(rw: Rewriter, act: Node, scale: float, zp: int, dtype) -> bool:
    """The quantization alone already saturates where the Relu/Clip `act` would cut."""
    lo, hi = int_range(dtype)
    if act.op_type == "Relu":
        return zp == lo
    if act.opdef is None:
        return False
    if act.opdef.since < 11:
        kw = kernel_kwargs(act)
        bounds = [float(kw.get("min", -np.inf)), float(kw.get("max", np.inf))]
    else:
        bounds = []
        for i, default in ((1, -np.inf), (2, np.inf)):
            v = act.inputs[i] if len(act.inputs) > i else None
            k = None if v is None else rw.const(v)
            if v is not None and (k is None or k.size != 1):
                return False
            bounds.append(default if k is None else float(k.reshape(-1)[0]))
    with np.errstate(all="ignore"):
        qmin = np.rint(np.float32(bounds[0]) / np.float32(scale)) + zp
        qmax = np.rint(np.float32(bounds[1]) / np.float32(scale)) + zp
    return bool(qmin <= lo and qmax >= hi)


def _bias_dq(rw: Rewriter, node: Node, i: int) -> tuple[bool, Value | None, _DQ | None]:
    """(fusable, the int32 bias value, its DequantizeLinear) for optional input i."""
    v = node.inputs[i] if len(node.inputs) > i else None
    if v is None:
        return True, None, None
    d = _dq(rw, v)
    if d is None or d.dtype != "int32" or rw.const(d.x) is None:
        return False, None, None
    return True, d.x, d


def _fuse(rw: Rewriter, res: PassResult, op_type: str, node: Node, dqs: list[_DQ | None],
          tail: list[Node], inputs: list, attrs: dict, types: dict, domain: str) -> None:
    """Replace node (+ tail: Relu/Clip, QuantizeLinear) by one op_type node; the
    DequantizeLinear nodes read only by `node` go too."""
    sole = []
    for d in dqs:
        dout = None if d is None else d.node.outputs[0]
        if d is not None and dout is not None and d.node not in sole and \
                id(dout) not in rw.outputs and all(n is node for n, _ in dout.uses):
            sole.append(d.node)
    parts = [node, *sole, *tail]  # named "conv+N_more+q": the operator first
    last = tail[-1] if tail else node
    out = last.outputs[0]
    assert out is not None  # the pass only starts from nodes with an output
    rw.remove_all(parts)
    if domain == MS:
        rw.model.opsets.setdefault(MS, 1)
    fused = rw.make_node(op_type, inputs, [out], attrs, name=part_name(parts), parts=parts,
                         domain=domain, opset=rw.model.opsets.get(domain, 1),
                         attr_types=types)
    rw.place(fused, last)
    res.details[op_type] += 1
    res.changes += len(parts) - 1


def _conv(rw: Rewriter, res: PassResult, node: Node) -> None:
    dx, dw = _dq(rw, node.inputs[0]), _dq(rw, node.inputs[1])
    if dx is None or dw is None or dx.dtype not in _activation_types() or dw.dtype not in _8BIT:
        return
    if rw.const(dw.x) is None or not dx.per_tensor or (not dw.per_tensor and dw.axis != 0):
        return
    ok, bias, db = _bias_dq(rw, node, 2)
    q = _q_after(rw, node.outputs[0], dx.dtype) if ok else None
    if q is None:
        return
    act, qn = q
    attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}
    types = {k: t for k, t in getattr(node, "attr_types", {}).items() if k in attrs}
    ins = [dx.x, dx.scale, dx.zp, dw.x, dw.scale, dw.zp, qn.inputs[1], qn.inputs[2]]
    if None in ins:
        return
    _fuse(rw, res, "QLinearConv", node, [dx, dw, db], [*act, qn],
          ins + ([bias] if bias is not None else []), attrs, types, "")


def _col_axis_ok(d: _DQ, axis: int) -> bool:
    """B's scale is per tensor, or per column along `axis` of a 2-D B."""
    if d.per_tensor:
        return True
    nd = d.x.fact.ndim
    return nd == 2 and d.axis % 2 == axis


def _matmul(rw: Rewriter, res: PassResult, node: Node) -> None:
    da, db = _dq(rw, node.inputs[0]), _dq(rw, node.inputs[1])
    if da is None or db is None or da.dtype not in _activation_types() or db.dtype not in _8BIT:
        return
    if not da.per_tensor or not _col_axis_ok(db, 1):
        return
    q = _q_after(rw, node.outputs[0], da.dtype)
    if q is None:
        return
    act, qn = q
    ins = [da.x, da.scale, da.zp, db.x, db.scale, db.zp, qn.inputs[1], qn.inputs[2]]
    if None in ins:
        return
    _fuse(rw, res, "QLinearMatMul", node, [da, db], [*act, qn], ins, {}, {}, "")


def _gemm(rw: Rewriter, res: PassResult, node: Node) -> None:
    da, db = _dq(rw, node.inputs[0]), _dq(rw, node.inputs[1])
    if da is None or db is None or da.dtype not in _8BIT or db.dtype not in _8BIT:
        return
    if (da.dtype == "int8" and db.dtype != "int8") or da.zp is None or db.zp is None:
        return
    kw = kernel_kwargs(node)
    trans_b = int(kw.get("transB", 0))
    if not da.per_tensor or not _col_axis_ok(db, 0 if trans_b else 1):
        return
    ok, bias, dc = _bias_dq(rw, node, 2)
    if not ok or (bias is not None and float(kw.get("beta", 1.0)) != 1.0):
        return
    y = node.outputs[0]
    if y is None:
        return
    c = rw.single_use(y)
    tail: list[Node] = []
    ys: list[Value | None] = []
    clip = c is not None and is_std(c, "Relu", "Clip") and rw.single_use(c.outputs[0]) is not None
    if clip or any(is_std(n, "QuantizeLinear") for n, _ in y.uses):
        # ORT's group then needs the QuantizeLinear as the only reader (through a redundant
        # Relu/Clip); it fuses a float-output QGemm only where no QuantizeLinear reads y.
        q = _q_after(rw, y, da.dtype)
        if q is None:
            return
        tail = [*q[0], q[1]]
        ys = [q[1].inputs[1], q[1].inputs[2]]
    elif y.fact.dtype != "float32":
        return
    attrs = {"alpha": float(kw.get("alpha", 1.0)), "transA": int(kw.get("transA", 0)),
             "transB": trans_b}
    types = {"alpha": onnx.AttributeProto.FLOAT, "transA": onnx.AttributeProto.INT,
             "transB": onnx.AttributeProto.INT}
    ins = [da.x, da.scale, da.zp, db.x, db.scale, db.zp, bias, *ys]
    _fuse(rw, res, "QGemm", node, [da, db, dc], tail, ins, attrs, types, MS)


def _add(rw: Rewriter, res: PassResult, node: Node) -> None:
    """DequantizeLinear A, B (one 8-bit type, per tensor) -> Add [-> redundant Relu/Clip] ->
    QuantizeLinear (that type) -> com.microsoft QLinearAdd, as ORT's binary-op selector fuses
    it (int8 only where _activation_types allows it; QLinearAdd rounds once where the chain
    rounded in float)."""
    if len(node.inputs) != 2:
        return
    da, db = _dq(rw, node.inputs[0]), _dq(rw, node.inputs[1])
    if da is None or db is None or da.dtype not in _activation_types() or db.dtype != da.dtype:
        return
    if not da.per_tensor or not db.per_tensor or da.x is db.x:
        return
    q = _q_after(rw, node.outputs[0], da.dtype)
    if q is None:
        return
    act, qn = q
    ins = [da.x, da.scale, da.zp, db.x, db.scale, db.zp, qn.inputs[1], qn.inputs[2]]
    _fuse(rw, res, "QLinearAdd", node, [da, db], [*act, qn], ins, {}, {}, MS)


def _maxpool(rw: Rewriter, res: PassResult, node: Node) -> None:
    """DequantizeLinear -> MaxPool -> QuantizeLinear with one per-tensor scale (> 0) and zero
    point on both sides -> MaxPool on the 8-bit input, as ORT's QDQ selectors drop the pair:
    the maximum commutes with the increasing affine map, and quantizing a dequantized integer
    with the same parameters gives it back, so the result is the chain's exactly."""
    if node.opdef.since < 12 or len(node.outputs) > 1 and node.outputs[1] is not None:
        return  # (8-bit MaxPool from opset 12; an Indices output reads positions, not values)
    d = _dq(rw, node.inputs[0])
    if d is None or d.dtype not in _8BIT or not d.per_tensor or d.zp_arr is None:
        return
    q = _q_after(rw, node.outputs[0], d.dtype)
    if q is None or q[0]:
        return
    qn = q[1]
    s, z = rw.const(qn.inputs[1]), rw.const(qn.inputs[2])
    scale = float(d.scale_arr.reshape(-1)[0])
    if not (scale > 0 and float(s.reshape(-1)[0]) == scale
            and int(z.reshape(-1)[0]) == int(d.zp_arr.reshape(-1)[0])):
        return
    _fuse(rw, res, "MaxPool", node, [d], [qn], [d.x], dict(node.attrs),
          dict(getattr(node, "attr_types", {}) or {}), node.domain)


def qdq_fusion(rw: Rewriter) -> PassResult:
    """DequantizeLinear -> Conv/MatMul/Gemm -> QuantizeLinear as QLinearConv, QLinearMatMul,
    QGemm (see the module docstring for when)."""
    res = PassResult()
    for node in list(rw.graph.nodes):
        if id(node) in rw.removed or node.opdef is None or not node.outputs:
            continue
        if node.outputs[0] is None:
            continue
        if is_std(node, "Conv"):
            _conv(rw, res, node)
        elif is_std(node, "MatMul"):
            _matmul(rw, res, node)
        elif is_std(node, "Gemm") and node.opdef.since >= 7:
            _gemm(rw, res, node)
        elif is_std(node, "Add") and node.opdef.since >= 7:
            _add(rw, res, node)
        elif is_std(node, "MaxPool"):
            _maxpool(rw, res, node)
    return res
