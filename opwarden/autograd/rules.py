"""Backward rules of the differentiable built-in operators, attached with `OpDef.grad`.

Every rule has the shape ``rule(ctx, *dYs, **attrs) -> tuple`` with one entry per input of
``ctx.inputs`` (None where the input is absent or not differentiable); dYs has one entry per
forward output (zeros for a float output nothing downstream uses, None for non-float outputs).
Rules are attached to every version of an operator whose semantics they cover.

Pure data-movement operators (Reshape, Slice, Gather, Pad, Concat, Split, ...) share one rule:
the forward reference kernel is run again on arrays of element *indices*, which tells exactly
which input element every output element came from; the gradient is a scatter-add of dY.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.autograd.core import GradContext, is_float
from opwarden.ops import REGISTRY
from opwarden.ops.conv import col2im, conv_pads, im2col, pad_spatial, spatial_params, window_slices
from opwarden.ops.elementwise import erf
from opwarden.ops.elementwise import legacy_broadcast as _legacy_b
from opwarden.ops.pool import pool_geometry as _pool_setup

Rule = Callable[..., tuple]


def _on(*op_types: str, versions: Callable[[int], bool] | None = None, domain: str = ""):
    """Attach the decorated rule to every (selected) version of each named operator."""

    def deco(fn: Rule) -> Rule:
        for t in op_types:
            for o in REGISTRY.versions(t, domain):
                if versions is None or versions(o.since):
                    o.grad(fn)
        return fn

    return deco


def _fit(ctx: GradContext, *grads: Any) -> tuple:
    """Exactly one entry per input: missing inputs get None, surplus entries are dropped."""
    n = len(ctx.inputs)
    out = list(grads[:n]) + [None] * (n - len(grads))
    return tuple(
        None if x is None or g is None or not is_float(np.asarray(x)) else _like(g, x)
        for g, x in zip(out, ctx.inputs)
    )


def _like(g: Any, x: Any) -> np.ndarray:
    """g with x's shape and dtype (g already has x's number of elements)."""
    x = np.asarray(x)
    return np.asarray(g, dtype=x.dtype).reshape(x.shape)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum g over the axes numpy broadcasting added or stretched to reach g.shape from shape."""
    g = np.asarray(g)
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _b_shape(ctx: GradContext, attrs: dict) -> tuple[int, ...]:
    """The shape input B broadcasts from: its own, or its legacy (opset < 7) alignment."""
    A, B = (np.asarray(x) for x in ctx.inputs[:2])
    if "broadcast" in attrs or ctx.op is not None and ctx.op.since < 7:
        return _legacy_b(A, B, attrs.get("broadcast", 0), attrs.get("axis")).shape
    return B.shape


def _reduce_to(g: np.ndarray, x: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    x = np.asarray(x)
    return unbroadcast(g, shape if shape is not None else x.shape).reshape(x.shape)


# ---------------------------------------------------------------- binary arithmetic


@_on("Add")
def _add(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    return _fit(ctx, _reduce_to(dY, A), _reduce_to(dY, B, _b_shape(ctx, attrs)))


@_on("Sub")
def _sub(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    return _fit(ctx, _reduce_to(dY, A), _reduce_to(-dY, B, _b_shape(ctx, attrs)))


@_on("Mul")
def _mul(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    bs = _b_shape(ctx, attrs)
    b = np.asarray(B).reshape(bs)
    return _fit(ctx, _reduce_to(dY * b, A), _reduce_to(dY * A, B, bs))


@_on("Div")
def _div(ctx, dY, **attrs):
    A, B = ctx.inputs[:2]
    bs = _b_shape(ctx, attrs)
    b = np.asarray(B).reshape(bs)
    return _fit(ctx, _reduce_to(dY / b, A), _reduce_to(-dY * A / (b * b), B, bs))


@_on("Pow")
def _pow(ctx, dY, **attrs):
    X, E = ctx.inputs[:2]
    Y = ctx.outputs[0]
    es = _b_shape(ctx, attrs)
    e = np.asarray(E).reshape(es).astype(Y.dtype)
    x = np.asarray(X).astype(Y.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = dY * e * np.power(x, e - 1)
        de = np.where(x > 0, dY * Y * np.log(np.where(x > 0, x, 1)), 0)
    return _fit(ctx, _reduce_to(dx, X), _reduce_to(de, E, es))


@_on("PRelu")
def _prelu(ctx, dY, **attrs):
    X, slope = ctx.inputs[:2]
    neg = X < 0
    dx = dY * np.where(neg, slope, 1)
    return _fit(ctx, dx, _reduce_to(np.where(neg, dY * X, 0), slope))


@_on("Where")
def _where(ctx, dY, **attrs):
    c, X, Y = ctx.inputs
    return _fit(ctx, None, _reduce_to(np.where(c, dY, 0), X), _reduce_to(np.where(c, 0, dY), Y))


@_on("Sum")
def _sum(ctx, dY, **attrs):
    return _fit(ctx, *[_reduce_to(dY, x) for x in ctx.inputs])


@_on("Mean")
def _mean(ctx, dY, **attrs):
    n = len(ctx.inputs)
    return _fit(ctx, *[_reduce_to(dY / n, x) for x in ctx.inputs])


@_on("Max", "Min")
def _maxmin(ctx, dY, **attrs):
    Y = ctx.outputs[0]
    masks = [np.broadcast_to(x, Y.shape) == Y for x in ctx.inputs]
    # Ties share the gradient evenly (the subgradient that keeps the sum right).
    count = np.maximum(sum(m.astype(Y.dtype) for m in masks), 1)
    return _fit(ctx, *[_reduce_to(dY * m / count, x) for m, x in zip(masks, ctx.inputs)])


# ---------------------------------------------------------------- unary math and activations


def _unary(*op_types: str, versions=None):
    """Register d(op)/dX as f(x, y, attrs) -> local derivative (multiplied by dY)."""

    def deco(deriv: Callable[..., Any]) -> Callable[..., Any]:
        def rule(ctx, dY, *rest, **attrs):
            X = np.asarray(ctx.inputs[0])
            Y = np.asarray(ctx.outputs[0])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return _fit(ctx, dY * deriv(X.astype(Y.dtype, copy=False), Y, attrs))

        rule.__name__ = rule.__qualname__ = f"_grad_{deriv.__name__.strip('_')}"
        _on(*op_types, versions=versions)(rule)
        return deriv

    return deco


def _c(x, v):
    return np.asarray(v, dtype=x.dtype)


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_unary("Neg")(lambda x, y, a: -np.ones_like(x))
_unary("Exp")(lambda x, y, a: y)
_unary("Log")(lambda x, y, a: 1 / x)
_unary("Sqrt")(lambda x, y, a: 0.5 / y)
_unary("Abs")(lambda x, y, a: np.sign(x))
_unary("Reciprocal")(lambda x, y, a: -y * y)
_unary("Sin")(lambda x, y, a: np.cos(x))
_unary("Cos")(lambda x, y, a: -np.sin(x))
_unary("Tan")(lambda x, y, a: 1 + y * y)
_unary("Asin")(lambda x, y, a: 1 / np.sqrt(1 - x * x))
_unary("Acos")(lambda x, y, a: -1 / np.sqrt(1 - x * x))
_unary("Atan")(lambda x, y, a: 1 / (1 + x * x))
_unary("Sinh")(lambda x, y, a: np.cosh(x))
_unary("Cosh")(lambda x, y, a: np.sinh(x))
_unary("Asinh")(lambda x, y, a: 1 / np.sqrt(x * x + 1))
_unary("Acosh")(lambda x, y, a: 1 / np.sqrt(x * x - 1))
_unary("Atanh")(lambda x, y, a: 1 / (1 - x * x))
_unary("Erf")(lambda x, y, a: _c(x, 2 / math.sqrt(math.pi)) * np.exp(-x * x))
_unary("Tanh")(lambda x, y, a: 1 - y * y)
_unary("Sigmoid")(lambda x, y, a: y * (1 - y))
_unary("Relu")(lambda x, y, a: (x > 0).astype(y.dtype))
_unary("LeakyRelu")(lambda x, y, a: np.where(x >= 0, 1, a.get("alpha", 0.01)).astype(y.dtype))
_unary("Elu")(lambda x, y, a: np.where(x > 0, 1, y + a.get("alpha", 1.0)).astype(y.dtype))
_unary("Celu")(lambda x, y, a: np.where(x > 0, 1, np.exp(x / a.get("alpha", 1.0))))
_unary("ThresholdedRelu")(lambda x, y, a: (x > a.get("alpha", 1.0)).astype(y.dtype))
_unary("Softplus")(lambda x, y, a: _sigmoid(x))
_unary("Softsign")(lambda x, y, a: 1 / ((1 + np.abs(x)) ** 2))
_unary("Floor", "Ceil", "Round", "Sign")(lambda x, y, a: np.zeros_like(y))
_unary("Identity")(lambda x, y, a: np.ones_like(y))


@_unary("Selu")
def _selu(x, y, a):
    alpha, gamma = a.get("alpha", 1.6732632423543772), a.get("gamma", 1.0507009873554805)
    return gamma * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0)))


@_unary("HardSigmoid")
def _hardsigmoid(x, y, a):
    z = a.get("alpha", 0.2) * x + a.get("beta", 0.5)
    return np.where((z > 0) & (z < 1), a.get("alpha", 0.2), 0).astype(y.dtype)


@_unary("HardSwish")
def _hardswish(x, y, a):
    return np.where(x < -3, 0, np.where(x > 3, 1, x / 3 + 0.5)).astype(y.dtype)


@_unary("Shrink")
def _shrink(x, y, a):
    lambd = a.get("lambd", 0.5)
    return ((x < -lambd) | (x > lambd)).astype(y.dtype)


@_unary("Mish")
def _mish(x, y, a):
    sp = np.logaddexp(0, x)
    t = np.tanh(sp)
    return t + x * (1 - t * t) * _sigmoid(x)


@_unary("Gelu")
def _gelu(x, y, a):
    if a.get("approximate", "none") == "tanh":
        k = math.sqrt(2 / math.pi)
        inner = k * (x + 0.044715 * x**3)
        t = np.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


@_on("Clip")
def _clip(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    lo = ctx.inputs[1] if len(ctx.inputs) > 1 else attrs.get("min")
    hi = ctx.inputs[2] if len(ctx.inputs) > 2 else attrs.get("max")
    below = np.zeros(X.shape, bool) if lo is None else X < lo
    mid = X if lo is None else np.maximum(X, lo)
    above = np.zeros(X.shape, bool) if hi is None else mid > hi
    dx = np.where(below | above, 0, dY)
    dlo = np.sum(np.where(below & ~above, dY, 0))
    dhi = np.sum(np.where(above, dY, 0))
    return _fit(ctx, dx, dlo, dhi)


@_on("Cast", "CastLike")
def _cast(ctx, dY, **attrs):
    return _fit(ctx, dY)


@_on("Dropout")
def _dropout(ctx, dY, *rest, **attrs):
    X, Y = np.asarray(ctx.inputs[0]), np.asarray(ctx.outputs[0])
    if len(ctx.inputs) > 2 and ctx.inputs[2] is not None:
        training = bool(np.asarray(ctx.inputs[2]))
    else:
        training = "is_test" in attrs and not attrs["is_test"]
    if not training:
        return _fit(ctx, dY)
    # Y = X * mask * scale: the per-element factor is Y / X (0 where X is 0 and dropped).
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(X != 0, Y / np.where(X != 0, X, 1), 0)
    return _fit(ctx, dY * factor)


@_on("CumSum")
def _cumsum(ctx, dY, **attrs):
    axis = int(np.asarray(ctx.inputs[1]).reshape(-1)[0])
    ax = axis + dY.ndim if axis < 0 else axis
    # The adjoint of a running sum runs the other way.
    if attrs.get("reverse", 0):
        g = np.cumsum(dY, axis=ax)
    else:
        g = np.flip(np.cumsum(np.flip(dY, ax), axis=ax), ax)
    if attrs.get("exclusive", 0):
        g = g - dY
    return _fit(ctx, g, None)


# ---------------------------------------------------------------- linear algebra


@_on("MatMul")
def _matmul(ctx, dY, **attrs):
    A, B = (np.asarray(x) for x in ctx.inputs)
    a = A[None, :] if A.ndim == 1 else A
    b = B[:, None] if B.ndim == 1 else B
    y_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    g = np.asarray(dY).reshape(y_shape)
    da = g @ np.swapaxes(b, -1, -2)
    db = np.swapaxes(a, -1, -2) @ g
    return _fit(ctx, unbroadcast(da, a.shape), unbroadcast(db, b.shape))


@_on("Gemm")
def _gemm(ctx, dY, **attrs):
    A, B = (np.asarray(x) for x in ctx.inputs[:2])
    C = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    a = A.T if ta else A
    b = B.T if tb else B
    da = alpha * dY @ b.T
    db = alpha * a.T @ dY
    dc = None if C is None else _reduce_to(beta * dY, C)
    return _fit(ctx, da.T if ta else da, db.T if tb else db, dc)


# ---------------------------------------------------------------- convolution and pooling


@_on("Conv")
def _conv(ctx, dY, **attrs):
    X, W = (np.asarray(x) for x in ctx.inputs[:2])
    B = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    group = int(attrs.get("group", 1) or 1)
    kernel = W.shape[2:]
    nsp = X.ndim - 2
    s, d = spatial_params(nsp, attrs.get("strides"), attrs.get("dilations"))
    begin, end = conv_pads(X.shape[2:], kernel, s, d, attrs.get("pads"), attrs.get("auto_pad"))
    out_sp = dY.shape[2:]
    n, c = X.shape[:2]
    m = W.shape[0]
    xp = pad_spatial(X.astype(dY.dtype, copy=False), begin, end)
    cols = im2col(xp, kernel, s, d, out_sp)  # (N, C, K, P)
    k, p = cols.shape[2], cols.shape[3]
    colsg = cols.reshape(n, group, (c // group) * k, p)
    gy = dY.reshape(n, group, m // group, p)
    wg = W.astype(dY.dtype, copy=False).reshape(group, m // group, (c // group) * k)
    dw = np.einsum("ngmp,ngkp->gmk", gy, colsg).reshape(W.shape)
    dcols = np.einsum("gmk,ngmp->ngkp", wg, gy).reshape((n, c, k) + tuple(out_sp))
    dxp = col2im(dcols, kernel, s, d, out_sp, xp.shape[2:])
    dx = pad_spatial(dxp, [-b for b in begin], [-e for e in end])
    db = None if B is None else dY.sum(axis=(0,) + tuple(range(2, dY.ndim)))
    return _fit(ctx, dx, dw, db)


@_on("MaxPool")
def _maxpool(ctx, dY, *rest, **attrs):
    X = np.asarray(ctx.inputs[0])
    kw = dict(attrs)
    kw["storage_order"] = 0
    kw.pop("noutputs", None)
    _, idx = ctx.op.reference(X, noutputs=2, **kw)
    dx = np.zeros(X.size, dtype=dY.dtype)
    np.add.at(dx, np.asarray(idx).reshape(-1), dY.reshape(-1))
    return _fit(ctx, dx)


@_on("AveragePool")
def _averagepool(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    kernel, s, d, begin, end, out, extra = _pool_setup(
        X.shape, attrs.get("kernel_shape"), attrs.get("strides"), attrs.get("dilations"),
        attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0),
    )
    full_end = [e + x for e, x in zip(end, extra)]
    ones = np.ones((1, 1) + X.shape[2:], dtype=dY.dtype)
    # The same divisor as the forward: real cells, or (count_include_pad) explicit pads too.
    if attrs.get("count_include_pad", 0):
        mask = pad_spatial(pad_spatial(ones, begin, end, 1), [0] * len(begin), extra)
    else:
        mask = pad_spatial(ones, begin, full_end)
    lead = (slice(None), slice(None))
    count = np.zeros((1, 1) + tuple(out), dtype=dY.dtype)
    for off in np.ndindex(*kernel):
        count += mask[lead + window_slices(off, s, d, out)]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(count > 0, dY / count, 0)
    dxp = np.zeros(X.shape[:2] + mask.shape[2:], dtype=dY.dtype)
    for off in np.ndindex(*kernel):
        dxp[lead + window_slices(off, s, d, out)] += w
    return _fit(ctx, pad_spatial(dxp, [-b for b in begin], [-e for e in full_end]))


@_on("GlobalAveragePool")
def _globalavg(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    return _fit(ctx, np.broadcast_to(dY / math.prod(X.shape[2:]), X.shape))


@_on("GlobalMaxPool")
def _globalmax(ctx, dY, **attrs):
    X, Y = np.asarray(ctx.inputs[0]), ctx.outputs[0]
    mask = X == Y
    cnt = mask.sum(axis=tuple(range(2, X.ndim)), keepdims=True)
    return _fit(ctx, dY * mask / np.maximum(cnt, 1))


# ---------------------------------------------------------------- normalization


def _per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    p = np.asarray(p)
    return p.reshape(p.shape + (1,) * (ndim - 1 - p.ndim))


@_on("BatchNormalization")
def _batchnorm(ctx, dY, *rest, **attrs):
    X, scale, B, mean, var = (np.asarray(x) for x in ctx.inputs[:5])
    dt = dY.dtype
    eps = attrs.get("epsilon", 1e-5)
    nd = X.ndim
    s, m, v = (_per_channel(p, nd).astype(dt) for p in (scale, mean, var))
    pshape = (1,) + s.shape
    red = tuple(i for i in range(nd) if i >= len(pshape) or pshape[i] == 1)
    training = len(ctx.outputs) > 1
    if not training:
        inv = 1 / np.sqrt(v + eps)
        xhat = (X - m) * inv
        gs = dY * s
        dx = gs * inv
        dscale = (dY * xhat).sum(axis=red, keepdims=True)
        dmean = -gs.sum(axis=red, keepdims=True) * inv
        dvar = -0.5 * (gs * (X - m)).sum(axis=red, keepdims=True) * inv**3
        db = dY.sum(axis=red, keepdims=True)
        return _fit(ctx, dx, dscale, db, dmean, dvar)
    # Training: batch statistics; outputs Y, running_mean, running_var[, batch mean, var].
    mom = attrs.get("momentum", 0.9)
    cnt = math.prod(X.shape[i] for i in red)
    bm = X.mean(axis=red, keepdims=True)
    bv = ((X - bm) ** 2).mean(axis=red, keepdims=True)
    inv = 1 / np.sqrt(bv + eps)
    xhat = (X - bm) * inv
    dxhat = dY * s
    dx = inv / cnt * (
        cnt * dxhat - dxhat.sum(axis=red, keepdims=True)
        - xhat * (dxhat * xhat).sum(axis=red, keepdims=True)
    )
    extra = list(rest) + [None] * 4
    drm, drv, dbm, dbv = (np.zeros(bm.shape, dt) if e is None else e.reshape(bm.shape)
                          for e in extra[:4])
    g_bm = drm * (1 - mom) + dbm
    g_bv = drv * (1 - mom) + dbv
    dx = dx + g_bm / cnt + g_bv * 2 * (X - bm) / cnt
    dscale = (dY * xhat).sum(axis=red, keepdims=True)
    db = dY.sum(axis=red, keepdims=True)
    return _fit(ctx, dx, dscale, db, drm * mom, drv * mom)


@_on("LayerNormalization")
def _layernorm(ctx, dY, *rest, **attrs):
    X = np.asarray(ctx.inputs[0])
    S = np.asarray(ctx.inputs[1])
    Bi = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    dt = dY.dtype
    axis = attrs.get("axis", -1)
    ax = axis + X.ndim if axis < 0 else axis
    axes = tuple(range(ax, X.ndim))
    cnt = math.prod(X.shape[ax:])
    x = X.astype(dt)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + attrs.get("epsilon", 1e-5))
    xhat = (x - mean) * inv
    dxhat = dY * S
    dx = inv * (
        dxhat - dxhat.mean(axis=axes, keepdims=True)
        - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)
    )
    dmean = rest[0] if len(rest) > 0 and rest[0] is not None else None
    dinv = rest[1] if len(rest) > 1 and rest[1] is not None else None
    if dmean is not None:
        dx = dx + dmean.reshape(mean.shape).astype(dt) / cnt
    if dinv is not None:
        dvar = dinv.reshape(inv.shape).astype(dt) * -0.5 * inv**3
        dx = dx + dvar * 2 * (x - mean) / cnt
    ds = _reduce_to(dY * xhat, S)
    db = None if Bi is None else _reduce_to(dY, Bi)
    return _fit(ctx, dx, ds, db)


# ---------------------------------------------------------------- softmax family


def _softmax_axis(ctx, attrs):
    """(axis, Y, coerced): opset < 13 works on the input coerced to 2-D at `axis`."""
    Y = np.asarray(ctx.outputs[0])
    axis = attrs.get("axis", 1 if ctx.op is not None and ctx.op.since < 13 else -1)
    ax = axis + Y.ndim if axis < 0 else axis
    return ax, Y, ctx.op is not None and ctx.op.since < 13


def _softmax_like(log: bool):
    def rule(ctx, dY, **attrs):
        ax, Y, coerced = _softmax_axis(ctx, attrs)
        shape = Y.shape
        if coerced:
            rows = math.prod(shape[:ax])
            Y, dy, red = Y.reshape(rows, -1), dY.reshape(rows, -1), 1
        else:
            dy, red = dY, ax
        if log:
            dx = dy - np.exp(Y) * dy.sum(axis=red, keepdims=True)
        else:
            dx = Y * (dy - (dy * Y).sum(axis=red, keepdims=True))
        return _fit(ctx, dx.reshape(shape))

    return rule


_on("Softmax")(_softmax_like(False))
_on("LogSoftmax")(_softmax_like(True))


# ---------------------------------------------------------------- reductions


def _axes(ctx, attrs) -> tuple[int, ...] | None:
    """The reduced axes (normalised), or None for 'no-op' (noop_with_empty_axes)."""
    X = np.asarray(ctx.inputs[0])
    if len(ctx.inputs) > 1 and ctx.inputs[1] is not None:
        axes = [int(a) for a in np.asarray(ctx.inputs[1]).reshape(-1)]
    else:
        a = attrs.get("axes")
        axes = [int(v) for v in a] if a is not None else []
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return tuple(range(X.ndim))
    return tuple(sorted(a + X.ndim if a < 0 else a for a in axes))


def _reduction(kind: str):
    def rule(ctx, dY, **attrs):
        X = np.asarray(ctx.inputs[0])
        Y = np.asarray(ctx.outputs[0])
        axes = _axes(ctx, attrs)
        if axes is None:
            # no reduction: these reductions act elementwise on each value
            axes = ()
        kshape = tuple(1 if i in axes else n for i, n in enumerate(X.shape))
        g = np.asarray(dY).reshape(kshape)
        y = Y.reshape(kshape)
        x = X.astype(Y.dtype)
        cnt = math.prod(X.shape[i] for i in axes)
        with np.errstate(divide="ignore", invalid="ignore"):
            if kind == "sum":
                d = np.broadcast_to(g, X.shape)
            elif kind == "mean":
                d = np.broadcast_to(g / max(cnt, 1), X.shape)
            elif kind in ("max", "min"):
                mask = x == y
                n = mask.sum(axis=axes, keepdims=True) if axes else 1
                d = g * mask / np.maximum(n, 1)
            elif kind == "prod":
                zero = x == 0
                nz = zero.sum(axis=axes, keepdims=True) if axes else zero.astype(int)
                others = np.prod(np.where(zero, 1, x), axis=axes, keepdims=True) if axes else 1
                d = np.where(zero, np.where(nz == 1, others, 0), y / np.where(zero, 1, x)) * g
            elif kind == "sumsquare":
                d = 2 * x * g
            elif kind == "l1":
                d = np.sign(x) * g
            elif kind == "l2":
                d = np.where(y != 0, x / np.where(y != 0, y, 1), 0) * g
            elif kind == "logsum":
                d = np.broadcast_to(g / np.exp(y), X.shape)
            else:  # logsumexp
                d = np.exp(x - y) * g
        return _fit(ctx, d)

    return rule


for _name, _kind in (
    ("ReduceSum", "sum"), ("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"),
    ("ReduceProd", "prod"), ("ReduceSumSquare", "sumsquare"), ("ReduceL1", "l1"),
    ("ReduceL2", "l2"), ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp"),
):
    _on(_name)(_reduction(_kind))


# ---------------------------------------------------------------- data movement (index tracing)

# op_type -> which inputs carry data (the rest are shapes, indices, ... and get None);
# "all" for every input.
_MOVEMENT: dict[str, Any] = {
    "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,),
    "Expand": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,),
    "Tile": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,), "Concat": "all", "Split": (0,),
    "Pad": (0,), "ReverseSequence": (0,), "Compress": (0,),
}


def _movement(ctx, *dys, **attrs):
    op = ctx.op
    data = range(len(ctx.inputs)) if _MOVEMENT[op.op_type] == "all" else _MOVEMENT[op.op_type]
    args = list(ctx.inputs)
    offsets: dict[int, int] = {}
    total = 0
    for i in data:
        x = ctx.inputs[i]
        if x is None:
            continue
        x = np.asarray(x)
        offsets[i] = total
        args[i] = np.arange(total, total + x.size, dtype=np.int64).reshape(x.shape)
        total += x.size
    kw = dict(attrs)
    # Padding writes -1 (no source element): its gradient goes to the padding value.
    pad_value_at = None
    if op.op_type == "Pad":
        if "value" in kw or op.since < 11:
            kw["value"] = -1
        elif len(args) > 2 and args[2] is not None:
            pad_value_at = 2
            args[2] = np.asarray(-1, dtype=np.int64).reshape(np.shape(args[2]))
        else:
            args = args[:2] + [np.asarray(-1, dtype=np.int64)] + args[3:]
    if getattr(op.variants[0], "wants_noutputs", False):
        kw["noutputs"] = len(ctx.outputs)
    src = op.reference(*args, **kw)
    src = list(src) if isinstance(src, tuple) else [src]
    flat = np.zeros(total, dtype=np.float64)
    fill = 0.0
    for sidx, g in zip(src, dys):
        if g is None:
            continue
        sidx = np.asarray(sidx).reshape(-1)
        g = np.asarray(g, dtype=np.float64).reshape(-1)
        real = sidx >= 0
        np.add.at(flat, sidx[real], g[real])
        fill += g[~real].sum()
    grads: list[Any] = [None] * len(ctx.inputs)
    for i, off in offsets.items():
        x = np.asarray(ctx.inputs[i])
        grads[i] = flat[off:off + x.size].reshape(x.shape)
    if pad_value_at is not None:
        grads[pad_value_at] = np.asarray(fill)
    return _fit(ctx, *grads)


_on(*_MOVEMENT)(_movement)


# ---------------------------------------------------------------- losses


def _nll_grad(logp, target, weight, attrs, dloss):
    """(d logp, d weight) of NegativeLogLikelihoodLoss given its upstream gradient."""
    reduction = attrs.get("reduction", "mean")
    ignore = attrs.get("ignore_index")
    t = np.asarray(target).astype(np.int64)
    keep = np.ones(t.shape, bool) if ignore is None else t != int(ignore)
    safe = np.where(keep, t, 0)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = (np.asarray(weight, logp.dtype)[safe] if weight is not None else 1) * keep
    w = np.broadcast_to(w, t.shape).astype(logp.dtype)
    up = np.asarray(dloss, logp.dtype)
    if reduction == "none":
        coef = up
        dw_term = -picked * up
    elif reduction == "sum":
        coef = np.broadcast_to(up, t.shape)
        dw_term = -picked * up
    else:
        wsum = w.sum()
        loss = (-picked * w).sum() / wsum
        coef = np.broadcast_to(up / wsum, t.shape)
        dw_term = (-picked - loss) * up / wsum
    dlogp = np.zeros_like(logp)
    np.put_along_axis(dlogp, safe[:, None], (-w * coef)[:, None], axis=1)
    dweight = None
    if weight is not None:
        dweight = np.zeros(np.shape(weight), logp.dtype)
        np.add.at(dweight, safe[keep], np.broadcast_to(dw_term, t.shape)[keep])
    return dlogp, dweight


@_on("NegativeLogLikelihoodLoss")
def _nll(ctx, dY, **attrs):
    logp = np.asarray(ctx.inputs[0]).astype(dY.dtype)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    dlogp, dw = _nll_grad(logp, ctx.inputs[1], weight, attrs, dY)
    return _fit(ctx, dlogp, None, dw)


@_on("SoftmaxCrossEntropyLoss")
def _sce(ctx, dY, *rest, **attrs):
    scores = np.asarray(ctx.inputs[0]).astype(dY.dtype)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    shifted = scores - scores.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    dlogp, dw = _nll_grad(logp, ctx.inputs[1], weight, attrs, dY)
    if rest and rest[0] is not None:
        dlogp = dlogp + rest[0]
    dscores = dlogp - np.exp(logp) * dlogp.sum(axis=1, keepdims=True)
    return _fit(ctx, dscores, None, dw)


def differentiable_ops() -> list[Any]:
    """Every registered operator version that has a backward rule."""
    return [o for o in REGISTRY.all() if o.grad_fn is not None]

