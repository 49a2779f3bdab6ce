"""Operators: cast family (Cast, CastLike, BitCast).

`cast_array` holds the conversion rules of the ONNX Cast spec and is shared with quant.py:
numeric <-> numeric (C-like truncation/wrapping for integers, RNE for floats), float8 with the
`saturate` table, float8e8m0 with `round_mode`, the sub-byte integers (wrap to their width),
and string parsing/formatting ("NaN", "INF", "-INF").
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
from onnx import TensorProto

from opwarden.contract import Contract, one_of, such_that
from opwarden.dtypes import STRING, np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.grad import away_from_zero, differentiable, fit

_F8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
# ml_dtypes floats other than e8m0 (which has no sign and no mantissa and is handled apart).
_ML_FLOATS = _F8 | frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.float6_e2m3fn,
        ml_dtypes.float6_e3m2fn,
    )
)
# Sub-byte integers: dtype -> (bits, signed).
_SMALL_INTS = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (2, True),
    np.dtype(ml_dtypes.uint2): (2, False),
}
_STD_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))

_VALID_TO = frozenset(
    code
    for code in TensorProto.DataType.values()
    if code not in (TensorProto.UNDEFINED, TensorProto.COMPLEX64, TensorProto.COMPLEX128)
)
ROUND_MODES = ("up", "down", "nearest")


def is_small_int(dtype) -> bool:
    """True for int4/uint4/int2/uint2."""
    return np.dtype(dtype) in _SMALL_INTS


def int_range(dtype) -> tuple[int, int]:
    """(min, max) of an integer dtype, sub-byte ones included."""
    dt = np.dtype(dtype)
    if dt in _SMALL_INTS:
        bits, signed = _SMALL_INTS[dt]
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def is_exotic_float(dtype) -> bool:
    """True for the ml_dtypes floating types (bfloat16, float8, float4, float6, e8m0)."""
    dt = np.dtype(dtype)
    return dt in _ML_FLOATS or dt == _E8M0


def to_target_dtype(to) -> np.dtype:
    """NumPy dtype for a Cast `to` value: an ONNX code, or a type name (Cast-1 used strings)."""
    if isinstance(to, bytes):
        to = to.decode()
    if isinstance(to, str):
        try:
            to = TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise KernelError(f"Cast: unknown target type name {to!r}") from None
    if to is None:
        raise KernelError("Cast: attribute 'to' is required")
    try:
        return np_dtype(int(to))
    except KeyError:
        raise KernelError(f"Cast: unknown target type code {to}") from None


def _widen(x: np.ndarray) -> np.ndarray:
    """Exotic sources to a standard dtype holding every value exactly (float32 / int8 / uint8)."""
    dt = x.dtype
    if dt in _SMALL_INTS:
        return x.astype(np.int8 if _SMALL_INTS[dt][1] else np.uint8)
    if dt in _ML_FLOATS or dt == _E8M0:
        return x.astype(np.float32)  # every bfloat16/float8/float6/float4/e8m0 fits float32
    return x


def _round_to_grid(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round float64 values to the grid of a narrow float format (RNE), in float64.

    ml_dtypes converts float64 through float32, which can round twice; rounding here first makes
    the final conversion exact (or an overflow handled by the caller's saturation rules).
    """
    info = ml_dtypes.finfo(dtype)
    y = x.copy()
    fin = np.isfinite(x) & (x != 0)
    v = x[fin]
    _, e2 = np.frexp(v)  # v = f * 2**e2, 0.5 <= |f| < 1, so floor(log2|v|) = e2 - 1
    quantum_exp = np.maximum(e2 - 1, info.minexp) - info.nmant
    y[fin] = np.ldexp(np.rint(np.ldexp(v, -quantum_exp)), quantum_exp)
    return y


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float -> float8e8m0 (powers of two 2**-127 .. 2**127, code 0xFF is NaN) (Cast-24)."""
    if round_mode not in ROUND_MODES:
        raise KernelError(f"Cast: round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    a = np.abs(x.astype(np.float64))  # negative inputs are unspecified: use the magnitude
    nan = np.isnan(a)
    inf = np.isinf(a)
    pos = ~nan & ~inf & (a > 0)
    frac, e2 = np.frexp(np.where(pos, a, 1.0))
    m = frac * 2.0  # a = m * 2**k with 1 <= m < 2
    k = e2.astype(np.int64) - 1
    if round_mode == "up":
        k = k + (m > 1.0)
    elif round_mode == "nearest":
        # Nearest power of two (linear midpoint 1.5 * 2**k); ties go to the even code.
        tie_up = (m == 1.5) & ((k + 127) % 2 == 1)
        k = k + ((m > 1.5) | tie_up)
    code = k + 127
    if round_mode == "up":
        code = np.maximum(code, 0)  # tiny positives round up to 2**-127, which is in range
    below = (~pos & ~nan & ~inf) | (pos & (code < 0))  # zero or under 2**-127 after rounding
    above = inf | (pos & (code > 254))
    code = np.clip(code, 0, 254)
    if saturate:
        code = np.where(below, 0, np.where(above, 254, code))
    else:
        code = np.where(below | above, 255, code)
    code = np.where(nan, 255, code)
    return code.astype(np.uint8).view(_E8M0)


def _wrap_int(v: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """Keep the low `bits` bits of int64 values (two's complement when signed)."""
    mask = (1 << bits) - 1
    v = v & mask
    if signed:
        v = np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v


def _float_to_int64(x: np.ndarray) -> np.ndarray:
    """Truncate floats toward zero; NaN/Inf/out-of-range are undefined by the spec (give 0)."""
    ok = np.isfinite(x) & (np.abs(x) < 2.0**63)
    return np.trunc(np.where(ok, x, 0)).astype(np.int64)


def _cast_numeric(x: np.ndarray, dt: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    x = _widen(x)
    src_float = x.dtype.kind == "f"
    if dt == np.bool_:
        return np.asarray(x != 0)
    if dt in _SMALL_INTS:
        bits, signed = _SMALL_INTS[dt]
        v = _float_to_int64(x) if src_float else x.astype(np.int64)
        return _wrap_int(v, bits, signed).astype(dt)
    if dt == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if dt in _ML_FLOATS:
        if x.dtype == np.float64 or (x.dtype.kind in "iu" and x.dtype.itemsize >= 4):
            x = _round_to_grid(x.astype(np.float64), dt)
        elif x.dtype.kind in "iub":
            x = x.astype(np.float32)  # exact for 8/16-bit integers and bool
        if saturate and dt in _F8:
            fmax = float(ml_dtypes.finfo(dt).max)
            x = np.clip(x, -fmax, fmax)  # Inf and [x] > FLT_MAX become +-FLT_MAX; NaN stays
        return x.astype(dt)
    # Standard numeric targets: NumPy's C-style conversions (RNE for floats, inf on float
    # overflow, wrap-around for integer narrowing). Float -> int out of range is undefined.
    if src_float and dt.kind in "iu":
        info = np.iinfo(dt)
        ok = np.isfinite(x) & (x > float(info.min) - 1) & (x < float(info.max) + 1)
        if not ok.all():
            x = np.where(ok, x, 0)
    return x.astype(dt)


def _shortest_text(v) -> str:
    """Shortest round-trip digits of a NumPy float, fixed or scientific, whichever is shorter."""
    fixed = np.format_float_positional(v, unique=True, trim="-")
    sci = np.format_float_scientific(v, unique=True, trim="-", exp_digits=2)
    return sci if len(sci) < len(fixed) else fixed


def _format_float(v, dtype: np.dtype) -> str:
    """Text for one float: shortest round-trip digits (like C++ to_chars), "NaN"/"INF"/"-INF"."""
    f = float(v)
    if np.isnan(f):
        return "NaN"
    if np.isinf(f):
        return "-INF" if f < 0 else "INF"
    if dtype in _STD_FLOATS:
        return _shortest_text(dtype.type(v))
    # ml_dtypes floats embed exactly in float32: print the exact value (448, not "450").
    return _shortest_text(np.float32(f))


def _to_strings(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=STRING)
    flat = out.reshape(-1)
    src = x.reshape(-1)
    if x.dtype == np.bool_:
        flat[:] = ["1" if b else "0" for b in src.tolist()]
    elif x.dtype in _SMALL_INTS or x.dtype.kind in "iu":
        flat[:] = [str(int(v)) for v in _widen(src).tolist()]
    else:
        flat[:] = [_format_float(v, x.dtype) for v in src]
    return out


def _parse_float(s: str) -> float:
    t = s.strip()
    try:
        return float(t)  # accepts "NaN", "INF", "+INF", "-INF" case-insensitively, and 1e-5
    except ValueError:
        raise KernelError(f"Cast: string {s!r} is not a number") from None


def _parse_int(s: str) -> int:
    t = s.strip()
    try:
        return int(t)
    except ValueError:
        f = _parse_float(t)  # "2.7" -> 2 (the spec calls this undefined)
        return int(f) if np.isfinite(f) else 0


def _from_strings(x: np.ndarray, dt: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    items = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1).tolist()]
    if dt == STRING:
        return np.array(items, dtype=STRING).reshape(x.shape)
    if dt == np.bool_:
        vals = []
        for s in items:
            t = s.strip().lower()
            vals.append(t == "true" if t in ("true", "false") else _parse_float(s) != 0)
        return np.array(vals, dtype=np.bool_).reshape(x.shape)
    if dt.kind in "iu" or dt in _SMALL_INTS:
        lo, hi = int_range(dt)
        span = hi - lo + 1
        # Out of range wraps like integer narrowing; exact for the whole int64/uint64 range.
        vals = [(_parse_int(s) - lo) % span + lo for s in items]
        return np.array(vals, dtype=np.int64 if dt in _SMALL_INTS else dt).astype(dt).reshape(
            x.shape
        )
    vals = np.array([_parse_float(s) for s in items], dtype=np.float64).reshape(x.shape)
    return _cast_numeric(vals, dt, saturate, round_mode)


def cast_array(x, dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Convert `x` to `dtype` by the ONNX Cast rules (always returns a new array)."""
    x = np.asarray(x)
    dt = np.dtype(dtype)
    with np.errstate(all="ignore"):
        if x.dtype.kind in "OUS":
            out = _from_strings(x, dt, saturate, round_mode)
        elif dt == STRING:
            out = _to_strings(x)
        else:
            out = _cast_numeric(x, dt, saturate, round_mode)
    out = np.asarray(out)
    if out.dtype != dt:
        out = out.astype(dt)
    if out is x or np.shares_memory(out, x):
        out = out.copy()
    return out


_TO_RULE = such_that(
    lambda v: (isinstance(v, (str, bytes)) and v) or v in _VALID_TO,
    "an ONNX TensorProto element type code (not UNDEFINED or complex)",
)
_SAT_RULE = one_of(0, 1)
_ROUND_RULE = one_of(*ROUND_MODES)
# "produce": strings "NaN" and non-saturating float8 overflow create NaN from non-NaN inputs.
CAST_1 = Contract(nan="produce", overflow="wrap", allowed={"to": _TO_RULE})
CAST_19 = Contract(nan="produce", overflow="wrap", allowed={"to": _TO_RULE, "saturate": _SAT_RULE})
CAST_24 = Contract(
    nan="produce",
    overflow="wrap",
    allowed={"to": _TO_RULE, "saturate": _SAT_RULE, "round_mode": _ROUND_RULE},
)
CASTLIKE_15 = Contract(nan="produce", overflow="wrap")
CASTLIKE_19 = Contract(nan="produce", overflow="wrap", allowed={"saturate": _SAT_RULE})
CASTLIKE_24 = Contract(
    nan="produce", overflow="wrap", allowed={"saturate": _SAT_RULE, "round_mode": _ROUND_RULE}
)


@op("Cast", since=1, contract=CAST_1)
def Cast_1(input, *, to=None):
    """Cast to the type named by the string attribute `to` (ONNX Cast-1)."""
    return cast_array(input, to_target_dtype(to))


@op("Cast", since=6, contract=CAST_1)
def Cast_6(input, *, to=None):
    """Cast to TensorProto type `to`; later versions up to 13 only add types (ONNX Cast-6)."""
    return cast_array(input, to_target_dtype(to))


@op("Cast", since=19, contract=CAST_19)
def Cast_19(input, *, to=None, saturate=1):
    """Cast with float8 saturation control (ONNX Cast-19; 21 and 23 only add types)."""
    return cast_array(input, to_target_dtype(to), bool(saturate))


@op("Cast", since=24, contract=CAST_24)
def Cast(input, *, to=None, saturate=1, round_mode="up"):
    """Cast with float8e8m0 rounding control (ONNX Cast-24; 25 and 28 only add types)."""
    return cast_array(input, to_target_dtype(to), bool(saturate), round_mode)


def _cast_samples(rng):
    """float32 <-> float16 (the compiled conversion's cases: rounding ties, subnormals,
    overflow, NaN, signed zeros, a strided-size tail), then a cast it leaves to the reference."""
    x = (rng.standard_normal((5, 37)) * 3).astype(np.float32)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e6, -1e6,
                          6e-8, 3e-8, -3e-8, 6.1e-5, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11])
    x.flat[: special.size] = special
    yield Sample([x], {"to": TensorProto.FLOAT16}, label="float32 -> float16")
    with np.errstate(over="ignore"):  # (1e6 and 65520 round to inf, as they should)
        half = x.astype(np.float16)
    yield Sample([half], {"to": TensorProto.FLOAT}, label="float16 -> float32")
    yield Sample([x.clip(-1e4, 1e4).astype(np.float16)[:, ::3]], {"to": TensorProto.FLOAT},
                 label="float16 -> float32, strided")
    # (NaN and out-of-range floats to int32 are undefined in ONNX: runtimes differ there)
    yield Sample([np.nan_to_num(x, nan=0.0).clip(-1e4, 1e4)], {"to": TensorProto.INT32},
                 label="float32 -> int32")


for _cast in (Cast_6, Cast_19, Cast):
    _cast.samples(_cast_samples)


@op("CastLike", since=15, contract=CASTLIKE_15)
def CastLike_15(input, target_type):
    """Cast `input` to the element type of `target_type` (ONNX CastLike-15)."""
    return cast_array(input, np.asarray(target_type).dtype)


@op("CastLike", since=19, contract=CASTLIKE_19)
def CastLike_19(input, target_type, *, saturate=1):
    """CastLike with float8 saturation control (ONNX CastLike-19; 21 and 23 only add types)."""
    return cast_array(input, np.asarray(target_type).dtype, bool(saturate))


@op("CastLike", since=24, contract=CASTLIKE_24)
def CastLike(input, target_type, *, saturate=1, round_mode="up"):
    """CastLike with float8e8m0 rounding control (ONNX CastLike-24; 25 only adds types)."""
    return cast_array(input, np.asarray(target_type).dtype, bool(saturate), round_mode)


# ONNX widths of the types stored one per byte by ml_dtypes (the value sits in the low bits).
_SUB_BYTE_BITS = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2}


def _bit_width(dt: np.dtype) -> int:
    return _SUB_BYTE_BITS.get(dt.name, dt.itemsize * 8)


def _bitcast_target(to) -> bool:
    try:
        return np_dtype(int(to)) != np.dtype(object)
    except (KeyError, TypeError, ValueError):
        return False


@op("BitCast", since=26, contract=Contract(
    may_alias=((0, 0),), nan="produce",
    allowed={"to": such_that(_bitcast_target, "a non-string ONNX tensor element type")}))
def BitCast(input, *, to=None):
    """Reinterpret the bits of each element as type `to` of the same width (ONNX BitCast-26)."""
    if to is None or not _bitcast_target(to):
        raise KernelError(f"BitCast: 'to' must be a non-string tensor type, got {to!r}")
    target = np_dtype(int(to))
    if input.dtype == np.dtype(object):
        raise KernelError("BitCast: string tensors cannot be reinterpreted")
    if _bit_width(input.dtype) != _bit_width(target):
        raise KernelError(
            f"BitCast: {input.dtype} is {_bit_width(input.dtype)} bits but {target} is "
            f"{_bit_width(target)} bits"
        )
    # (np.ascontiguousarray would turn a 0-d tensor into 1-d.)
    src = input if input.flags.c_contiguous else input.copy(order="C")
    if sys.byteorder != "little":  # the spec fixes little-endian bytes
        src = src.byteswap()
    if target == np.bool_:
        # A bool holds 0 or 1; any nonzero byte reads as true.
        return np.asarray(src.view(np.uint8) != 0)
    if _bit_width(target) < 8:
        # Keep only the value bits so the target reads exactly them.
        bits = np.asarray(src.view(np.uint8) & np.uint8((1 << _bit_width(target)) - 1))
        return bits.view(target)
    out = src.view(target)
    return out.byteswap() if sys.byteorder != "little" else out


def _cast_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = away_from_zero(2, 3)
    if op_type == "Cast":
        return [Sample([x], {"to": 11})]
    return [Sample([x, np.zeros(1)])]


@differentiable("Cast", "CastLike", cases=_cast_grad_cases)
def _cast_grad(ctx, dY, **attrs):
    # dY comes back in the input's dtype (fit casts it).
    return fit(ctx, dY)
