"""Where OpenVINO's CPU plugin computes otherwise than ONNX (and opwarden's contracts) says.

Found by `opwarden check --device openvino` and confirmed one node at a time (OpenVINO
2025.x, CPU plugin, f32 hint):

- float64 is computed in float32 (0.1 + 0.2 gives 0.30000001): a silent precision degrade.
- NumPy bfloat16 arrays (ml_dtypes) cross the boundary as float16.
- int64 is computed in int32 (2**40 + 1 gives 1). A region may still carry int64 (shapes,
  indices, token ids are small): constants must fit int32 (checked here) and the region checks
  its int64 feeds per call, running on the host when one does not fit (region.py).
- 8-bit integer arithmetic saturates (int8 127 + 127 gives 127); ONNX wraps.
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
NAN_LOST = {
    "Relu": "maps NaN to 0", "Max": "drops NaN", "Min": "drops NaN", "MaxPool": "drops NaN",
    "GlobalMaxPool": "drops NaN", "ReduceMax": "drops NaN", "ReduceMin": "drops NaN",
    "HardSigmoid": "maps NaN to 1", "Exp": "maps NaN to Inf",
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
    for v in list(node.inputs) + list(node.outputs):
        if v is None:
            continue
        why = dtype_refusal(v.name, v.fact.dtype)
        if why:
            return why
        if v.fact.shape is not None and any(d == 0 for d in v.fact.shape):
            return f"value {v.name!r} is empty {list(v.fact.shape)}: OpenVINO mis-shapes " \
                   "empty tensors"
        if v.fact.dtype == "int64" and v.const is not None and v.const.size:
            c = np.asarray(v.const)
            if int(c.min()) < _INT32[0] or int(c.max()) > _INT32[1]:
                return f"constant {v.name!r} holds int64 values beyond int32, which " \
                       "OpenVINO's CPU plugin computes int64 in"
    if node.op_type in _ARITH and any(v is not None and v.fact.dtype in _SATURATING
                                      for v in node.outputs):
        return f"{node.op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
    return None


def variant_refusal(op_type: str, dtypes: list[Any], shapes: list[Any]) -> str | None:
    """Why a single-node variant is declared unsupported for these input facts, or None."""
    if op_type in NAN_LOST:
        return f"OpenVINO's {op_type} {NAN_LOST[op_type]}; its contract propagates NaN"
    for i, dt in enumerate(dtypes):
        if dt is None:
            continue
        why = dtype_refusal(f"x{i}", dt)
        if why:
            return why
        if dt == "int64":
            return "int64: OpenVINO's CPU plugin computes it in int32"
        if dt in _SATURATING and op_type in _ARITH:
            return f"{op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
    for s in shapes:
        if s is not None and any(d == 0 for d in s):
            return "an empty tensor: OpenVINO mis-shapes it"
    return None


def nan_note(op_type: str) -> str | None:
    """explain's note on a node in a region whose OpenVINO kernel loses NaN, or None."""
    why = NAN_LOST.get(op_type)
    return None if why is None else f"OpenVINO's {op_type} {why} (its contract propagates NaN)"


def int32_safe(a: np.ndarray) -> bool:
    """Whether an int64 array's values survive OpenVINO's int32 computation."""
    if not a.size:
        return True
    return _INT32[0] <= int(a.min()) and int(a.max()) <= _INT32[1]
