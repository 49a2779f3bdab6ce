"""Operators: constant-making family (Constant, ConstantOfShape, EyeLike, Range)."""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from opwarden.contract import Contract
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import ints, one_value

# ---------------------------------------------------------------------------------------------
# Constants


@op("ConstantOfShape", since=9)
def ConstantOfShape(input, *, value=None):
    """A tensor of shape `input` filled with `value`'s one element, default float32 0
    (ONNX ConstantOfShape-9..)."""
    dims = ints(input, "input")
    if any(d < 0 for d in dims):
        raise KernelError(f"ConstantOfShape: shape {dims} has a negative dimension")
    if value is None:
        return np.zeros(dims, dtype=np.float32)
    v = np.asarray(value)
    if v.size != 1:
        raise KernelError(f"ConstantOfShape: value must hold one element, got shape {v.shape}")
    return np.full(dims, v.reshape(-1)[0], dtype=v.dtype)


def _dense_from_sparse(sp) -> np.ndarray:
    """Densify a SparseTensorProto (indices linear [NNZ] or coordinates [NNZ, rank])."""
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices).astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    out = np.zeros(math.prod(dims), dtype=values.dtype)
    if indices.ndim == 2:
        flat = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices[:, 0]
    else:
        flat = indices
    out[flat] = values.reshape(-1)
    return out.reshape(dims)


@op("Constant", since=1)
def Constant(
    *,
    value=None,
    sparse_value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
):
    """The tensor given by whichever `value*` attribute is set (ONNX Constant-1..)."""
    given = {
        k: v
        for k, v in {
            "value": value,
            "sparse_value": sparse_value,
            "value_float": value_float,
            "value_floats": value_floats,
            "value_int": value_int,
            "value_ints": value_ints,
            "value_string": value_string,
            "value_strings": value_strings,
        }.items()
        if v is not None
    }
    if len(given) != 1:
        raise KernelError(f"Constant: exactly one value attribute must be set, got {sorted(given)}")
    name, v = next(iter(given.items()))
    if name == "value":
        return np.array(v)
    if name == "sparse_value":
        return _dense_from_sparse(v)
    if name in ("value_float", "value_floats"):
        return np.asarray(v, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.asarray(v, dtype=np.int64)
    # Strings: object arrays of Python str.
    if name == "value_string":
        out = np.empty((), dtype=object)
        out[()] = v
        return out
    return np.array(list(v), dtype=object).reshape(len(v))


@op("EyeLike", since=9, contract=Contract(nan="suppress"))
def EyeLike(input, *, dtype=None, k=0):
    """A 2-D tensor shaped like input with ones on diagonal `k` (ONNX EyeLike-9/22)."""
    if input.ndim != 2:
        raise KernelError(f"EyeLike: input must be 2-D, got shape {input.shape}")
    dt = input.dtype if dtype is None else np_dtype(dtype)
    return np.eye(input.shape[0], input.shape[1], k=k, dtype=dt)


def _range(start, limit, delta) -> np.ndarray:
    dt = np.asarray(start).dtype
    s, lim, d = (one_value(v, n) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if d == 0:
        raise KernelError("Range: delta must not be zero")
    if dt.kind in "iu":
        s, lim, d = int(s), int(lim), int(d)
        n = max(-((s - lim) // d), 0)  # ceil((lim - s) / d) in exact integer arithmetic
        return (s + d * np.arange(n, dtype=np.int64)).astype(dt)
    n = max(math.ceil((float(lim) - float(s)) / float(d)), 0)
    # start + i * delta in the input's own precision.
    return (np.asarray(s, dtype=dt) + np.arange(n).astype(dt) * np.asarray(d, dtype=dt)).astype(dt)


@op("Range", since=11, contract=Contract())
def Range_11(start, limit, delta):
    """start, start+delta, ... up to limit exclusive (ONNX Range-11)."""
    return _range(start, limit, delta)


@op("Range", since=27, contract=Contract())
def Range(start, limit, delta, *, stash_type=1):
    """Range; float16/bfloat16 computed in float32 when stash_type=1 (ONNX Range-27)."""
    dt = np.asarray(start).dtype
    if stash_type == 1 and dt in (np.dtype(np.float16), np_dtype(16)):
        f32 = [np.asarray(v).astype(np.float32) for v in (start, limit, delta)]
        return _range(*f32).astype(dt)
    return _range(start, limit, delta)
