"""Where OpenVINO's CPU plugin computes otherwise than ONNX (and opwarden's contracts) says.

Found by `opwarden check --device openvino` and confirmed one node at a time (OpenVINO
2025.x, CPU plugin, f32 hint):

- float64 is computed in float32 (0.1 + 0.2 gives 0.30000001): a silent precision degrade.
- NumPy bfloat16 arrays (ml_dtypes) cross the boundary as float16.
- int64 is computed in int32 (2**40 + 1 gives 1). A region may still carry int64 (shapes,
  indices, token ids are small): constants must fit int32 (checked here) and the region checks
  its int64 feeds per call, running on the host when one does not fit (region.py). Slice's
  starts/ends beyond int32 ("to the end") are clamped by OpenVINO, which keeps their meaning.
- 8-bit integer arithmetic saturates (int8 127 + 127 gives 127); ONNX wraps.
- signed integer Div rounds toward -inf (-3 / 2 gives -2); ONNX truncates toward zero.
- some operators yield fewer outputs than asked (LayerNormalization's Mean and InvStdDev):
  convert.refusal compares the converted model's outputs with the node's.
- LayerNormalization over more than 2**16 elements drifts (its float32 variance).
- an empty tensor (a zero dimension) comes back with the wrong shape.
- Some operators lose NaN (`NAN_LOST`): their contract propagates it. Inside a region they still
  run on OpenVINO (the zoo's ReLUs would otherwise split every region), and explain says so
  for each such node; their single-node variants are declared unsupported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Boundary dtypes: what OpenVINO computes in as ONNX does (int64: see the module docstring).
DTYPES = frozenset({"float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"})
_INT32 = (-(1 << 31), (1 << 31) - 1)
_SATURATING = frozenset({"int8", "uint8"})
_ARITH = frozenset({"Add", "Sub", "Mul", "Neg", "Abs", "Sum", "Pow", "Mod", "Div"})
_NORM_MAX = 1 << 16
_SIGNED = frozenset({"int8", "int16", "int32", "int64"})
_FLOORING = frozenset({"Div"})
NAN_LOST = {
    "Relu": "maps NaN to 0", "Max": "drops NaN", "Min": "drops NaN", "MaxPool": "drops NaN",
    "GlobalMaxPool": "drops NaN", "ReduceMax": "drops NaN", "ReduceMin": "drops NaN",
    "HardSigmoid": "maps NaN to 1", "Exp": "maps NaN to Inf",
    "Clip": "maps NaN to its min",
    "Softmax": "puts NaN elsewhere than the reference (opset 13, one axis)",
}


def dtype_refusal(name: str, dtype: Any) -> str | None:
    """Why a tensor of `dtype` cannot cross into OpenVINO, or None."""
    if dtype in DTYPES:
        return None
    if dtype == "float64":
        why = "OpenVINO's CPU plugin computes float64 in float32"
    elif dtype == "bfloat16":
        why = "NumPy bfloat16 arrays reach OpenVINO as float16"
    else:
        why = "openvino takes " + ", ".join(sorted(DTYPES))
    return f"value {name!r} is {dtype}: {why}"


def node_refusal(node: Any) -> str | None:
    """A measured deviation that keeps `node` off OpenVINO (dtypes, empty tensors, saturating
    arithmetic, int64 constants beyond int32), or None."""
    clamped = {id(v) for v in node.inputs[1:3] if v is not None} if node.op_type == "Slice" \
        else set()  # starts/ends beyond int32 mean "to the end": clamping keeps that meaning
    for v in list(node.inputs) + list(node.outputs):
        if v is None:
            continue
        why = dtype_refusal(v.name, v.fact.dtype)
        if why:
            return why
        if v.fact.shape is not None and any(d == 0 for d in v.fact.shape):
            return f"value {v.name!r} is empty {list(v.fact.shape)}: OpenVINO mis-shapes " \
                   "empty tensors"
        if v.fact.dtype == "int64" and v.const is not None and v.const.size \
                and id(v) not in clamped:
            c = np.asarray(v.const)
            if int(c.min()) < _INT32[0] or int(c.max()) > _INT32[1]:
                return f"constant {v.name!r} holds int64 values beyond int32, which " \
                       "OpenVINO's CPU plugin computes int64 in"
    x = node.inputs[0] if node.inputs else None
    long = _long_norm(node.op_type, x.fact.shape if x is not None else None, node.attrs)
    if long:
        return long
    outs = [v.fact.dtype for v in node.outputs if v is not None]
    if node.op_type in _ARITH and any(d in _SATURATING for d in outs):
        return f"{node.op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
    if node.op_type in _FLOORING and any(d in _SIGNED for d in outs):
        return f"integer {node.op_type}: OpenVINO rounds toward -inf, ONNX toward zero"
    return None


def _long_norm(op_type: str, shape: Any, attrs: dict[str, Any]) -> str | None:
    """LayerNormalization over more than `_NORM_MAX` elements: OpenVINO's float32 variance
    drifts past the tolerance there (2e-4 relative over 2**20 elements)."""
    if op_type != "LayerNormalization" or shape is None or not shape:
        return None
    axis = int(attrs.get("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    dims = shape[axis:]
    if any(not isinstance(d, int) for d in dims) or int(np.prod(dims)) <= _NORM_MAX:
        return None
    return f"LayerNormalization over {int(np.prod(dims))} elements: OpenVINO's float32 " \
           f"variance drifts past the tolerance beyond {_NORM_MAX}"


def variant_refusal(op_type: str, dtypes: list[Any], shapes: list[Any],
                    attrs: dict[str, Any] | None = None) -> str | None:
    """Why a single-node variant is declared unsupported for these input facts, or None."""
    if shapes and _long_norm(op_type, shapes[0], attrs or {}):
        return _long_norm(op_type, shapes[0], attrs or {})
    if op_type in NAN_LOST:
        return f"OpenVINO's {op_type} {NAN_LOST[op_type]}; its contract propagates NaN"
    for i, dt in enumerate(dtypes):
        if dt is None:
            continue
        why = dtype_refusal(f"x{i}", dt)
        if why:
            return why
        if dt == "int64" and not _embedded(i, shapes[i] if i < len(shapes) else None):
            return "int64 data: OpenVINO's CPU plugin computes it in int32"
        if dt in _SATURATING and op_type in _ARITH:
            return f"{op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
        if dt in _SIGNED and op_type in _FLOORING:
            return f"integer {op_type}: OpenVINO rounds toward -inf, ONNX toward zero"
    for s in shapes:
        if s is not None and any(d == 0 for d in s):
            return "an empty tensor: OpenVINO mis-shapes it"
    return None


def _embedded(i: int, shape: Any) -> bool:
    """Whether a single-node variant's int64 input is a parameter it embeds as a constant
    (shape, axes, pads: not its first input, at most 64 elements; provider._MAX_EMBED)."""
    if i == 0 or shape is None or any(not isinstance(d, int) for d in shape):
        return False
    return int(np.prod(shape, dtype=np.int64)) <= 64


def nan_note(op_type: str) -> str | None:
    """explain's note on a node in a region whose OpenVINO kernel loses NaN, or None."""
    why = NAN_LOST.get(op_type)
    return None if why is None else f"OpenVINO's {op_type} {why} (its contract propagates NaN)"


def int32_safe(a: np.ndarray) -> bool:
    """Whether an int64 array's values survive OpenVINO's int32 computation."""
    if not a.size:
        return True
    return _INT32[0] <= int(a.min()) and int(a.max()) <= _INT32[1]
