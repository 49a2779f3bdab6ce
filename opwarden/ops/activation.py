"""Operators: activation family, with their backward rules and the activation table
(`REFERENCES`: canonical name -> reference kernel) the fused ops apply by name."""

import math

import numpy as np

from opwarden.contract import UNARY, Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import apply_wide
from opwarden.ops.elementwise import erf
from opwarden.ops.grad import away_from_zero, differentiable, fit, reduce_to, unary, unary_cases


def _c(x: np.ndarray, value: float):
    """A constant in x's (computing) dtype, so Python floats do not promote float32 to float64."""
    return x.dtype.type(value)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below.
    e = np.exp(-np.abs(x))
    one = _c(x, 1)
    return np.where(x >= 0, one / (one + e), e / (one + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(_c(x, 0), x)  # ln(1 + e^x) without overflow


_INT_ACT = Contract(may_alias=((0, 0),), overflow="wrap")
_SUPPRESS = Contract(may_alias=((0, 0),), nan="suppress")


# Relu runs as np.maximum against a zero array of at most this many floats (see relu).
RELU_CHUNK = 1 << 16
RELU_SMALL = 1 << 13
RELU_ZEROS = np.zeros(RELU_CHUNK, np.float32)
RELU_ZEROS.flags.writeable = False  # shared by every thread


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """max(x, 0) into `out` (default: in place in x), against chunks of a zero array: NumPy's
    maximum with a scalar (or any broadcast) operand takes a slow loop, two contiguous float32
    operands the fast one; RELU_CHUNK-float chunks keep the zeros in L1/L2. Same results, NaN
    included.
    Other dtypes and layouts take the plain call."""
    y = x if out is None else out
    if x.size < RELU_SMALL or x.dtype != np.float32 or y.dtype != np.float32 or x.shape != y.shape:
        # (Small tensors: the chunk loop costs more than it saves.)
        return np.maximum(x, x.dtype.type(0), out=y)
    if x.flags.c_contiguous and y.flags.c_contiguous:
        src, dst = x.reshape(-1), y.reshape(-1)
        size = dst.size
        for a in range(0, size, RELU_CHUNK):
            b = min(size, a + RELU_CHUNK)
            np.maximum(src[a:b], RELU_ZEROS[:b - a], out=dst[a:b])
        return y
    m = y.shape[-1] if y.ndim else 1
    if (y.ndim == 2 and 0 < m <= RELU_CHUNK and y.strides[1] == y.itemsize
            and x.strides[1] == x.itemsize):
        # Rows with a contiguous last axis (a strided planned output).
        step = RELU_CHUNK // m
        rows = y.shape[0]
        zero = RELU_ZEROS[:min(rows, step) * m].reshape(-1, m)
        for a in range(0, rows, step):
            b = min(rows, a + step)
            np.maximum(x[a:b], zero[:b - a], out=y[a:b])
        return y
    return np.maximum(x, np.float32(0), out=y)


@op("Relu", since=6, contract=UNARY)
def Relu(X):
    """max(X, 0) (ONNX Relu-6/13/14; 14 added integer types)."""
    return np.asarray(np.maximum(X, X.dtype.type(0)))  # asarray: 0-d must not become a scalar


@op("LeakyRelu", since=6, contract=UNARY)
def LeakyRelu(X, *, alpha=0.01):
    """X for X >= 0, alpha*X below (ONNX LeakyRelu-6/16)."""
    return apply_wide(lambda x: np.where(x < 0, _c(x, alpha) * x, x), X)


@op("PRelu", since=6, contract=Contract(
    may_alias=((0, 0),), broadcast="unidirectional", overflow="wrap"))
def PRelu(X, slope):
    """X for X >= 0, slope*X below; slope broadcasts to X (ONNX PRelu-6/7/9/16)."""
    try:
        shape = np.broadcast_shapes(X.shape, slope.shape)
    except ValueError:
        shape = None
    if shape != X.shape:
        raise KernelError(f"PRelu: slope of shape {slope.shape} does not broadcast to {X.shape}")
    return apply_wide(lambda x, s: np.where(x < 0, s * x, x), X, slope)


@op("Elu", since=6, contract=UNARY)
def Elu(X, *, alpha=1.0):
    """X for X >= 0, alpha*(e^X - 1) below (ONNX Elu-6/22)."""
    return apply_wide(lambda x: np.where(x < 0, _c(x, alpha) * np.expm1(x), x), X)


@op("Selu", since=6, contract=UNARY)
def Selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """gamma*X for X > 0, gamma*alpha*(e^X - 1) otherwise (ONNX Selu-6/22)."""

    def f(x):
        return _c(x, gamma) * np.where(x > 0, x, _c(x, alpha) * np.expm1(x))

    return apply_wide(f, X)


@op("Celu", since=12, contract=UNARY)
def Celu(X, *, alpha=1.0):
    """max(0, X) + min(0, alpha*(e^(X/alpha) - 1)) (ONNX Celu-12/28)."""
    if alpha == 0:
        raise KernelError("Celu: alpha must be nonzero")

    def f(x):
        a = _c(x, alpha)
        return np.maximum(x, _c(x, 0)) + np.minimum(_c(x, 0), a * np.expm1(x / a))

    return apply_wide(f, X)


@op("Sigmoid", since=6, contract=UNARY)
def Sigmoid(X):
    """1 / (1 + e^-X) (ONNX Sigmoid-6/13)."""
    return apply_wide(_sigmoid, X)


@op("HardSigmoid", since=6, contract=UNARY)
def HardSigmoid(X, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha*X + beta)) (ONNX HardSigmoid-6/22)."""
    return apply_wide(lambda x: np.clip(_c(x, alpha) * x + _c(x, beta), 0, 1), X)


@op("HardSwish", since=14, contract=UNARY)
def HardSwish(X):
    """X * max(0, min(1, X/6 + 1/2)) (ONNX HardSwish-14/22)."""
    return apply_wide(lambda x: x * np.clip(x / _c(x, 6) + _c(x, 0.5), 0, 1), X)


@op("Softplus", since=1, contract=UNARY)
def Softplus(X):
    """ln(1 + e^X) (ONNX Softplus-1/22)."""
    return apply_wide(_softplus, X)


@op("Softsign", since=1, contract=UNARY)
def Softsign(X):
    """X / (1 + |X|) (ONNX Softsign-1/22)."""
    return apply_wide(lambda x: x / (_c(x, 1) + np.abs(x)), X)


@op("Tanh", since=6, contract=UNARY)
def Tanh(X):
    """Hyperbolic tangent (ONNX Tanh-6/13)."""
    return apply_wide(np.tanh, X)


@op("ThresholdedRelu", since=10, contract=_SUPPRESS)
def ThresholdedRelu(X, *, alpha=1.0):
    """X where X > alpha, else 0 (NaN fails the test and gives 0) (ONNX ThresholdedRelu-10/22)."""
    return apply_wide(lambda x: np.where(x > _c(x, alpha), x, _c(x, 0)), X)


@op("Shrink", since=9, contract=Contract(may_alias=((0, 0),), nan="suppress", overflow="wrap"))
def Shrink(input, *, bias=0.0, lambd=0.5):
    """X+bias below -lambd, X-bias above lambd, else 0 (ONNX Shrink-9); integer types too."""
    X = input
    if X.dtype.kind in "iu":
        # Integer inputs: exact (wrapping) arithmetic when bias is whole, else via float64.
        work = X if float(bias).is_integer() else X.astype(np.float64)
        b = work.dtype.type(bias)
        with np.errstate(all="ignore"):
            r = np.where(X < -lambd, work + b, np.where(X > lambd, work - b, 0))
            return np.asarray(r).astype(X.dtype)

    def f(x):
        b = _c(x, bias)
        return np.where(x < -lambd, x + b, np.where(x > lambd, x - b, _c(x, 0)))

    return apply_wide(f, X)


@op("Gelu", since=20, contract=Contract(
    may_alias=((0, 0),), allowed={"approximate": one_of("none", "tanh")}))
def Gelu(X, *, approximate="none"):
    """x/2 * (1 + erf(x/sqrt 2)), or the tanh approximation (ONNX Gelu-20)."""
    if approximate not in ("none", "tanh"):
        raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")

    def exact(x):
        return x * (_c(x, 0.5) * (_c(x, 1) + erf(x / _c(x, math.sqrt(2))).astype(x.dtype)))

    def tanh(x):
        inner = _c(x, math.sqrt(2 / math.pi)) * (x + _c(x, 0.044715) * x * x * x)
        return _c(x, 0.5) * x * (_c(x, 1) + np.tanh(inner))

    return apply_wide(exact if approximate == "none" else tanh, X)


@op("Mish", since=18, contract=UNARY)
def Mish(X):
    """X * tanh(ln(1 + e^X)) (ONNX Mish-18/22)."""
    return apply_wide(lambda x: x * np.tanh(_softplus(x)), X)


@op("Swish", since=24, contract=UNARY)
def Swish(X, *, alpha=1.0):
    """X * sigmoid(alpha*X) (ONNX Swish-24)."""
    return apply_wide(lambda x: x * _sigmoid(_c(x, alpha) * x), X)


@op("SwiGLU", since=28, contract=Contract(may_alias=((0, 0), (1, 0))))
def SwiGLU(A, B, *, alpha=1.0):
    """Swish_alpha(A) * B for A and B of the same shape (ONNX SwiGLU-28)."""
    if A.shape != B.shape:
        raise KernelError(f"SwiGLU: A of shape {A.shape} and B of shape {B.shape} differ")
    return apply_wide(lambda a, b: a * _sigmoid(_c(a, alpha) * a) * b, A, B)


def _clip(X: np.ndarray, lo, hi) -> np.ndarray:
    """Min(hi, Max(X, lo)): if lo > hi everything becomes hi; NaN in X stays NaN."""
    with np.errstate(all="ignore"):
        r = X
        if lo is not None:
            r = np.maximum(r, lo)
        if hi is not None:
            r = np.minimum(r, hi)
        r = np.asarray(r, dtype=X.dtype)
        return r.copy() if r is X else r  # with no bounds the output must still be new


def _bound(b, X: np.ndarray, name: str):
    if b is None:
        return None
    if b.size != 1:
        raise KernelError(f"Clip: {name} must be a scalar, got shape {b.shape}")
    return b.reshape(()).astype(X.dtype, copy=False)


@op("Clip", since=11, contract=_INT_ACT)
def Clip(input, min=None, max=None):  # noqa: A002 (spec names)
    """Limit to [min, max], each an optional scalar input (ONNX Clip-11/12/13)."""
    return _clip(input, _bound(min, input, "min"), _bound(max, input, "max"))


@op("Clip", since=6, contract=UNARY)
def Clip_6(input, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002
    """Limit to [min, max] given as float attributes (ONNX Clip-6)."""
    with np.errstate(all="ignore"):  # FLT_MAX overflows float16 to inf, which is still a bound
        lo, hi = np.asarray(min, input.dtype), np.asarray(max, input.dtype)
    return _clip(input, lo, hi)


# ---------------------------------------------------------------------------------------------
# The activation table: canonical ONNX name -> reference kernel, for the ops that apply an
# activation by name (the fused ops). `activation_reference` matches names in any case.

REFERENCES = {
    "Relu": Relu, "LeakyRelu": LeakyRelu, "Elu": Elu, "Selu": Selu, "Celu": Celu,
    "Sigmoid": Sigmoid, "HardSigmoid": HardSigmoid, "HardSwish": HardSwish,
    "Softplus": Softplus, "Softsign": Softsign, "Tanh": Tanh, "ThresholdedRelu": ThresholdedRelu,
    "Gelu": Gelu, "Mish": Mish, "Clip": Clip,
}
_BY_LOWER = {k.lower(): v for k, v in REFERENCES.items()}


def activation_reference(name: str):
    """The reference kernel of activation `name` ("Relu", "relu", ...); KernelError if none."""
    fn = _BY_LOWER.get(str(name).lower())
    if fn is None:
        raise KernelError(f"unknown activation {name!r}; expected one of {sorted(REFERENCES)}")
    return fn


# ---------------------------------------------------------------------------------------------
# Backward rules

_unary_grad_cases = unary_cases({
    # stay off the thresholds
    "HardSwish": lambda: np.array([[-4.0, -2.5, -0.5], [0.7, 2.9, 4.2]]),
    "HardSigmoid": lambda: np.array([[-4.0, -2.0, -0.5], [0.7, 2.2, 4.2]]),
    "Shrink": lambda: np.array([[-1.0, -0.2, 0.3], [0.7, 1.6, -0.9]]),
    "ThresholdedRelu": lambda: np.array([[-1.0, 0.5, 1.3], [2.7, 0.2, 1.6]]),
}, {
    "LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "Celu": {"alpha": 1.5},
    "Selu": {"alpha": 1.5, "gamma": 1.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "Gelu": {"approximate": "tanh"}, "Shrink": {"lambd": 0.4, "bias": 0.1},
    "ThresholdedRelu": {"alpha": 0.8},
})


def _grad(*op_types: str):
    return unary(*op_types, cases=_unary_grad_cases)


_grad("Tanh")(lambda x, y, a: 1 - y * y)
_grad("Sigmoid")(lambda x, y, a: y * (1 - y))
_grad("Relu")(lambda x, y, a: (x > 0).astype(y.dtype))
_grad("LeakyRelu")(lambda x, y, a: np.where(x >= 0, 1, a.get("alpha", 0.01)).astype(y.dtype))
_grad("Elu")(lambda x, y, a: np.where(x > 0, 1, y + a.get("alpha", 1.0)).astype(y.dtype))
_grad("Celu")(lambda x, y, a: np.where(x > 0, 1, np.exp(x / a.get("alpha", 1.0))))
_grad("ThresholdedRelu")(lambda x, y, a: (x > a.get("alpha", 1.0)).astype(y.dtype))
_grad("Softplus")(lambda x, y, a: _sigmoid(x))
_grad("Softsign")(lambda x, y, a: 1 / ((1 + np.abs(x)) ** 2))


@_grad("Selu")
def _selu_grad(x, y, a):
    alpha, gamma = a.get("alpha", 1.6732632423543772), a.get("gamma", 1.0507009873554805)
    return gamma * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0)))


@_grad("HardSigmoid")
def _hardsigmoid_grad(x, y, a):
    z = a.get("alpha", 0.2) * x + a.get("beta", 0.5)
    return np.where((z > 0) & (z < 1), a.get("alpha", 0.2), 0).astype(y.dtype)


@_grad("HardSwish")
def _hardswish_grad(x, y, a):
    return np.where(x < -3, 0, np.where(x > 3, 1, x / 3 + 0.5)).astype(y.dtype)


@_grad("Shrink")
def _shrink_grad(x, y, a):
    lambd = a.get("lambd", 0.5)
    return ((x < -lambd) | (x > lambd)).astype(y.dtype)


@_grad("Mish")
def _mish_grad(x, y, a):
    sp = np.logaddexp(0, x)
    t = np.tanh(sp)
    return t + x * (1 - t * t) * _sigmoid(x)


@_grad("Gelu")
def _gelu_grad(x, y, a):
    if a.get("approximate", "none") == "tanh":
        k = math.sqrt(2 / math.pi)
        inner = k * (x + 0.044715 * x**3)
        t = np.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


@differentiable("PRelu", cases=lambda t, v: [Sample([away_from_zero(2, 3),
                                                     away_from_zero(3, seed=4)])])
def _prelu_grad(ctx, dY, **attrs):
    X, slope = ctx.inputs[:2]
    neg = X < 0
    dx = dY * np.where(neg, slope, 1)
    return fit(ctx, dx, reduce_to(np.where(neg, dY * X, 0), slope))


def _clip_grad_cases(op_type: str, since: int) -> list[Sample]:
    y = np.array([[-2.0, -0.5, 0.2], [0.9, 1.7, -1.2]])
    if since < 11:
        return [Sample([y], {"min": -1.0, "max": 1.0})]
    return [Sample([y, np.array(-1.0), np.array(1.0)]), Sample([y, None, np.array(0.5)])]


@differentiable("Clip", cases=_clip_grad_cases)
def _clip_grad(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    lo = ctx.inputs[1] if len(ctx.inputs) > 1 else attrs.get("min")
    hi = ctx.inputs[2] if len(ctx.inputs) > 2 else attrs.get("max")
    below = np.zeros(X.shape, bool) if lo is None else X < lo
    mid = X if lo is None else np.maximum(X, lo)
    above = np.zeros(X.shape, bool) if hi is None else mid > hi
    dx = np.where(below | above, 0, dY)
    dlo = np.sum(np.where(below & ~above, dY, 0))
    dhi = np.sum(np.where(above, dY, 0))
    return fit(ctx, dx, dlo, dhi)
