"""Operators: norm family (BatchNormalization, Layer/Group/Instance/RMS normalization, LRN,
MeanVarianceNormalization, LpNormalization)."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of, such_that
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import HALF_FLOATS, axis_index, wide_half
from opwarden.ops.grad import away_from_zero, differentiable, fit, positive, reduce_to


def _out(y, dtype) -> np.ndarray:
    return np.asarray(np.asarray(y).astype(dtype, copy=False))


def _per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    """Shape a per-channel parameter (C) or (C, D1..Dk) to broadcast against (N, C, D1..Dk)."""
    p = np.asarray(p)
    return p.reshape(p.shape + (1,) * (ndim - 1 - p.ndim))


def _stash(stash_type: int) -> np.dtype:
    try:
        dt = np_dtype(int(stash_type))
    except KeyError:
        raise KernelError(f"stash_type {stash_type} is not a tensor element type") from None
    if dt.kind != "f" and dt not in HALF_FLOATS:
        raise KernelError(f"stash_type {stash_type} is not a floating-point type")
    return dt


# ---------------------------------------------------------------- BatchNormalization

BN_1 = Contract(nan="propagate", allowed={"is_test": one_of(0, 1), "spatial": one_of(0, 1)})
BN_7 = Contract(nan="propagate", allowed={"spatial": one_of(0, 1)})
BN_14 = Contract(nan="propagate", allowed={"training_mode": one_of(0, 1)})


def _bn_check(X, *params):
    if X.ndim < 2:
        raise KernelError(f"BatchNormalization needs X of rank >= 2, got shape {X.shape}")
    c = X.shape[1]
    for name, p in zip(("scale", "B", "mean", "var"), params):
        if np.asarray(p).shape[:1] != (c,):
            raise KernelError(f"BatchNormalization: {name} has shape {p.shape}, needs C={c} first")


def _bn_infer(X, scale, B, mean, var, epsilon) -> np.ndarray:
    """y = (x - mean) / sqrt(var + eps) * scale + B with parameters on axis 1."""
    _bn_check(X, scale, B, mean, var)
    x = wide_half(X)
    n = x.ndim
    s, b, m, v = (
        _per_channel(wide_half(p).astype(x.dtype, copy=False), n) for p in (scale, B, mean, var)
    )
    y = (x - m) / np.sqrt(v + x.dtype.type(epsilon)) * s + b
    return _out(y, X.dtype)


def _bn_train(X, scale, B, mean, var, epsilon, momentum, spatial=True):
    """Normalise with the batch statistics; also the updated running statistics.

    Returns (Y, running_mean, running_var, batch_mean, batch_var). The batch variance is the
    population variance (divided by N, not N - 1), as the spec states.
    """
    _bn_check(X, scale, B, mean, var)
    x = wide_half(X)
    n = x.ndim
    # spatial: one statistic per channel; otherwise one per (channel, position), over N only.
    axes = (0,) + tuple(range(2, n)) if spatial else (0,)
    bm = np.mean(x, axis=axes, keepdims=True)
    bv = np.mean((x - bm) ** 2, axis=axes, keepdims=True)
    s, b = (_per_channel(wide_half(p).astype(x.dtype, copy=False), n) for p in (scale, B))
    y = (x - bm) / np.sqrt(bv + x.dtype.type(epsilon)) * s + b
    bm = bm.reshape(np.asarray(mean).shape)
    bv = bv.reshape(np.asarray(var).shape)
    mom = x.dtype.type(momentum)
    rm = wide_half(mean) * mom + bm * (1 - mom)
    rv = wide_half(var) * mom + bv * (1 - mom)
    mdt, vdt = np.asarray(mean).dtype, np.asarray(var).dtype
    return _out(y, X.dtype), _out(rm, mdt), _out(rv, vdt), _out(bm, mdt), _out(bv, vdt)


@op("BatchNormalization", since=1, layout_inputs=(0,), contract=BN_1)
def BatchNormalization_1(
    X,
    scale,
    B,
    mean,
    var,
    *,
    epsilon=1e-5,
    momentum=0.9,
    is_test=0,
    spatial=1,
    consumed_inputs=None,
    noutputs=1,
):
    """Batch normalization; training (5 outputs) unless is_test or one output
    (ONNX BatchNormalization-1/6)."""
    if is_test or noutputs <= 1:
        return _bn_infer(X, scale, B, mean, var, epsilon)
    return _bn_train(X, scale, B, mean, var, epsilon, momentum, bool(spatial))


@op("BatchNormalization", since=7, layout_inputs=(0,), contract=BN_7)
def BatchNormalization_7(
    X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, noutputs=1
):
    """Batch normalization; test mode with one output, training with five; `spatial`=0 takes
    (C, D1..Dk) parameters (ONNX BatchNormalization-7/9, 9 drops `spatial`)."""
    if noutputs <= 1:
        return _bn_infer(X, scale, B, mean, var, epsilon)
    return _bn_train(X, scale, B, mean, var, epsilon, momentum, bool(spatial))


@op("BatchNormalization", since=14, layout_inputs=(0,), contract=BN_14)
def BatchNormalization(
    X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0
):
    """Batch normalization with estimated statistics, or batch statistics and updated running
    statistics when training_mode (ONNX BatchNormalization-14/15)."""
    if not training_mode:
        return _bn_infer(X, scale, B, input_mean, input_var, epsilon)
    y, rm, rv, _, _ = _bn_train(X, scale, B, input_mean, input_var, epsilon, momentum)
    return y, rm, rv


# ---------------------------------------------------------------- Layer / RMS normalization

LAYER = Contract(nan="propagate", broadcast="unidirectional")


def _standardize_tail(x: np.ndarray, axis: int, epsilon: float):
    """(normalized, mean, inv_std_dev) over axes [axis, rank) of x, in x's dtype."""
    axes = tuple(range(axis, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + x.dtype.type(epsilon))
    return d * inv, mean, inv.astype(x.dtype, copy=False)


@op("LayerNormalization", since=17, contract=LAYER)
def LayerNormalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Standardise over axes [axis, rank), then scale and shift (ONNX LayerNormalization-17).

    Stage one (mean, variance, normalisation) runs in `stash_type`; Mean and InvStdDev are
    returned in that type with shape [d0..d(axis-1), 1, ..., 1].
    """
    X = np.asarray(X)
    if X.ndim == 0:
        raise KernelError("LayerNormalization needs an input of rank >= 1")
    ax = axis_index(axis, X.ndim)
    u = _stash(stash_type)
    normalized, mean, inv = _standardize_tail(X.astype(u), ax, epsilon)
    try:
        # Stage two in X's type; float16/bfloat16 in float32 without rounding the normalized
        # value first (ONNX Runtime's kernel rounds once, at the end).
        y = (normalized.astype(np.float32) if X.dtype in HALF_FLOATS
             else normalized.astype(X.dtype)) * wide_half(Scale)
        if B is not None:
            y = y + wide_half(B)
        np.broadcast_shapes(y.shape, X.shape)
    except ValueError:
        raise KernelError(
            f"LayerNormalization: Scale {np.shape(Scale)} / B {np.shape(B)} do not broadcast "
            f"to X {X.shape}"
        ) from None
    if y.shape != X.shape:
        raise KernelError(f"LayerNormalization: Scale/B would change X's shape {X.shape}")
    return _out(y, X.dtype), mean, inv


@op("RMSNormalization", since=23, contract=LAYER)
def RMSNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """X / sqrt(mean(X^2 over axes [axis, rank)) + eps) * scale (ONNX RMSNormalization-23)."""
    X = np.asarray(X)
    if X.ndim == 0:
        raise KernelError("RMSNormalization needs an input of rank >= 1")
    ax = axis_index(axis, X.ndim)
    xu = X.astype(_stash(stash_type))
    axes = tuple(range(ax, X.ndim))
    rms = np.sqrt(np.mean(xu * xu, axis=axes, keepdims=True) + xu.dtype.type(epsilon))
    # The normalized value is rounded to X's type before the (type V) scale multiplies it.
    normalized = (xu / rms).astype(X.dtype)
    out_dt = np.asarray(scale).dtype
    try:
        y = wide_half(normalized.astype(out_dt)) * wide_half(scale)
    except ValueError:
        raise KernelError(
            f"RMSNormalization: scale {np.shape(scale)} does not broadcast to X {X.shape}"
        ) from None
    if y.shape != X.shape:
        raise KernelError(f"RMSNormalization: scale would change X's shape {X.shape}")
    return _out(y, out_dt)


# ---------------------------------------------------------------- Group / Instance normalization

GROUP = Contract(nan="propagate", allowed={"num_groups": such_that(lambda g: g > 0, "> 0")})


def _group_standardize(x: np.ndarray, groups: int, epsilon: float) -> np.ndarray:
    """Standardise x (N, C, ...) per instance per group of C/groups channels."""
    n, c = x.shape[:2]
    if groups <= 0 or c % groups:
        raise KernelError(f"num_groups={groups} does not divide the {c} channels")
    g = x.reshape(n, groups, -1)
    mean = np.mean(g, axis=2, keepdims=True)
    d = g - mean
    var = np.mean(d * d, axis=2, keepdims=True)
    return (d / np.sqrt(var + x.dtype.type(epsilon))).reshape(x.shape)


def _check_nc(X, name: str):
    if X.ndim < 2:
        raise KernelError(f"{name} needs X of shape (N, C, ...), got {X.shape}")


@op("GroupNormalization", since=18, layout_inputs=(0,), contract=GROUP)
def GroupNormalization_18(X, scale, bias, *, num_groups=None, epsilon=1e-5):
    """Group normalization with scale and bias given per group (ONNX GroupNormalization-18)."""
    X = np.asarray(X)
    _check_nc(X, "GroupNormalization")
    if num_groups is None:
        raise KernelError("GroupNormalization needs the attribute num_groups")
    for name, p in (("scale", scale), ("bias", bias)):
        if np.asarray(p).shape != (num_groups,):
            raise KernelError(f"{name} has shape {np.shape(p)}, expected ({num_groups},)")
    x = wide_half(X)
    normalized = _group_standardize(x, num_groups, epsilon)
    # Each group's scale/bias applies to every channel of the group.
    shape = (X.shape[0], num_groups, -1)
    s = wide_half(scale).reshape(1, num_groups, 1)
    b = wide_half(bias).reshape(1, num_groups, 1)
    y = normalized.reshape(shape) * s + b
    return _out(y.reshape(X.shape), X.dtype)


@op("GroupNormalization", since=21, layout_inputs=(0,), contract=GROUP)
def GroupNormalization(X, scale, bias, *, num_groups=None, epsilon=1e-5, stash_type=1):
    """Group normalization with scale and bias per channel; stage one in `stash_type`
    (ONNX GroupNormalization-21)."""
    X = np.asarray(X)
    _check_nc(X, "GroupNormalization")
    if num_groups is None:
        raise KernelError("GroupNormalization needs the attribute num_groups")
    c = X.shape[1]
    for name, p in (("scale", scale), ("bias", bias)):
        if np.asarray(p).shape != (c,):
            raise KernelError(f"{name} has shape {np.shape(p)}, expected ({c},)")
    normalized = _group_standardize(X.astype(_stash(stash_type)), num_groups, epsilon)
    normalized = wide_half(normalized.astype(X.dtype))
    y = normalized * _per_channel(wide_half(scale), X.ndim) + _per_channel(wide_half(bias), X.ndim)
    return _out(y, X.dtype)


INSTANCE = Contract(nan="propagate")


@op("InstanceNormalization", since=1, layout_inputs=(0,), contract=INSTANCE)
def InstanceNormalization(input, scale, B, *, epsilon=1e-5, consumed_inputs=None):
    """Standardise each (instance, channel) over its spatial axes, then per-channel scale and
    shift (ONNX InstanceNormalization-1/6/22)."""
    X = np.asarray(input)
    _check_nc(X, "InstanceNormalization")
    c = X.shape[1]
    for name, p in (("scale", scale), ("B", B)):
        if np.asarray(p).shape != (c,):
            raise KernelError(f"{name} has shape {np.shape(p)}, expected ({c},)")
    x = wide_half(X)
    axes = tuple(range(2, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + x.dtype.type(epsilon))
    y = y * _per_channel(wide_half(scale), x.ndim) + _per_channel(wide_half(B), x.ndim)
    return _out(y, X.dtype)


# ---------------------------------------------------------------- LRN


def _lrn_workspace(x_shape, **_attrs) -> int:
    # Squares and their prefix sum along C (float32 or wider): about two more copies of X.
    n = int(np.prod(x_shape, dtype=np.int64))
    return 2 * 8 * n


LRN_C = Contract(
    nan="propagate",
    workspace_bytes=_lrn_workspace,
    allowed={"size": such_that(lambda s: s >= 1, ">= 1")},
)


@op("LRN", since=1, layout_inputs=(0,), contract=LRN_C)
def LRN(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None):
    """Local response normalization across channels:
    y = x / (bias + alpha / size * square_sum) ** beta (ONNX LRN-1/13)."""
    X = np.asarray(X)
    if size is None:
        raise KernelError("LRN needs the attribute size")
    _check_nc(X, "LRN")
    x = wide_half(X)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size // 2  # floor((size-1)/2) before c, ceil((size-1)/2) after
    # square_sum over the window [c - lo, c + hi] clipped to [0, C-1], as shifted-slice sums:
    # a prefix sum's differences would spread a NaN (or an inf) to every later channel's
    # window and cancel digits over many channels.
    sq = x * x
    square_sum = sq.copy()
    for k in range(1, min(lo, c - 1) + 1):
        square_sum[:, k:] += sq[:, :c - k]
    for k in range(1, min(hi, c - 1) + 1):
        square_sum[:, :c - k] += sq[:, k:]
    t = x.dtype.type
    with np.errstate(all="ignore"):  # (inf / inf: NaN, as IEEE says, quietly)
        y = x / (t(bias) + t(alpha) / t(size) * square_sum) ** t(beta)
    return _out(y, X.dtype)


# ---------------------------------------------------------------- MVN / LpNormalization

MVN = Contract(nan="propagate")


@op("MeanVarianceNormalization", since=9, contract=MVN)
def MeanVarianceNormalization(X, *, axes=(0, 2, 3)):
    """(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes`
    (ONNX MeanVarianceNormalization-9/13, as its function body computes it)."""
    X = np.asarray(X)
    ax = tuple(sorted({axis_index(int(a), X.ndim) for a in axes}))
    x = wide_half(X)
    mean = np.mean(x, axis=ax, keepdims=True)
    mean_sq = np.mean(x * x, axis=ax, keepdims=True)
    # Rounding can make E[X^2] - E[X]^2 slightly negative; the variance is >= 0.
    std = np.sqrt(np.maximum(mean_sq - mean * mean, 0))
    y = (x - mean) / (std + x.dtype.type(1e-9))
    return _out(y, X.dtype)


LP = Contract(nan="propagate", allowed={"p": one_of(1, 2)})


@op("LpNormalization", since=1, contract=LP)
def LpNormalization(input, *, axis=-1, p=2):
    """input / Lp_norm(input, axis), 0 where the norm is 0 (ONNX LpNormalization-1/22)."""
    X = np.asarray(input)
    if X.ndim == 0:
        raise KernelError("LpNormalization needs an input of rank >= 1")
    ax = axis_index(axis, X.ndim)
    x = wide_half(X)
    if p == 1:
        norm = np.sum(np.abs(x), axis=ax, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.sum(x * x, axis=ax, keepdims=True))
    else:
        raise KernelError(f"LpNormalization supports p=1 or p=2, got {p}")
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, x.dtype.type(0), x / norm)
    return _out(y, X.dtype)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    p = np.asarray(p)
    return p.reshape(p.shape + (1,) * (ndim - 1 - p.ndim))


def _bn_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = away_from_zero(2, 3, 4, 2)
    params = [away_from_zero(3, seed=2), away_from_zero(3, seed=3), away_from_zero(3, seed=4),
              positive(3, seed=5)]
    out = [Sample([x, *params], {"epsilon": 1e-3})]
    if since >= 14:
        out.append(Sample([x, *params], {"training_mode": 1}, noutputs=3, label="training"))
    return out


@differentiable("BatchNormalization", cases=_bn_grad_cases)
def _batchnorm_grad(ctx, dY, *rest, **attrs):
    X, scale, B, mean, var = (np.asarray(x) for x in ctx.inputs[:5])
    dt = dY.dtype
    eps = attrs.get("epsilon", 1e-5)
    nd = X.ndim
    s, m, v = (_per_channel(p, nd).astype(dt) for p in (scale, mean, var))
    pshape = (1,) + s.shape
    red = tuple(i for i in range(nd) if i >= len(pshape) or pshape[i] == 1)
    if len(ctx.outputs) > 1:
        return _batchnorm_training_grad(ctx, dY, rest, X, s, red, eps, attrs)
    inv = 1 / np.sqrt(v + eps)
    xhat = (X - m) * inv
    gs = dY * s
    dx = gs * inv
    dscale = (dY * xhat).sum(axis=red, keepdims=True)
    dmean = -gs.sum(axis=red, keepdims=True) * inv
    dvar = -0.5 * (gs * (X - m)).sum(axis=red, keepdims=True) * inv**3
    db = dY.sum(axis=red, keepdims=True)
    return fit(ctx, dx, dscale, db, dmean, dvar)


def _batchnorm_training_grad(ctx, dY, rest, X, s, red, eps, attrs):
    # Batch statistics; outputs Y, running_mean, running_var[, batch mean, var].
    dt = dY.dtype
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
    return fit(ctx, dx, dscale, db, drm * mom, drv * mom)


def _layernorm_grad_cases(op_type: str, since: int) -> list[Sample]:
    r = away_from_zero
    return [Sample([r(2, 3, 4), r(4, seed=2), r(4, seed=3)], {"stash_type": 11}, noutputs=3),
            Sample([r(2, 3, 4), r(3, 4, seed=2)], {"axis": 1, "stash_type": 11})]


@differentiable("LayerNormalization", cases=_layernorm_grad_cases)
def _layernorm_grad(ctx, dY, *rest, **attrs):
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
    ds = reduce_to(dY * xhat, S)
    db = None if Bi is None else reduce_to(dY, Bi)
    return fit(ctx, dx, ds, db)
