"""Operators: elementwise family (unary math, arithmetic, variadic, Where), with their backward
rules; comparison, logic and bitwise ops live in logic.py, BitCast in cast.py."""

import math

import numpy as np

from opwarden.contract import ELEMENTWISE, Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import apply_wide, wide
from opwarden.ops.grad import (
    away_from_zero,
    differentiable,
    fit,
    positive,
    reduce_to,
    unary,
    unary_cases,
)

# ---------------------------------------------------------------------------------------------
# Helpers


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


# ---------------------------------------------------------------------------------------------
# Unary math


@op("Abs", since=6, contract=_INT_UNARY)
def Abs(X):
    """|X|; the most negative signed integer wraps to itself (ONNX Abs-6/13)."""
    return apply_wide(np.abs, X)


@op("Neg", since=6, contract=_INT_UNARY)
def Neg(X):
    """-X; the most negative signed integer wraps to itself (ONNX Neg-6/13)."""
    return apply_wide(np.negative, X)


@op("Reciprocal", since=6, contract=_FLOAT_UNARY)
def Reciprocal(X):
    """1/X (ONNX Reciprocal-6/13)."""
    return apply_wide(np.reciprocal, X)


@op("Floor", since=6, contract=_FLOAT_UNARY)
def Floor(X):
    """Largest integer <= X (ONNX Floor-6/13)."""
    return apply_wide(np.floor, X)


@op("Ceil", since=6, contract=_FLOAT_UNARY)
def Ceil(X):
    """Smallest integer >= X (ONNX Ceil-6/13)."""
    return apply_wide(np.ceil, X)


@op("Round", since=11, contract=_FLOAT_UNARY)
def Round(X):
    """Nearest integer, halves to even (ONNX Round-11/22)."""
    return apply_wide(np.rint, X)  # rint rounds half to even


@op("Sqrt", since=6, contract=_FLOAT_UNARY_NAN)
def Sqrt(X):
    """Square root; NaN for negative X (ONNX Sqrt-6/13)."""
    return apply_wide(np.sqrt, X)


@op("Exp", since=6, contract=_FLOAT_UNARY)
def Exp(X):
    """e**X (ONNX Exp-6/13)."""
    return apply_wide(np.exp, X)


@op("Log", since=6, contract=_FLOAT_UNARY_NAN)
def Log(X):
    """Natural logarithm; -inf at 0, NaN below (ONNX Log-6/13)."""
    return apply_wide(np.log, X)


@op("Sin", since=7, contract=_FLOAT_UNARY)
def Sin(X):
    """Sine (ONNX Sin-7/22)."""
    return apply_wide(np.sin, X)


@op("Cos", since=7, contract=_FLOAT_UNARY)
def Cos(X):
    """Cosine (ONNX Cos-7/22)."""
    return apply_wide(np.cos, X)


@op("Tan", since=7, contract=_FLOAT_UNARY)
def Tan(X):
    """Tangent (ONNX Tan-7/22)."""
    return apply_wide(np.tan, X)


@op("Asin", since=7, contract=_FLOAT_UNARY_NAN)
def Asin(X):
    """Arcsine; NaN outside [-1, 1] (ONNX Asin-7/22)."""
    return apply_wide(np.arcsin, X)


@op("Acos", since=7, contract=_FLOAT_UNARY_NAN)
def Acos(X):
    """Arccosine; NaN outside [-1, 1] (ONNX Acos-7/22)."""
    return apply_wide(np.arccos, X)


@op("Atan", since=7, contract=_FLOAT_UNARY)
def Atan(X):
    """Arctangent (ONNX Atan-7/22)."""
    return apply_wide(np.arctan, X)


@op("Sinh", since=9, contract=_FLOAT_UNARY)
def Sinh(X):
    """Hyperbolic sine (ONNX Sinh-9/22)."""
    return apply_wide(np.sinh, X)


@op("Cosh", since=9, contract=_FLOAT_UNARY)
def Cosh(X):
    """Hyperbolic cosine (ONNX Cosh-9/22)."""
    return apply_wide(np.cosh, X)


@op("Asinh", since=9, contract=_FLOAT_UNARY)
def Asinh(X):
    """Inverse hyperbolic sine (ONNX Asinh-9/22)."""
    return apply_wide(np.arcsinh, X)


@op("Acosh", since=9, contract=_FLOAT_UNARY_NAN)
def Acosh(X):
    """Inverse hyperbolic cosine; NaN below 1 (ONNX Acosh-9/22)."""
    return apply_wide(np.arccosh, X)


@op("Atanh", since=9, contract=_FLOAT_UNARY_NAN)
def Atanh(X):
    """Inverse hyperbolic tangent; NaN outside [-1, 1] (ONNX Atanh-9/22)."""
    return apply_wide(np.arctanh, X)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Error function in float64 (NumPy has none; math.erf is accurate to double precision)."""
    return np.asarray(_erf_scalar(np.asarray(x, dtype=np.float64)), dtype=np.float64)


@op("Erf", since=9, contract=_FLOAT_UNARY)
def Erf(X):
    """Gauss error function (ONNX Erf-9/13)."""
    return apply_wide(erf, X)


@op("Sign", since=9, contract=Contract(may_alias=((0, 0),)))
def Sign(X):
    """-1, 0 or 1 by the sign of X; NaN stays NaN (ONNX Sign-9/13)."""
    return apply_wide(np.sign, X)


@op("IsNaN", since=9, contract=_PREDICATE)
def IsNaN(X):
    """True where X is NaN (ONNX IsNaN-9/13/20)."""
    return apply_wide(np.isnan, X, dtype=np.bool_)


@op("IsInf", since=10, contract=Contract(
    nan="none", allowed={"detect_positive": one_of(0, 1), "detect_negative": one_of(0, 1)}))
def IsInf(X, *, detect_negative=1, detect_positive=1):
    """True where X is +inf (if detect_positive) or -inf (if detect_negative) (ONNX IsInf-10/20)."""

    def f(x):
        return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))

    return apply_wide(f, X, dtype=np.bool_)


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
    return apply_wide(np.add, A, B)


@op("Sub", since=7, contract=_ARITH)
def Sub(A, B):
    """A - B with numpy broadcasting; integers wrap (ONNX Sub-7/13/14)."""
    return apply_wide(np.subtract, A, B)


@op("Mul", since=7, contract=_ARITH)
def Mul(A, B):
    """A * B with numpy broadcasting; integers wrap (ONNX Mul-7/13/14)."""
    return apply_wide(np.multiply, A, B)


@op("Div", since=7, contract=Contract(
    may_alias=((0, 0),), broadcast="multidirectional", overflow="wrap", nan="produce"))
def Div(A, B):
    """A / B with numpy broadcasting; integer division truncates toward zero (ONNX Div-7/13/14)."""
    return apply_wide(_trunc_div, A, B)


@op("Add", since=6, contract=_LEGACY_ARITH)
def Add_6(A, B, *, broadcast=0, axis=None):
    """A + B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Add-6)."""
    return apply_wide(np.add, A, legacy_broadcast(A, B, broadcast, axis))


@op("Sub", since=6, contract=_LEGACY_ARITH)
def Sub_6(A, B, *, broadcast=0, axis=None):
    """A - B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Sub-6)."""
    return apply_wide(np.subtract, A, legacy_broadcast(A, B, broadcast, axis))


@op("Mul", since=6, contract=_LEGACY_ARITH)
def Mul_6(A, B, *, broadcast=0, axis=None):
    """A * B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Mul-6)."""
    return apply_wide(np.multiply, A, legacy_broadcast(A, B, broadcast, axis))


@op("Div", since=6, contract=Contract(
    may_alias=((0, 0),), broadcast="unidirectional", overflow="wrap", nan="produce",
    allowed=_LEGACY))
def Div_6(A, B, *, broadcast=0, axis=None):
    """A / B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Div-6)."""
    return apply_wide(_trunc_div, A, legacy_broadcast(A, B, broadcast, axis))


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
    return apply_wide(lambda a, b: _mod(a, b, fmod), A, B)


# ---------------------------------------------------------------------------------------------
# Variadic


def _fold(fn, Xs) -> np.ndarray:
    """fn folded over the inputs with numpy broadcasting, narrow floats accumulated in float32."""
    if not Xs:
        raise KernelError("at least one input is required")
    dtype = Xs[0].dtype
    with np.errstate(all="ignore"):
        acc = wide(Xs[0]).copy()  # copy: a lone input must not be returned as the output
        for x in Xs[1:]:
            acc = fn(acc, wide(x))
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
    total = _fold(np.add, [wide(x) for x in Xs])
    with np.errstate(all="ignore"):
        return np.asarray(total / total.dtype.type(len(Xs))).astype(Xs[0].dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Selection


@op("Where", since=9, contract=Contract(nan="suppress", broadcast="multidirectional"))
def Where(condition, X, Y):
    """X where condition else Y, numpy broadcasting of all three (ONNX Where-9/16)."""
    return np.asarray(np.where(condition, X, Y), dtype=X.dtype)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _b_shape(ctx, attrs: dict) -> tuple[int, ...]:
    """The shape input B broadcasts from: its own, or its legacy (opset < 7) alignment."""
    A, B = (np.asarray(x) for x in ctx.inputs[:2])
    if "broadcast" in attrs or ctx.op is not None and ctx.op.since < 7:
        return legacy_broadcast(A, B, attrs.get("broadcast", 0), attrs.get("axis")).shape
    return B.shape


def _binary_grad_cases(op_type: str, since: int) -> list[Sample]:
    r, pos = away_from_zero, positive
    b_pos = op_type in ("Div", "Pow")
    a = pos(2, 3, 4) if op_type == "Pow" else r(2, 3, 4)
    if since < 7:
        b_full = pos(2, 3, 4, seed=5) if b_pos else r(2, 3, 4, seed=5)
        b_axis = pos(3, seed=6) if b_pos else r(3, seed=6)
        return [
            Sample([a, b_full]),
            Sample([a, b_axis], {"broadcast": 1, "axis": 1}, label="legacy axis broadcast"),
        ]
    b1 = pos(3, 1, seed=3) if b_pos else r(3, 1, seed=3)
    b2 = pos(2, 3, 4, seed=4) if b_pos else r(2, 3, 4, seed=4)
    return [Sample([a, b1], label="broadcast"), Sample([a[:, :1, :], b2], label="A broadcast")]


@differentiable("Add", cases=_binary_grad_cases)
def _add_grad(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    return fit(ctx, reduce_to(dY, A), reduce_to(dY, B, _b_shape(ctx, attrs)))


@differentiable("Sub", cases=_binary_grad_cases)
def _sub_grad(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    return fit(ctx, reduce_to(dY, A), reduce_to(-dY, B, _b_shape(ctx, attrs)))


@differentiable("Mul", cases=_binary_grad_cases)
def _mul_grad(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    bs = _b_shape(ctx, attrs)
    b = np.asarray(B).reshape(bs)
    return fit(ctx, reduce_to(dY * b, A), reduce_to(dY * A, B, bs))


@differentiable("Div", cases=_binary_grad_cases)
def _div_grad(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    bs = _b_shape(ctx, attrs)
    b = np.asarray(B).reshape(bs)
    return fit(ctx, reduce_to(dY / b, A), reduce_to(-dY * A / (b * b), B, bs))


@differentiable("Pow", cases=_binary_grad_cases)
def _pow_grad(ctx, dY, **attrs):
    X, E = ctx.inputs[:2]
    Y = ctx.outputs[0]
    es = _b_shape(ctx, attrs)
    e = np.asarray(E).reshape(es).astype(Y.dtype)
    x = np.asarray(X).astype(Y.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = dY * e * np.power(x, e - 1)
        de = np.where(x > 0, dY * Y * np.log(np.where(x > 0, x, 1)), 0)
    return fit(ctx, reduce_to(dx, X), reduce_to(de, E, es))


def _variadic_grad_cases(op_type: str, since: int) -> list[Sample]:
    r = away_from_zero
    return [Sample([r(2, 3, seed=1), r(3, seed=2), r(1, 3, seed=3)])]


@differentiable("Sum", cases=_variadic_grad_cases)
def _sum_grad(ctx, dY, **attrs):
    return fit(ctx, *[reduce_to(dY, x) for x in ctx.inputs])


@differentiable("Mean", cases=_variadic_grad_cases)
def _mean_grad(ctx, dY, **attrs):
    n = len(ctx.inputs)
    return fit(ctx, *[reduce_to(dY / n, x) for x in ctx.inputs])


@differentiable("Max", "Min", cases=_variadic_grad_cases)
def _maxmin_grad(ctx, dY, **attrs):
    Y = ctx.outputs[0]
    masks = [np.broadcast_to(x, Y.shape) == Y for x in ctx.inputs]
    # Ties share the gradient evenly (the subgradient that keeps the sum right).
    count = np.maximum(sum(m.astype(Y.dtype) for m in masks), 1)
    return fit(ctx, *[reduce_to(dY * m / count, x) for m, x in zip(masks, ctx.inputs)])


def _where_grad_cases(op_type: str, since: int) -> list[Sample]:
    r = away_from_zero
    return [Sample([np.array([True, False, True]), r(2, 3), r(2, 1, seed=2)])]


@differentiable("Where", cases=_where_grad_cases)
def _where_grad(ctx, dY, **attrs):
    c, X, Y = ctx.inputs
    return fit(ctx, None, reduce_to(np.where(c, dY, 0), X), reduce_to(np.where(c, 0, dY), Y))


# Unary math: d(op)/dX as f(x, y, attrs), gradchecked on inputs inside each op's domain and
# off its integer / half-integer steps.
_unary_grad_cases = unary_cases({
    "Log": lambda: positive(2, 3),
    "Sqrt": lambda: positive(2, 3),
    "Reciprocal": lambda: positive(2, 3),
    "Asin": lambda: away_from_zero(2, 3, lo=-0.8, hi=0.8),
    "Acos": lambda: away_from_zero(2, 3, lo=-0.8, hi=0.8),
    "Atanh": lambda: away_from_zero(2, 3, lo=-0.8, hi=0.8),
    "Acosh": lambda: positive(2, 3, lo=1.2, hi=3.0),
    "Tan": lambda: away_from_zero(2, 3, lo=-1.2, hi=1.2),
    "Floor": lambda: away_from_zero(2, 3) * 0 + np.array([[0.3, 1.4, -0.6], [2.2, -1.3, 0.7]]),
    "Ceil": lambda: np.array([[0.3, 1.4, -0.6], [2.2, -1.3, 0.7]]),
    "Round": lambda: np.array([[0.3, 1.2, -0.7], [2.2, -1.3, 0.8]]),
}, {})
_ERF_SLOPE = 2 / math.sqrt(math.pi)

unary("Neg", cases=_unary_grad_cases)(lambda x, y, a: -np.ones_like(x))
unary("Exp", cases=_unary_grad_cases)(lambda x, y, a: y)
unary("Log", cases=_unary_grad_cases)(lambda x, y, a: 1 / x)
unary("Sqrt", cases=_unary_grad_cases)(lambda x, y, a: 0.5 / y)
unary("Abs", cases=_unary_grad_cases)(lambda x, y, a: np.sign(x))
unary("Reciprocal", cases=_unary_grad_cases)(lambda x, y, a: -y * y)
unary("Sin", cases=_unary_grad_cases)(lambda x, y, a: np.cos(x))
unary("Cos", cases=_unary_grad_cases)(lambda x, y, a: -np.sin(x))
unary("Tan", cases=_unary_grad_cases)(lambda x, y, a: 1 + y * y)
unary("Asin", cases=_unary_grad_cases)(lambda x, y, a: 1 / np.sqrt(1 - x * x))
unary("Acos", cases=_unary_grad_cases)(lambda x, y, a: -1 / np.sqrt(1 - x * x))
unary("Atan", cases=_unary_grad_cases)(lambda x, y, a: 1 / (1 + x * x))
unary("Sinh", cases=_unary_grad_cases)(lambda x, y, a: np.cosh(x))
unary("Cosh", cases=_unary_grad_cases)(lambda x, y, a: np.sinh(x))
unary("Asinh", cases=_unary_grad_cases)(lambda x, y, a: 1 / np.sqrt(x * x + 1))
unary("Acosh", cases=_unary_grad_cases)(lambda x, y, a: 1 / np.sqrt(x * x - 1))
unary("Atanh", cases=_unary_grad_cases)(lambda x, y, a: 1 / (1 - x * x))
unary("Erf", cases=_unary_grad_cases)(
    lambda x, y, a: np.asarray(_ERF_SLOPE, dtype=x.dtype) * np.exp(-x * x))
unary("Floor", "Ceil", "Round", "Sign", cases=_unary_grad_cases)(
    lambda x, y, a: np.zeros_like(y))
