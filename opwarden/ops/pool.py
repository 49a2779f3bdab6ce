"""Operators: pool family (MaxPool, AveragePool, LpPool, Global*Pool, MaxUnpool, MaxRoiPool).

Windowed pools pad the input once, then fold one strided view per kernel offset into the
result; the only Python loops are over kernel offsets (and, in MaxRoiPool, over bins).
"""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.conv import (
    AUTO_PAD,
    acc_dtype,
    explicit_pads,
    pad_spatial,
    spatial_params,
    split_same,
    window_slices,
)
from opwarden.ops.grad import away_from_zero, differentiable, fit

_BIT = one_of(0, 1)


def _pool_geometry(in_sp, kernel, strides, dilations, pads, auto_pad, ceil_mode):
    """(pads begin, pads end, output spatial shape) of a pooling window (ONNX pooling rules).

    With ceil_mode, a last window that would start inside the end padding is dropped, as the
    spec (and PyTorch/ORT) do. auto_pad gives the same shape whatever ceil_mode says.
    """
    nsp = len(in_sp)
    begin, end, out = [], [], []
    given_b, given_e = explicit_pads(nsp, pads)
    for i, (n, k, s, d) in enumerate(zip(in_sp, kernel, strides, dilations)):
        eff = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            b, e = split_same(max(0, (o - 1) * s + eff - n), auto_pad)
        elif auto_pad == "VALID":
            b, e = 0, 0
            o = (n - eff) // s + 1
        else:
            b, e = given_b[i], given_e[i]
            span = n + b + e - eff
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= n + b:
                o -= 1
        if o < 1:
            raise KernelError(
                f"pooling window {list(kernel)} (dilations {list(dilations)}) does not fit "
                f"input {list(in_sp)} with pads {given_b + given_e}"
            )
        begin.append(b)
        end.append(e)
        out.append(o)
    return begin, end, out


def pool_geometry(shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """Validated geometry: (kernel, strides, dilations, begin, end, out, extra end pad)."""
    if len(shape) < 3:
        raise KernelError(f"pooling input must be (N, C, *spatial), got shape {tuple(shape)}")
    nsp = len(shape) - 2
    if not kernel_shape or len(kernel_shape) != nsp:
        raise KernelError(f"kernel_shape {kernel_shape} must have {nsp} values (spatial rank)")
    kernel = [int(k) for k in kernel_shape]
    s, d = spatial_params(nsp, strides, dilations)
    begin, end, out = _pool_geometry(shape[2:], kernel, s, d, pads, auto_pad, ceil_mode)
    # ceil_mode windows may run past the end padding: pad further (never counted as input).
    extra = [
        max(0, (o - 1) * si + (k - 1) * di + 1 - (n + b + e))
        for n, k, si, di, b, e, o in zip(shape[2:], kernel, s, d, begin, end, out)
    ]
    return kernel, s, d, begin, end, out, extra


def _pool_workspace(x, *rest, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                    pads=None, strides=None, **_):
    """The padded input copy plus two output-sized accumulators, as float64 bytes."""
    if len(x) < 3 or not all(isinstance(v, int) for v in x):
        return 0
    try:
        _k, _s, _d, begin, end, out, extra = pool_geometry(
            x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
        )
    except KernelError:
        return 0
    padded = math.prod(n + b + e + t for n, b, e, t in zip(x[2:], begin, end, extra))
    return int(x[0] * x[1] * (padded + 2 * math.prod(out)) * 8)


def _lowest(dtype: np.dtype):
    """The value a max-pool pads with: -inf for floats, the minimum for integers."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _windows(xp: np.ndarray, kernel, strides, dilations, out_sp):
    """(offset index, offset, strided view) for every kernel offset over padded xp."""
    lead = (slice(None),) * (xp.ndim - len(kernel))
    for j, off in enumerate(np.ndindex(*kernel)):
        yield j, off, xp[lead + window_slices(off, strides, dilations, out_sp)]


# ---------------------------------------------------------------------------------------------
# MaxPool


def _argmax_to_index(arg, off_table, begin, strides, out_sp, in_sp, nc, storage_order):
    """Flat indices into the unpadded input (N*C*prod(in)) of the chosen kernel offsets."""
    nsp = len(in_sp)
    grid = np.meshgrid(*[np.arange(o) * s - b for o, s, b in zip(out_sp, strides, begin)],
                       indexing="ij")
    coords = [grid[i] + off_table[arg, i] for i in range(nsp)]
    flat = np.zeros(arg.shape, dtype=np.int64)
    if storage_order == 0:
        for c, n in zip(coords, in_sp):
            flat = flat * n + c
    else:
        # Column-major over the spatial axes only: the first spatial axis varies fastest.
        for c, n in zip(reversed(coords), reversed(in_sp)):
            flat = flat * n + c
    base = np.arange(nc, dtype=np.int64).reshape(arg.shape[:2]) * math.prod(in_sp)
    return flat + base.reshape(arg.shape[:2] + (1,) * nsp)


def _maxpool(
    X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
    storage_order=0, strides=None, noutputs=1,
):
    """N-D max pooling, optional argmax Indices (ONNX MaxPool-1/8/10/11/12/22)."""
    kernel, s, d, begin, end, out, extra = pool_geometry(
        X.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    full_end = [e + x for e, x in zip(end, extra)]
    xp = pad_spatial(X, begin, full_end, _lowest(X.dtype))
    y = None
    if noutputs <= 1:
        for _j, _off, v in _windows(xp, kernel, s, d, out):
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return y
    # Indices: ties keep the first offset (strictly greater wins, as ORT does), and a padded
    # cell (which holds the lowest value) is chosen only until the window's first real cell.
    real = pad_spatial(np.ones((1, 1) + X.shape[2:], dtype=bool), begin, full_end, False)
    arg = np.zeros((X.shape[0], X.shape[1]) + tuple(out), dtype=np.int64)
    seen = np.zeros((1, 1) + tuple(out), dtype=bool)
    for (j, _off, v), (_, _, r) in zip(_windows(xp, kernel, s, d, out),
                                       _windows(real, kernel, s, d, out)):
        if y is None:
            y = v.copy()
        else:
            arg[(v > y) | (r & ~seen)] = j
            np.maximum(y, v, out=y)
        seen |= r
    off_table = np.array(list(np.ndindex(*kernel)), dtype=np.int64) * np.array(d, np.int64)
    idx = _argmax_to_index(arg, off_table, begin, s, out, X.shape[2:],
                           X.shape[0] * X.shape[1], int(storage_order))
    return y, idx


_MAXPOOL_ALLOWED = {"auto_pad": AUTO_PAD}
MaxPool_1 = op("MaxPool", since=1, layout_inputs=(0,), contract=Contract(
    layout="NCHW", workspace_bytes=_pool_workspace, allowed=_MAXPOOL_ALLOWED
))(
    _maxpool
)
for _v, _extra in ((8, {}), (10, {"ceil_mode": _BIT}), (11, {"ceil_mode": _BIT}),
                   (12, {"ceil_mode": _BIT})):
    # Later versions only add attributes (defaults keep the old behaviour) and dtypes.
    op("MaxPool", since=_v, layout_inputs=(0,), contract=Contract(
        layout="NCHW", workspace_bytes=_pool_workspace,
        allowed={**_MAXPOOL_ALLOWED, "storage_order": _BIT, **_extra}
    ))(_maxpool)


# ---------------------------------------------------------------------------------------------
# AveragePool and LpPool


def _window_sum(xp, kernel, strides, dilations, out):
    total = None
    for _j, _off, v in _windows(xp, kernel, strides, dilations, out):
        total = v.copy() if total is None else total + v
    return total


def _averagepool(
    X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
    kernel_shape=None, pads=None, strides=None,
):
    """N-D average pooling (ONNX AveragePool-1/7/10/11/19/22)."""
    kernel, s, d, begin, end, out, extra = pool_geometry(
        X.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    acc = acc_dtype(X.dtype)
    full_end = [e + x for e, x in zip(end, extra)]
    xp = pad_spatial(X.astype(acc, copy=False), begin, full_end)
    total = _window_sum(xp, kernel, s, d, out)
    # Divisor: the window's elements that lie in the input, or (count_include_pad) in the
    # explicitly padded input; the ceil_mode extension never counts.
    in_sp = X.shape[2:]
    ones = np.ones((1, 1) + tuple(in_sp), dtype=acc)
    if count_include_pad:
        ones = pad_spatial(ones, begin, end, 1)
        mask = pad_spatial(ones, [0] * len(in_sp), extra)
    else:
        mask = pad_spatial(ones, begin, full_end)
    count = _window_sum(mask, kernel, s, d, out)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).astype(X.dtype, copy=False)


_AVG_ALLOWED = {"auto_pad": AUTO_PAD}
AveragePool_1 = op("AveragePool", since=1, layout_inputs=(0,), contract=Contract(
    layout="NCHW", nan="produce", workspace_bytes=_pool_workspace, allowed=_AVG_ALLOWED
))(_averagepool)
for _v, _extra in ((7, {}), (10, {"ceil_mode": _BIT}), (11, {"ceil_mode": _BIT}),
                   (19, {"ceil_mode": _BIT})):
    # nan="produce": a window wholly in the padding (pads >= kernel) averages 0/0.
    op("AveragePool", since=_v, layout_inputs=(0,), contract=Contract(
        layout="NCHW", nan="produce", workspace_bytes=_pool_workspace,
        allowed={**_AVG_ALLOWED, "count_include_pad": _BIT, **_extra},
    ))(_averagepool)


def _lppool(
    X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None,
    strides=None,
):
    """N-D Lp pooling: (sum |x|^p)^(1/p) over each window (ONNX LpPool-1/2/11/18/22)."""
    kernel, s, d, begin, end, out, extra = pool_geometry(
        X.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    acc = acc_dtype(X.dtype)
    xp = pad_spatial(np.abs(X.astype(acc)) ** acc(p), begin, [e + x for e, x in zip(end, extra)])
    total = _window_sum(xp, kernel, s, d, out)
    return (total ** acc(1.0 / p)).astype(X.dtype, copy=False)


for _v, _allowed in ((1, {"auto_pad": AUTO_PAD}), (2, {"auto_pad": AUTO_PAD}),
                     (11, {"auto_pad": AUTO_PAD}), (18, {"auto_pad": AUTO_PAD, "ceil_mode": _BIT})):
    # LpPool-1 takes p as a float, later versions as an int; the math is the same.
    op("LpPool", since=_v, layout_inputs=(0,), contract=Contract(
        layout="NCHW", workspace_bytes=_pool_workspace, allowed=_allowed
    ))(_lppool)


# ---------------------------------------------------------------------------------------------
# Global pools


def _spatial_axes(X) -> tuple[int, ...]:
    if X.ndim < 3:
        raise KernelError(f"global pooling input must be (N, C, *spatial), got shape {X.shape}")
    return tuple(range(2, X.ndim))


@op("GlobalAveragePool", since=1, layout_inputs=(0,), contract=Contract(layout="NCHW"))
def GlobalAveragePool(X):
    """Mean over all spatial axes, kept as size-1 dims (ONNX GlobalAveragePool-1/22)."""
    axes = _spatial_axes(X)
    return X.astype(acc_dtype(X.dtype), copy=False).mean(axis=axes, keepdims=True).astype(X.dtype)


@op("GlobalMaxPool", since=1, layout_inputs=(0,), contract=Contract(layout="NCHW"))
def GlobalMaxPool(X):
    """Max over all spatial axes, kept as size-1 dims (ONNX GlobalMaxPool-1/22)."""
    return np.max(X, axis=_spatial_axes(X), keepdims=True)


def _global_lppool(X, *, p=2):
    """(sum |x|^p)^(1/p) over all spatial axes, kept as size-1 dims (ONNX GlobalLpPool-1/2/22)."""
    axes = _spatial_axes(X)
    acc = acc_dtype(X.dtype)
    total = (np.abs(X.astype(acc)) ** acc(p)).sum(axis=axes, keepdims=True)
    return (total ** acc(1.0 / p)).astype(X.dtype)


# GlobalLpPool-1 takes p as a float, version 2 as an int.
_GLOBAL = {"layout_inputs": (0,), "contract": Contract(layout="NCHW")}
GlobalLpPool_1 = op("GlobalLpPool", since=1, **_GLOBAL)(_global_lppool)
GlobalLpPool = op("GlobalLpPool", since=2, **_GLOBAL)(_global_lppool)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _pool_grad_cases(op_type: str, since: int) -> list[Sample]:
    rng = np.random.default_rng(3)
    x = rng.permutation(2 * 3 * 5 * 5).reshape(2, 3, 5, 5) / 10.0  # distinct: no max ties
    out = [
        Sample([x], {"kernel_shape": [2, 2]}),
        Sample([x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
               label="strided padded"),
    ]
    if op_type == "AveragePool" and since >= 7:
        out.append(Sample([x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                "count_include_pad": 1}, label="count_include_pad"))
    if since >= 10:
        out.append(Sample([x], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
                          label="ceil_mode"))
    if since >= (19 if op_type == "AveragePool" else 10):
        out.append(Sample([x], {"kernel_shape": [2, 2], "dilations": [2, 2]},
                          label="dilations"))
    return out


@differentiable("MaxPool", cases=_pool_grad_cases)
def _maxpool_grad(ctx, dY, *rest, **attrs):
    # The forward's own Indices output (row-major) says where each window's max came from.
    X = np.asarray(ctx.inputs[0])
    kw = dict(attrs)
    kw["storage_order"] = 0
    kw.pop("noutputs", None)
    _, idx = ctx.op.reference(X, noutputs=2, **kw)
    dx = np.zeros(X.size, dtype=dY.dtype)
    np.add.at(dx, np.asarray(idx).reshape(-1), dY.reshape(-1))
    return fit(ctx, dx)


@differentiable("AveragePool", cases=_pool_grad_cases)
def _averagepool_grad(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    kernel, s, d, begin, end, out, extra = pool_geometry(
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
    return fit(ctx, pad_spatial(dxp, [-b for b in begin], [-e for e in full_end]))


@differentiable("GlobalAveragePool",
                cases=lambda t, v: [Sample([away_from_zero(2, 3, 4, 2)])])
def _globalavg_grad(ctx, dY, **attrs):
    X = np.asarray(ctx.inputs[0])
    return fit(ctx, np.broadcast_to(dY / math.prod(X.shape[2:]), X.shape))


def _globalmax_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = np.random.default_rng(1).permutation(48).reshape(2, 3, 4, 2) / 7.0
    return [Sample([x])]


@differentiable("GlobalMaxPool", cases=_globalmax_grad_cases)
def _globalmax_grad(ctx, dY, **attrs):
    X, Y = np.asarray(ctx.inputs[0]), ctx.outputs[0]
    mask = X == Y
    cnt = mask.sum(axis=tuple(range(2, X.ndim)), keepdims=True)
    return fit(ctx, dY * mask / np.maximum(cnt, 1))


# ---------------------------------------------------------------------------------------------
# MaxUnpool


@op("MaxUnpool", since=9, contract=Contract(layout="NCHW"))
def MaxUnpool(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):  # noqa: E741
    """Scatter X to the positions I (MaxPool's flat Indices), zeros elsewhere (ONNX MaxUnpool-9)."""
    if X.ndim < 3 or I.shape != X.shape:
        raise KernelError(f"MaxUnpool: X {X.shape} and I {I.shape} must match, rank >= 3")
    nsp = X.ndim - 2
    if not kernel_shape or len(kernel_shape) != nsp:
        raise KernelError(f"MaxUnpool: kernel_shape {kernel_shape} must have {nsp} values")
    s, _ = spatial_params(nsp, strides, None)
    begin, end = explicit_pads(nsp, pads)
    spatial = tuple((n - 1) * si + int(k) - b - e
                    for n, si, k, b, e in zip(X.shape[2:], s, kernel_shape, begin, end))
    inferred = X.shape[:2] + spatial
    size = math.prod(inferred)
    idx = I.reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise KernelError(f"MaxUnpool: index out of range [0, {size}) in I")
    y = np.zeros(size, dtype=X.dtype)
    y[idx] = X.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None:
        return y
    shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    if len(shape) != X.ndim or shape[:2] != X.shape[:2]:
        raise KernelError(f"MaxUnpool: output_shape {list(shape)} must be (N, C, *spatial) "
                          f"with N, C = {X.shape[:2]}")
    # Like the ONNX reference and conformance data (ORT differs): indices address the
    # inferred shape, and output_shape grows (or crops) that result at the end of each axis.
    return pad_spatial(y, [0] * nsp, [o - n for o, n in zip(shape[2:], spatial)])


# ---------------------------------------------------------------------------------------------
# MaxRoiPool


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C `round`: halves go away from zero (NumPy rounds them to even)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


@op("MaxRoiPool", since=1, contract=Contract(layout="NCHW"))
def MaxRoiPool(X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """Max pool each RoI [batch, x1, y1, x2, y2] into pooled_shape bins (ONNX MaxRoiPool-1)."""
    if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise KernelError(f"MaxRoiPool: X {X.shape} must be 4-D and rois {rois.shape} (R, 5)")
    if not pooled_shape or len(pooled_shape) != 2:
        raise KernelError(f"MaxRoiPool: pooled_shape {pooled_shape} must have 2 values")
    n, c, h, w = X.shape
    ph, pw = (int(v) for v in pooled_shape)
    y = np.zeros((rois.shape[0], c, ph, pw), dtype=X.dtype)
    for r, roi in enumerate(rois.astype(np.float64)):
        b = int(roi[0])
        if not 0 <= b < n:
            raise KernelError(f"MaxRoiPool: roi {r} has batch index {b}, batch size is {n}")
        x1, y1, x2, y2 = (int(v) for v in _round_half_away(roi[1:] * spatial_scale))
        # Caffe's RoI pooling: inclusive corners, at least one pixel, bins by floor/ceil.
        bin_h = max(y2 - y1 + 1, 1) / ph
        bin_w = max(x2 - x1 + 1, 1) / pw
        for i in range(ph):
            hs = min(max(math.floor(i * bin_h) + y1, 0), h)
            he = min(max(math.ceil((i + 1) * bin_h) + y1, 0), h)
            for j in range(pw):
                ws = min(max(math.floor(j * bin_w) + x1, 0), w)
                we = min(max(math.ceil((j + 1) * bin_w) + x1, 0), w)
                if he > hs and we > ws:
                    y[r, :, i, j] = X[b, :, hs:he, ws:we].max(axis=(1, 2))
    return y
