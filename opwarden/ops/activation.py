"""Operators: activation family."""

import math

import numpy as np

from opwarden.contract import UNARY, Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.elementwise import erf


def _wide(x: np.ndarray) -> np.ndarray:
    """Floats narrower than 32 bits are computed in float32 and rounded once at the end."""
    if x.dtype.kind != "f" and not x.dtype.name.startswith(("bfloat", "float")):
        return x
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


def _apply(fn, X: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """fn on the (widened) inputs, result in X's dtype, without floating-point warnings."""
    with np.errstate(all="ignore"):
        r = fn(_wide(X), *(_wide(m) for m in more))
        return np.asarray(r).astype(X.dtype, copy=False)


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
    maximum with a scalar (or any broadcast) operand takes a slow loop, 1.5-2.5x slower than
    two contiguous float32 operands on cache-resident tensors (measured on conv outputs of
    40 KB-3 MB); RELU_CHUNK-float chunks keep the zeros in L1/L2. Same results, NaN included.
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
    return _apply(lambda x: np.where(x < 0, _c(x, alpha) * x, x), X)


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
    return _apply(lambda x, s: np.where(x < 0, s * x, x), X, slope)


@op("Elu", since=6, contract=UNARY)
def Elu(X, *, alpha=1.0):
    """X for X >= 0, alpha*(e^X - 1) below (ONNX Elu-6/22)."""
    return _apply(lambda x: np.where(x < 0, _c(x, alpha) * np.expm1(x), x), X)


@op("Selu", since=6, contract=UNARY)
def Selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """gamma*X for X > 0, gamma*alpha*(e^X - 1) otherwise (ONNX Selu-6/22)."""

    def f(x):
        return _c(x, gamma) * np.where(x > 0, x, _c(x, alpha) * np.expm1(x))

    return _apply(f, X)


@op("Celu", since=12, contract=UNARY)
def Celu(X, *, alpha=1.0):
    """max(0, X) + min(0, alpha*(e^(X/alpha) - 1)) (ONNX Celu-12/28)."""
    if alpha == 0:
        raise KernelError("Celu: alpha must be nonzero")

    def f(x):
        a = _c(x, alpha)
        return np.maximum(x, _c(x, 0)) + np.minimum(_c(x, 0), a * np.expm1(x / a))

    return _apply(f, X)


@op("Sigmoid", since=6, contract=UNARY)
def Sigmoid(X):
    """1 / (1 + e^-X) (ONNX Sigmoid-6/13)."""
    return _apply(_sigmoid, X)


@op("HardSigmoid", since=6, contract=UNARY)
def HardSigmoid(X, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha*X + beta)) (ONNX HardSigmoid-6/22)."""
    return _apply(lambda x: np.clip(_c(x, alpha) * x + _c(x, beta), 0, 1), X)


@op("HardSwish", since=14, contract=UNARY)
def HardSwish(X):
    """X * max(0, min(1, X/6 + 1/2)) (ONNX HardSwish-14/22)."""
    return _apply(lambda x: x * np.clip(x / _c(x, 6) + _c(x, 0.5), 0, 1), X)


@op("Softplus", since=1, contract=UNARY)
def Softplus(X):
    """ln(1 + e^X) (ONNX Softplus-1/22)."""
    return _apply(_softplus, X)


@op("Softsign", since=1, contract=UNARY)
def Softsign(X):
    """X / (1 + |X|) (ONNX Softsign-1/22)."""
    return _apply(lambda x: x / (_c(x, 1) + np.abs(x)), X)


@op("Tanh", since=6, contract=UNARY)
def Tanh(X):
    """Hyperbolic tangent (ONNX Tanh-6/13)."""
    return _apply(np.tanh, X)


@op("ThresholdedRelu", since=10, contract=_SUPPRESS)
def ThresholdedRelu(X, *, alpha=1.0):
    """X where X > alpha, else 0 (NaN fails the test and gives 0) (ONNX ThresholdedRelu-10/22)."""
    return _apply(lambda x: np.where(x > _c(x, alpha), x, _c(x, 0)), X)


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

    return _apply(f, X)


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

    return _apply(exact if approximate == "none" else tanh, X)


@op("Mish", since=18, contract=UNARY)
def Mish(X):
    """X * tanh(ln(1 + e^X)) (ONNX Mish-18/22)."""
    return _apply(lambda x: x * np.tanh(_softplus(x)), X)


@op("Swish", since=24, contract=UNARY)
def Swish(X, *, alpha=1.0):
    """X * sigmoid(alpha*X) (ONNX Swish-24)."""
    return _apply(lambda x: x * _sigmoid(_c(x, alpha) * x), X)


@op("SwiGLU", since=28, contract=Contract(may_alias=((0, 0), (1, 0))))
def SwiGLU(A, B, *, alpha=1.0):
    """Swish_alpha(A) * B for A and B of the same shape (ONNX SwiGLU-28)."""
    if A.shape != B.shape:
        raise KernelError(f"SwiGLU: A of shape {A.shape} and B of shape {B.shape} differ")
    return _apply(lambda a, b: a * _sigmoid(_c(a, alpha) * a) * b, A, B)


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
