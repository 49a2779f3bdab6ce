"""ONNX element types <-> NumPy dtypes (ml_dtypes provides bfloat16, float8, int4, float4)."""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers the extra dtypes with NumPy)
import numpy as np
from onnx import TensorProto, helper

STRING = np.dtype(object)

_ONNX_TO_NP: dict[int, np.dtype] = {}
for _name, _code in TensorProto.DataType.items():
    if _code == TensorProto.UNDEFINED:
        continue
    try:
        _ONNX_TO_NP[_code] = np.dtype(helper.tensor_dtype_to_np_dtype(_code))
    except (KeyError, TypeError, ValueError):
        pass
_ONNX_TO_NP[TensorProto.STRING] = STRING

# NumPy dtype -> ONNX code. Several ONNX types can share a NumPy dtype; the first wins.
_NP_TO_ONNX: dict[np.dtype, int] = {}
for _code, _dt in sorted(_ONNX_TO_NP.items()):
    _NP_TO_ONNX.setdefault(_dt, _code)

# ONNX type strings as the schemas spell them ("tensor(float)") -> NumPy dtype.
_TYPESTR: dict[str, int] = {
    "float": TensorProto.FLOAT, "double": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16, "int8": TensorProto.INT8, "int16": TensorProto.INT16,
    "int32": TensorProto.INT32, "int64": TensorProto.INT64, "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16, "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL, "string": TensorProto.STRING, "complex64": TensorProto.COMPLEX64,
    "complex128": TensorProto.COMPLEX128, "float8e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ, "float8e5m2": TensorProto.FLOAT8E5M2,
    "float8e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ, "uint4": TensorProto.UINT4,
    "int4": TensorProto.INT4, "float4e2m1": TensorProto.FLOAT4E2M1,
}
for _extra in ("FLOAT8E8M0", "INT2", "UINT2"):
    if hasattr(TensorProto, _extra):
        _TYPESTR[_extra.lower()] = getattr(TensorProto, _extra)

FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
INTS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
NUMERIC = FLOATS | INTS


def np_dtype(elem_type: int) -> np.dtype:
    """NumPy dtype for an ONNX TensorProto element type code."""
    try:
        return _ONNX_TO_NP[elem_type]
    except KeyError:
        raise KeyError(f"unknown ONNX element type {elem_type}") from None


def onnx_type(dtype) -> int:
    """ONNX TensorProto element type code for a NumPy dtype."""
    dt = np.dtype(dtype)
    if dt.kind in "USO":
        return TensorProto.STRING
    return _NP_TO_ONNX[dt]


def onnx_type_name(elem_type: int) -> str:
    """'float', 'int64', ... as ONNX type strings spell them."""
    for name, code in _TYPESTR.items():
        if code == elem_type:
            return name
    return TensorProto.DataType.Name(elem_type).lower()


def dtype_name(dtype) -> str:
    """Short name of a NumPy dtype ('float32', 'bfloat16', 'string')."""
    dt = np.dtype(dtype)
    return "string" if dt.kind in "USO" else dt.name


def typestr_to_dtype_name(type_str: str) -> str | None:
    """'tensor(float)' -> 'float32'; None for non-tensor types (sequences, optionals, maps)."""
    if not type_str.startswith("tensor(") or not type_str.endswith(")"):
        return None
    code = _TYPESTR.get(type_str[7:-1])
    if code is None:
        return None
    return dtype_name(_ONNX_TO_NP[code]) if code in _ONNX_TO_NP else None


_BY_NAME: dict[str, np.dtype] = {}
for _dt in _ONNX_TO_NP.values():
    _BY_NAME.setdefault(dtype_name(_dt), _dt)


def np_dtype_of(name: str) -> np.dtype:
    """NumPy dtype for a dtype name as facts spell it ('float32', 'bfloat16', 'string')."""
    return _BY_NAME[name]
