"""Float32 elementwise kernels writing into the planned buffer (which may be input 0)."""

from __future__ import annotations

import numpy as np

from opwarden.kernels.cpu.util import (
    CHUNK_TEMPS,
    RELU_SMALL,
    chunked_into,
    chunked_workspace,
    erf_f32,
    gelu_chunk,
    leaky_chunk,
)
from opwarden.kernels.cpu.util import relu as _relu
from opwarden.ops import elementwise as _reference
from opwarden.ops.base import REGISTRY

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


def _direct(ufunc, *consts, below: int | None = None):
    """Declares (execute.codegen.direct_form) that the kernel is the bare call
    ``ufunc(*inputs, *consts, out=out)`` (without a planned buffer ``ufunc(*inputs, *consts)``
    as an array): the lean loop then makes that call itself, without the kernel's frame; with
    `below`, only into buffers of fewer elements."""

    def declare(fn):
        fn.direct = lambda out: (
            (ufunc, consts) if below is None or out is None or out.size < below else None)
        return fn

    return declare


def _binary(ufunc):
    @_direct(ufunc)
    def fn(A, B, *, out=None):
        return ufunc(A, B, out=out) if out is not None else np.asarray(ufunc(A, B))

    fn.__doc__ = f"{ufunc.__name__} with NumPy broadcasting into the planned buffer."
    return fn


def div(A, B, *, out=None):
    """A / B with NumPy broadcasting into the planned buffer (x/0 gives inf or NaN quietly)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(A, B, out=out) if out is not None else np.asarray(np.divide(A, B))


@_direct(np.maximum, _ZERO, below=RELU_SMALL)
def relu(X, *, out=None):
    """max(X, 0) into the planned buffer (see util.relu)."""
    if out is None or not isinstance(X, np.ndarray):
        return np.asarray(np.maximum(X, _ZERO))
    if X.size < RELU_SMALL:  # a bare ufunc call: per-node dispatch stays minimal
        return np.maximum(X, _ZERO, out=out)
    return _relu(X, out)


@_direct(np.tanh)
def tanh(X, *, out=None):
    """tanh(X) into the planned buffer."""
    return np.tanh(X, out=out) if out is not None else np.asarray(np.tanh(X))


def leaky_relu(X, *, alpha=0.01, out=None):
    """X where X >= 0, alpha * X below, into the planned buffer, chunked (see
    util.leaky_chunk; the masked multiply it replaces took 3.1 ms on 128x3072 floats against
    ORT's 0.22)."""
    return chunked_into(leaky_chunk(np.float32(alpha)), X, out, 1)


def erf(X, *, out=None):
    """erf(X) for float32 into the planned buffer (see util._erf_chunk: a rational
    approximation within 8 float32 ulp)."""
    return erf_f32(np.asarray(X), out)


def gelu(X, *, approximate="none", out=None):
    """Gelu-20 for float32 into the planned buffer: x/2 (1 + erf(x/sqrt 2)), or its tanh form."""
    fn, ntemps = gelu_chunk(approximate == "tanh")
    return chunked_into(fn, X, out, ntemps)


def _chunk_workspace(ntemps: int):
    def rule(x, *_, approximate="none", **__) -> int:
        if not all(isinstance(d, int) for d in x):
            return 0
        k = gelu_chunk(True)[1] if approximate == "tanh" else ntemps  # (Gelu's tanh form)
        return chunked_workspace(k, int(np.prod(x, dtype=np.int64)))

    return rule


def pow_(X, Y, *, out=None):
    """X ** Y for float32 X and a one-element exponent 2, 1, -1 or 3 (x*x, x, 1/x: each the
    correctly rounded result the reference gets by rounding float64 power once); any other
    exponent, a broadcasting exponent or a planned buffer of another shape goes to the
    reference (float64 power, 16x slower than x*x)."""
    x, e = np.asarray(X), np.asarray(Y)
    if e.size == 1 and e.ndim <= x.ndim and (out is None or out.shape == x.shape):
        v = e.reshape(-1)[0]
        y = out if out is not None else np.empty_like(x)
        if v == 2:
            return np.multiply(x, x, out=y)
        if v == 1:
            np.copyto(y, x)
            return y
        if v == -1:
            with np.errstate(divide="ignore"):
                return np.divide(_ONE, x, out=y)
        if v == 3 and x.dtype == np.float32:
            # GPT-2's tanh-Gelu cubes: the float64 product (x^2 exact, x^3 within half a
            # float64 ulp) rounded once more to float32 is the reference's float64 power
            # rounded, but for double-rounding ties; powf costs 11 ns a value on AVX2.
            xd = x.astype(np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                np.multiply(xd, xd * xd, out=xd)
                np.copyto(y, xd, casting="same_kind")
            return y
    y = _reference.Pow(x, e)
    if out is not None and out.shape == y.shape:
        np.copyto(out, y)
        return out
    return y


def _pow_workspace(x, e, *_, **__) -> int:
    """Other exponents: the reference's float64 copies of X and Y, its float64 power and the
    float32 result copied into the planned buffer."""
    if not all(isinstance(d, int) for d in (*x, *e)):
        return 0
    n = int(np.prod(np.broadcast_shapes(tuple(x), tuple(e)), dtype=np.int64))
    return 8 * (int(np.prod(x, dtype=np.int64)) + int(np.prod(e, dtype=np.int64)) + n) + 4 * n


def clip_11(X, min=None, max=None, *, out=None):  # noqa: A002 - the ONNX input names
    """Clip with optional min/max inputs (opset 11+) into the planned buffer."""
    lo = -np.inf if min is None else np.float32(min)
    hi = np.inf if max is None else np.float32(max)
    # max then min: when min > max every value becomes max, as ONNX says.
    y = np.maximum(X, lo, out=out if out is not None else np.empty_like(X))
    return np.minimum(y, hi, out=y)


def clip_6(X, *, min=-3.4028234663852886e38, max=3.4028234663852886e38, out=None):  # noqa: A002
    """Clip with min/max attributes (opset 6) into the planned buffer."""
    return clip_11(X, np.float32(min), np.float32(max), out=out)


def sum_(*Xs, out=None):
    """Elementwise sum of the inputs into the planned buffer."""
    if len(Xs) == 1:
        if out is None:
            return np.array(Xs[0], copy=True)
        if out is not Xs[0]:
            np.copyto(out, Xs[0])
        return out
    y = np.add(Xs[0], Xs[1], out=out) if out is not None else np.add(Xs[0], Xs[1])
    for x in Xs[2:]:
        try:
            np.add(y, x, out=y)
        except ValueError:  # a later input broadcasts the sum up (no planned buffer then)
            y = np.add(y, x)
    return np.asarray(y)


def register() -> None:
    """Register the elementwise variants (layout-agnostic) on the versions they implement."""
    # Every kernel here writes through ufunc out= only, so a strided out (a slice of a Concat's
    # output, see opwarden/memory/lifetimes.py) is as good as a contiguous one.
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True,
          "strided_out": True}
    unary = {"Relu": relu, "Tanh": tanh, "LeakyRelu": leaky_relu,
             "Erf": erf, "Gelu": gelu}
    for op_type, fn in unary.items():
        # Chunked kernels: float32 temporaries of one chunk each (util.chunked).
        ws = _chunk_workspace(CHUNK_TEMPS[op_type]) if op_type in CHUNK_TEMPS else None
        for opdef in REGISTRY.versions(op_type):
            opdef.kernel(name=f"{op_type.lower()}.cpu.out", workspace_bytes=ws, **kw)(fn)
    for opdef in REGISTRY.versions("Clip"):
        opdef.kernel(name="clip.cpu.out", **kw)(clip_11 if opdef.since >= 11 else clip_6)
    for op_type, fn in (("Add", _binary(np.add)), ("Sub", _binary(np.subtract)),
                        ("Mul", _binary(np.multiply)), ("Div", div)):
        for opdef in REGISTRY.versions(op_type):
            if opdef.since >= 7:  # version 6's legacy broadcast/axis stays on the reference
                opdef.kernel(name=f"{op_type.lower()}.cpu.out", **kw)(fn)
    for opdef in REGISTRY.versions("Pow"):
        if opdef.since >= 7:  # (version 1's legacy broadcast stays on the reference)
            opdef.kernel(name="pow.cpu.out", workspace_bytes=_pow_workspace,
                         **dict(kw, dtypes={"T": ["float32"]}))(pow_)
    for opdef in REGISTRY.versions("Sum"):
        opdef.kernel(name="sum.cpu.out", **kw)(sum_)
