"""Operators: elementwise family (unary math, arithmetic, comparison, logic, bitwise, variadic)."""

import math
import sys

import numpy as np

from opwarden.contract import ELEMENTWISE, Contract, one_of, such_that
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import op

# ---------------------------------------------------------------------------------------------
# Helpers


def _is_float(dt: np.dtype) -> bool:
    """True for IEEE floats and ml_dtypes floats (bfloat16, float8, float4: kind 'V')."""
    return dt.kind == "f" or dt.name.startswith(("bfloat", "float"))


def _wide(x: np.ndarray) -> np.ndarray:
    """Floats narrower than 32 bits are computed in float32 (one rounding back at the end)."""
    if _is_float(x.dtype) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def _apply(fn, *xs, dtype=None) -> np.ndarray:
    """fn on the inputs (narrow floats widened), cast to `dtype` (default: input 0's dtype)."""
    out = xs[0].dtype if dtype is None else np.dtype(dtype)
    with np.errstate(all="ignore"):
        r = fn(*(_wide(x) for x in xs))
        return np.asarray(r).astype(out, copy=False)


def _check_int_divisor(B: np.ndarray, what: str) -> None:
    # C integer division by zero is undefined; refuse rather than invent a value.
    if B.dtype.kind in "iu" and not np.all(B):
        raise KernelError(f"integer {what} by zero")


def legacy_broadcast(A: np.ndarray, B: np.ndarray, broadcast: int, axis) -> np.ndarray:
    """B reshaped for the opset<7 `broadcast`/`axis` rule: B broadcasts to A's shape (only)."""
    if not broadcast:
        if A.shape != B.shape:
            raise KernelError(
                f"shapes {A.shape} and {B.shape} differ and attribute broadcast is 0"
            )
        return B
    if B.size == 1:
        return B.reshape(())
    if B.ndim > A.ndim:
        raise KernelError(f"B of shape {B.shape} has more dimensions than A of shape {A.shape}")
    if axis is not None:
        ax = axis + A.ndim if axis < 0 else axis
        if ax < 0 or ax + B.ndim > A.ndim or A.shape[ax : ax + B.ndim] != B.shape:
            raise KernelError(f"B of shape {B.shape} does not match A {A.shape} at axis {axis}")
        return B.reshape(B.shape + (1,) * (A.ndim - ax - B.ndim))
    if A.shape[A.ndim - B.ndim :] != B.shape:
        raise KernelError(f"B of shape {B.shape} is not a suffix of A's shape {A.shape}")
    return B


_LEGACY = {"broadcast": one_of(0, 1)}
_LEGACY_ARITH = Contract(may_alias=((0, 0),), broadcast="unidirectional", overflow="wrap",
                         allowed=_LEGACY)
_ARITH = ELEMENTWISE  # numpy broadcasting, in place on input 0, integers wrap
_FLOAT_UNARY = Contract(may_alias=((0, 0),))
_FLOAT_UNARY_NAN = Contract(may_alias=((0, 0),), nan="produce")
_INT_UNARY = Contract(may_alias=((0, 0),), overflow="wrap")
_PREDICATE = Contract(nan="none")
_COMPARE = Contract(nan="none", broadcast="multidirectional")
_LEGACY_COMPARE = Contract(nan="none", broadcast="unidirectional", allowed=_LEGACY)
_BITS = Contract(may_alias=((0, 0),), nan="none", broadcast="multidirectional", overflow="wrap")


# ---------------------------------------------------------------------------------------------
# Unary math


@op("Abs", since=6, contract=_INT_UNARY)
def Abs(X):
    """|X|; the most negative signed integer wraps to itself (ONNX Abs-6/13)."""
    return _apply(np.abs, X)


@op("Neg", since=6, contract=_INT_UNARY)
def Neg(X):
    """-X; the most negative signed integer wraps to itself (ONNX Neg-6/13)."""
    return _apply(np.negative, X)


@op("Reciprocal", since=6, contract=_FLOAT_UNARY)
def Reciprocal(X):
    """1/X (ONNX Reciprocal-6/13)."""
    return _apply(np.reciprocal, X)


@op("Floor", since=6, contract=_FLOAT_UNARY)
def Floor(X):
    """Largest integer <= X (ONNX Floor-6/13)."""
    return _apply(np.floor, X)


@op("Ceil", since=6, contract=_FLOAT_UNARY)
def Ceil(X):
    """Smallest integer >= X (ONNX Ceil-6/13)."""
    return _apply(np.ceil, X)


@op("Round", since=11, contract=_FLOAT_UNARY)
def Round(X):
    """Nearest integer, halves to even (ONNX Round-11/22)."""
    return _apply(np.rint, X)  # rint rounds half to even


@op("Sqrt", since=6, contract=_FLOAT_UNARY_NAN)
def Sqrt(X):
    """Square root; NaN for negative X (ONNX Sqrt-6/13)."""
    return _apply(np.sqrt, X)


@op("Exp", since=6, contract=_FLOAT_UNARY)
def Exp(X):
    """e**X (ONNX Exp-6/13)."""
    return _apply(np.exp, X)


@op("Log", since=6, contract=_FLOAT_UNARY_NAN)
def Log(X):
    """Natural logarithm; -inf at 0, NaN below (ONNX Log-6/13)."""
    return _apply(np.log, X)


@op("Sin", since=7, contract=_FLOAT_UNARY)
def Sin(X):
    """Sine (ONNX Sin-7/22)."""
    return _apply(np.sin, X)


@op("Cos", since=7, contract=_FLOAT_UNARY)
def Cos(X):
    """Cosine (ONNX Cos-7/22)."""
    return _apply(np.cos, X)


@op("Tan", since=7, contract=_FLOAT_UNARY)
def Tan(X):
    """Tangent (ONNX Tan-7/22)."""
    return _apply(np.tan, X)


@op("Asin", since=7, contract=_FLOAT_UNARY_NAN)
def Asin(X):
    """Arcsine; NaN outside [-1, 1] (ONNX Asin-7/22)."""
    return _apply(np.arcsin, X)


@op("Acos", since=7, contract=_FLOAT_UNARY_NAN)
def Acos(X):
    """Arccosine; NaN outside [-1, 1] (ONNX Acos-7/22)."""
    return _apply(np.arccos, X)


@op("Atan", since=7, contract=_FLOAT_UNARY)
def Atan(X):
    """Arctangent (ONNX Atan-7/22)."""
    return _apply(np.arctan, X)


@op("Sinh", since=9, contract=_FLOAT_UNARY)
def Sinh(X):
    """Hyperbolic sine (ONNX Sinh-9/22)."""
    return _apply(np.sinh, X)


@op("Cosh", since=9, contract=_FLOAT_UNARY)
def Cosh(X):
    """Hyperbolic cosine (ONNX Cosh-9/22)."""
    return _apply(np.cosh, X)


@op("Asinh", since=9, contract=_FLOAT_UNARY)
def Asinh(X):
    """Inverse hyperbolic sine (ONNX Asinh-9/22)."""
    return _apply(np.arcsinh, X)


@op("Acosh", since=9, contract=_FLOAT_UNARY_NAN)
def Acosh(X):
    """Inverse hyperbolic cosine; NaN below 1 (ONNX Acosh-9/22)."""
    return _apply(np.arccosh, X)


@op("Atanh", since=9, contract=_FLOAT_UNARY_NAN)
def Atanh(X):
    """Inverse hyperbolic tangent; NaN outside [-1, 1] (ONNX Atanh-9/22)."""
    return _apply(np.arctanh, X)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Error function in float64 (NumPy has none; math.erf is accurate to double precision)."""
    return np.asarray(_erf_scalar(np.asarray(x, dtype=np.float64)), dtype=np.float64)


@op("Erf", since=9, contract=_FLOAT_UNARY)
def Erf(X):
    """Gauss error function (ONNX Erf-9/13)."""
    return _apply(erf, X)


@op("Sign", since=9, contract=Contract(may_alias=((0, 0),)))
def Sign(X):
    """-1, 0 or 1 by the sign of X; NaN stays NaN (ONNX Sign-9/13)."""
    return _apply(np.sign, X)


@op("IsNaN", since=9, contract=_PREDICATE)
def IsNaN(X):
    """True where X is NaN (ONNX IsNaN-9/13/20)."""
    return _apply(np.isnan, X, dtype=np.bool_)


@op("IsInf", since=10, contract=Contract(
    nan="none", allowed={"detect_positive": one_of(0, 1), "detect_negative": one_of(0, 1)}))
def IsInf(X, *, detect_negative=1, detect_positive=1):
    """True where X is +inf (if detect_positive) or -inf (if detect_negative) (ONNX IsInf-10/20)."""

    def f(x):
        return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))

    return _apply(f, X, dtype=np.bool_)


@op("Not", since=1, contract=Contract(may_alias=((0, 0),), nan="none"))
def Not(X):
    """Logical negation (ONNX Not-1)."""
    return np.asarray(np.logical_not(X))


# ---------------------------------------------------------------------------------------------
# Binary arithmetic


def _trunc_div(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero, as C does (NumPy's // floors)."""
    if A.dtype.kind in "iu":
        _check_int_divisor(B, "division")
        # fmod has the sign of A, so A - fmod(A, B) is an exact multiple of B.
        return (A - np.fmod(A, B)) // B
    return np.divide(A, B)


@op("Add", since=7, contract=_ARITH)
def Add(A, B):
    """A + B with numpy broadcasting; integers wrap (ONNX Add-7/13/14)."""
    return _apply(np.add, A, B)


@op("Sub", since=7, contract=_ARITH)
def Sub(A, B):
    """A - B with numpy broadcasting; integers wrap (ONNX Sub-7/13/14)."""
    return _apply(np.subtract, A, B)


@op("Mul", since=7, contract=_ARITH)
def Mul(A, B):
    """A * B with numpy broadcasting; integers wrap (ONNX Mul-7/13/14)."""
    return _apply(np.multiply, A, B)


@op("Div", since=7, contract=Contract(
    may_alias=((0, 0),), broadcast="multidirectional", overflow="wrap", nan="produce"))
def Div(A, B):
    """A / B with numpy broadcasting; integer division truncates toward zero (ONNX Div-7/13/14)."""
    return _apply(_trunc_div, A, B)


@op("Add", since=6, contract=_LEGACY_ARITH)
def Add_6(A, B, *, broadcast=0, axis=None):
    """A + B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Add-6)."""
    return _apply(np.add, A, legacy_broadcast(A, B, broadcast, axis))


@op("Sub", since=6, contract=_LEGACY_ARITH)
def Sub_6(A, B, *, broadcast=0, axis=None):
    """A - B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Sub-6)."""
    return _apply(np.subtract, A, legacy_broadcast(A, B, broadcast, axis))


@op("Mul", since=6, contract=_LEGACY_ARITH)
def Mul_6(A, B, *, broadcast=0, axis=None):
    """A * B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Mul-6)."""
    return _apply(np.multiply, A, legacy_broadcast(A, B, broadcast, axis))


@op("Div", since=6, contract=Contract(
    may_alias=((0, 0),), broadcast="unidirectional", overflow="wrap", nan="produce",
    allowed=_LEGACY))
def Div_6(A, B, *, broadcast=0, axis=None):
    """A / B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Div-6)."""
    return _apply(_trunc_div, A, legacy_broadcast(A, B, broadcast, axis))


def _int_pow(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Integer base, integer exponent: exact, wrapping in X's type; negative powers truncate."""
    neg = Y < 0
    if np.any(neg & (X == 0)):
        raise KernelError("Pow: integer 0 raised to a negative power")
    # Products modulo 2**64 have the same low bits as products wrapped in X's type (signed or
    # not), so compute in uint64 and truncate.
    r = np.power(X.astype(np.uint64), np.where(neg, 0, Y).astype(np.uint64))
    if np.any(neg):
        # 1/x**n truncated toward zero: 0 unless |x| == 1.
        odd = (Y % 2) != 0
        frac = np.where(X == 1, 1, np.where((X == -1) & odd, -1, np.where(X == -1, 1, 0)))
        r = np.where(neg, frac.astype(np.int64).astype(np.uint64), r)
    return r.astype(X.dtype)


def _pow(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """X ** Y, result in X's type (base and exponent types may differ)."""
    if X.dtype.kind in "iu":
        if Y.dtype.kind in "iub":
            return _int_pow(X, Y)
        r = np.power(X.astype(np.float64), Y.astype(np.float64))
        if not np.all(np.isfinite(r)):
            raise KernelError("Pow: integer result is not finite (NaN or infinity)")
        return np.trunc(r).astype(X.dtype)
    # Floats: computed in double, rounded once to X's type.
    return np.power(X.astype(np.float64), Y.astype(np.float64)).astype(X.dtype)


_POW = Contract(may_alias=((0, 0),), broadcast="multidirectional", overflow="wrap", nan="produce")


@op("Pow", since=7, contract=_POW)
def Pow(X, Y):
    """X ** Y with numpy broadcasting; output has the base's type (ONNX Pow-7/12/13/15)."""
    with np.errstate(all="ignore"):
        return np.asarray(_pow(X, Y), dtype=X.dtype)


@op("Pow", since=1, contract=Contract(
    may_alias=((0, 0),), broadcast="unidirectional", nan="produce", allowed=_LEGACY))
def Pow_1(X, Y, *, broadcast=0, axis=None):
    """X ** Y with the legacy B-to-A `broadcast`/`axis` rule (ONNX Pow-1)."""
    with np.errstate(all="ignore"):
        return np.asarray(_pow(X, legacy_broadcast(X, Y, broadcast, axis)), dtype=X.dtype)


def _mod(A: np.ndarray, B: np.ndarray, fmod: int) -> np.ndarray:
    if A.dtype.kind in "iu":
        _check_int_divisor(B, "modulo")
    if fmod:
        return np.fmod(A, B)  # A - trunc(A/B)*B: sign of A
    # A - floor(A/B)*B: sign of B. NumPy's remainder follows the spec's float special cases
    # (±0 takes B's sign, x % ±inf is x or ±inf by signs, inf or zero divisor gives NaN).
    return np.remainder(A, B)


@op("Mod", since=10, contract=Contract(
    may_alias=((0, 0),), broadcast="multidirectional", nan="produce",
    allowed={"fmod": one_of(0, 1)}))
def Mod(A, B, *, fmod=0):
    """Remainder with the sign of B (fmod=0) or of A (fmod=1, C fmod) (ONNX Mod-10/13/28)."""
    return _apply(lambda a, b: _mod(a, b, fmod), A, B)


# ---------------------------------------------------------------------------------------------
# Comparison and logic


def _compare(fn, A, B):
    return _apply(fn, A, B, dtype=np.bool_)


@op("Equal", since=7, contract=_COMPARE)
def Equal(A, B):
    """A == B elementwise, numpy broadcasting; strings too (ONNX Equal-7/11/13/19)."""
    return _compare(np.equal, A, B)


@op("Greater", since=7, contract=_COMPARE)
def Greater(A, B):
    """A > B elementwise, numpy broadcasting (ONNX Greater-7/9/13)."""
    return _compare(np.greater, A, B)


@op("Less", since=7, contract=_COMPARE)
def Less(A, B):
    """A < B elementwise, numpy broadcasting (ONNX Less-7/9/13)."""
    return _compare(np.less, A, B)


@op("GreaterOrEqual", since=12, contract=_COMPARE)
def GreaterOrEqual(A, B):
    """A >= B elementwise, numpy broadcasting (ONNX GreaterOrEqual-12/16)."""
    return _compare(np.greater_equal, A, B)


@op("LessOrEqual", since=12, contract=_COMPARE)
def LessOrEqual(A, B):
    """A <= B elementwise, numpy broadcasting (ONNX LessOrEqual-12/16)."""
    return _compare(np.less_equal, A, B)


@op("Equal", since=1, contract=_LEGACY_COMPARE)
def Equal_1(A, B, *, broadcast=0, axis=None):
    """A == B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Equal-1)."""
    return _compare(np.equal, A, legacy_broadcast(A, B, broadcast, axis))


@op("Greater", since=1, contract=_LEGACY_COMPARE)
def Greater_1(A, B, *, broadcast=0, axis=None):
    """A > B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Greater-1)."""
    return _compare(np.greater, A, legacy_broadcast(A, B, broadcast, axis))


@op("Less", since=1, contract=_LEGACY_COMPARE)
def Less_1(A, B, *, broadcast=0, axis=None):
    """A < B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Less-1)."""
    return _compare(np.less, A, legacy_broadcast(A, B, broadcast, axis))


@op("And", since=7, contract=_COMPARE)
def And(A, B):
    """Logical and, numpy broadcasting (ONNX And-7)."""
    return _compare(np.logical_and, A, B)


@op("Or", since=7, contract=_COMPARE)
def Or(A, B):
    """Logical or, numpy broadcasting (ONNX Or-7)."""
    return _compare(np.logical_or, A, B)


@op("Xor", since=7, contract=_COMPARE)
def Xor(A, B):
    """Logical exclusive or, numpy broadcasting (ONNX Xor-7)."""
    return _compare(np.logical_xor, A, B)


@op("And", since=1, contract=_LEGACY_COMPARE)
def And_1(A, B, *, broadcast=0, axis=None):
    """Logical and with the legacy B-to-A `broadcast`/`axis` rule (ONNX And-1)."""
    return _compare(np.logical_and, A, legacy_broadcast(A, B, broadcast, axis))


@op("Or", since=1, contract=_LEGACY_COMPARE)
def Or_1(A, B, *, broadcast=0, axis=None):
    """Logical or with the legacy B-to-A `broadcast`/`axis` rule (ONNX Or-1)."""
    return _compare(np.logical_or, A, legacy_broadcast(A, B, broadcast, axis))


@op("Xor", since=1, contract=_LEGACY_COMPARE)
def Xor_1(A, B, *, broadcast=0, axis=None):
    """Logical xor with the legacy B-to-A `broadcast`/`axis` rule (ONNX Xor-1)."""
    return _compare(np.logical_xor, A, legacy_broadcast(A, B, broadcast, axis))


# ---------------------------------------------------------------------------------------------
# Bitwise


@op("BitShift", since=11, contract=Contract(
    may_alias=((0, 0),), nan="none", broadcast="multidirectional", overflow="wrap",
    allowed={"direction": one_of("LEFT", "RIGHT")}))
def BitShift(X, Y, *, direction=None):
    """X << Y or X >> Y (arithmetic for signed); shifts outside [0, bits) give the sign fill
    (ONNX BitShift-11/28)."""
    if direction not in ("LEFT", "RIGHT"):
        raise KernelError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    bits = X.dtype.itemsize * 8
    with np.errstate(all="ignore"):
        # NumPy (like C) leaves shifts by a negative amount or >= the width undefined: mask them.
        valid = (Y >= 0) & (Y < bits)
        amount = np.where(valid, Y, 0).astype(X.dtype)
        if direction == "LEFT":
            shifted, fill = np.left_shift(X, amount), np.zeros((), X.dtype)
        else:
            shifted = np.right_shift(X, amount)
            fill = np.where(X < 0, -1, 0).astype(X.dtype) if X.dtype.kind == "i" else 0
        return np.asarray(np.where(valid, shifted, fill), dtype=X.dtype)


@op("BitwiseAnd", since=18, contract=_BITS)
def BitwiseAnd(A, B):
    """Bitwise and, numpy broadcasting (ONNX BitwiseAnd-18)."""
    return _apply(np.bitwise_and, A, B)


@op("BitwiseOr", since=18, contract=_BITS)
def BitwiseOr(A, B):
    """Bitwise or, numpy broadcasting (ONNX BitwiseOr-18)."""
    return _apply(np.bitwise_or, A, B)


@op("BitwiseXor", since=18, contract=_BITS)
def BitwiseXor(A, B):
    """Bitwise exclusive or, numpy broadcasting (ONNX BitwiseXor-18)."""
    return _apply(np.bitwise_xor, A, B)


@op("BitwiseNot", since=18, contract=Contract(may_alias=((0, 0),), nan="none", overflow="wrap"))
def BitwiseNot(X):
    """Bitwise complement (ONNX BitwiseNot-18)."""
    return _apply(np.invert, X)


# ---------------------------------------------------------------------------------------------
# Variadic


def _fold(fn, Xs) -> np.ndarray:
    """fn folded over the inputs with numpy broadcasting, narrow floats accumulated in float32."""
    if not Xs:
        raise KernelError("at least one input is required")
    dtype = Xs[0].dtype
    with np.errstate(all="ignore"):
        acc = _wide(Xs[0]).copy()  # copy: a lone input must not be returned as the output
        for x in Xs[1:]:
            acc = fn(acc, _wide(x))
        return np.asarray(acc).astype(dtype, copy=False)


_VARIADIC = Contract(may_alias=((0, 0),), broadcast="multidirectional", overflow="wrap")


@op("Sum", since=6, contract=_VARIADIC)
def Sum(*Xs):
    """Elementwise sum of all inputs, numpy broadcasting (ONNX Sum-6/8/13)."""
    return _fold(np.add, Xs)


@op("Max", since=6, contract=Contract(may_alias=((0, 0),), broadcast="multidirectional"))
def Max(*Xs):
    """Elementwise maximum of all inputs; NaN wins (ONNX Max-6/8/12/13)."""
    return _fold(np.maximum, Xs)


@op("Min", since=6, contract=Contract(may_alias=((0, 0),), broadcast="multidirectional"))
def Min(*Xs):
    """Elementwise minimum of all inputs; NaN wins (ONNX Min-6/8/12/13)."""
    return _fold(np.minimum, Xs)


@op("Mean", since=6, contract=Contract(may_alias=((0, 0),), broadcast="multidirectional"))
def Mean(*Xs):
    """Elementwise mean of all inputs, numpy broadcasting (ONNX Mean-6/8/13)."""
    total = _fold(np.add, [_wide(x) for x in Xs])
    with np.errstate(all="ignore"):
        return np.asarray(total / total.dtype.type(len(Xs))).astype(Xs[0].dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Selection and reinterpretation


@op("Where", since=9, contract=Contract(nan="suppress", broadcast="multidirectional"))
def Where(condition, X, Y):
    """X where condition else Y, numpy broadcasting of all three (ONNX Where-9/16)."""
    return np.asarray(np.where(condition, X, Y), dtype=X.dtype)


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
