"""Operators: quant family (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, MatMulInteger, ConvInteger, QLinearConv).

Rounding is round-half-to-even (np.rint); results saturate to the target type's range.
Integer products accumulate in int64, so nothing overflows before the final conversion.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opwarden.contract import Contract, one_of
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op, shape_size
from opwarden.ops.cast import cast_array, int_range, is_exotic_float, is_small_int
from opwarden.ops.conv import _conv_flops
from opwarden.ops.linalg import _matmul_flops

_STD_FLOATS = (np.float16, np.float32, np.float64)


# ---------------------------------------------------------------------------------------------
# Scale / zero-point granularity
# ---------------------------------------------------------------------------------------------


def _norm_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise KernelError(f"{what}: axis {axis} out of range for a rank-{ndim} input")
    return axis % ndim if ndim else 0


def _expand(p: np.ndarray, shape: tuple, axis: int, block_size: int, what: str) -> np.ndarray:
    """Make a scale or zero point broadcastable to `shape`: per-tensor, per-axis or blocked."""
    p = np.asarray(p)
    if p.ndim == 0 or (p.ndim == 1 and p.size == 1 and block_size <= 0):
        return p.reshape(())
    ndim = len(shape)
    ax = _norm_axis(axis, ndim, what)
    if block_size > 0:
        if p.ndim != ndim:
            raise KernelError(
                f"{what}: blocked quantization needs a scale of rank {ndim}, got shape {p.shape}"
            )
        want = tuple(
            math.ceil(d / block_size) if i == ax else d for i, d in enumerate(shape)
        )
        if p.shape != want:
            raise KernelError(
                f"{what}: scale/zero point shape {p.shape} does not match input shape {shape} "
                f"with block_size {block_size} on axis {ax} (expected {want})"
            )
        return np.repeat(p, block_size, axis=ax).take(np.arange(shape[ax]), axis=ax)
    if p.ndim == 1:
        if p.shape[0] != shape[ax]:
            raise KernelError(
                f"{what}: per-axis scale/zero point has length {p.shape[0]}, but input axis "
                f"{ax} has size {shape[ax]}"
            )
        return p.reshape([-1 if i == ax else 1 for i in range(ndim)])
    raise KernelError(
        f"{what}: scale/zero point of shape {p.shape} is neither a scalar, a 1-D tensor nor "
        f"blocked (block_size={block_size})"
    )


def _compute_dtype(dtype) -> np.dtype:
    """The NumPy type arithmetic runs in for a given 'precision' type (float32 for exotic ones)."""
    dt = np.dtype(dtype)
    return dt if dt.type in _STD_FLOATS else np.dtype(np.float32)


def _round_through(v: np.ndarray, dtype) -> np.ndarray:
    """Round an intermediate to `dtype` (e.g. bfloat16) while keeping a computable NumPy type."""
    dt = np.dtype(dtype)
    if dt.type in _STD_FLOATS or not is_exotic_float(dt):
        return v
    return v.astype(dt).astype(v.dtype)


def _saturate_int(v: np.ndarray, dtype) -> np.ndarray:
    """Float values already rounded to integers -> `dtype`, clipped to its range.

    NaN (e.g. -inf / inf when a calibrated scale is inf) goes to the type's minimum, as in
    onnxruntime on x86, where the float -> int32 conversion of NaN gives INT32_MIN.
    """
    lo, hi = int_range(dtype)
    v = np.clip(np.nan_to_num(v, nan=float(lo)), lo, hi)
    return v.astype(np.int64).astype(dtype)


def _is_integer_type(dtype) -> bool:
    dt = np.dtype(dtype)
    return dt.kind in "iu" or is_small_int(dt)


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear
# ---------------------------------------------------------------------------------------------


def _quantize(x, y_scale, y_zero_point, *, axis=1, saturate=1, block_size=0, output_dtype=0,
              precision=0):
    x = np.asarray(x)
    y_scale = np.asarray(y_scale)
    what = "QuantizeLinear"
    if y_zero_point is not None:
        y_zero_point = np.asarray(y_zero_point)
        out = y_zero_point.dtype
        if output_dtype and np_dtype(output_dtype) != out:
            raise KernelError(
                f"{what}: output_dtype {np_dtype(output_dtype)} differs from the zero point's "
                f"type {out}"
            )
    else:
        out = np_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)
    # y_scale's type (or `precision`) sets the precision of x / y_scale.
    prec = np_dtype(precision) if precision else y_scale.dtype
    ct = _compute_dtype(prec)
    s = _expand(y_scale, x.shape, axis, block_size, what).astype(ct)
    with np.errstate(all="ignore"):
        q = _round_through(x.astype(ct) / s, prec)
        if _is_integer_type(out):
            q = np.rint(q).astype(np.float64)
            if y_zero_point is not None:
                z = _expand(y_zero_point, x.shape, axis, block_size, what)
                q = q + cast_array(z, np.int64).astype(np.float64)
            return _saturate_int(q, out)
        # Float outputs (float8, float4, float6): x / scale + zero point, cast with `saturate`.
        q = q.astype(np.float64)
        if y_zero_point is not None:
            z = _expand(y_zero_point, x.shape, axis, block_size, what)
            q = q + cast_array(z, np.float64)
        return cast_array(q, out, bool(saturate))


def _dequantize(x, x_scale, x_zero_point, *, axis=1, block_size=0, output_dtype=0):
    x = np.asarray(x)
    x_scale = np.asarray(x_scale)
    what = "DequantizeLinear"
    if output_dtype:
        out = np_dtype(output_dtype)
    elif x_scale.dtype.type in _STD_FLOATS or x_scale.dtype.name == "bfloat16":
        out = x_scale.dtype
    else:  # a float8e8m0 scale (DequantizeLinear-24) needs output_dtype; float32 otherwise
        out = np.dtype(np.float32)
    ct = _compute_dtype(out)  # the output type sets the precision of the multiplication
    s = _expand(x_scale, x.shape, axis, block_size, what)
    if _is_integer_type(x.dtype):
        d = cast_array(x, np.int64)
        if x_zero_point is not None:
            d = d - cast_array(_expand(x_zero_point, x.shape, axis, block_size, what), np.int64)
    else:
        d = cast_array(x, np.float64)
        if x_zero_point is not None:
            d = d - cast_array(_expand(x_zero_point, x.shape, axis, block_size, what), np.float64)
    with np.errstate(all="ignore"):
        y = _round_through(d.astype(ct), out) * cast_array(s, np.float64).astype(ct)
    return cast_array(_round_through(y, out), out)


_Q_NONE = Contract(nan="none", overflow="saturate")
_Q_SAT = Contract(nan="produce", overflow="saturate", allowed={"saturate": one_of(0, 1)})


@op("QuantizeLinear", since=10, contract=_Q_NONE)
def QuantizeLinear_10(x, y_scale, y_zero_point=None):
    """Per-tensor y = saturate(round(x / y_scale) + y_zero_point) (ONNX QuantizeLinear-10)."""
    return _quantize(x, y_scale, y_zero_point)


@op("QuantizeLinear", since=13, contract=_Q_NONE)
def QuantizeLinear_13(x, y_scale, y_zero_point=None, *, axis=1):
    """Adds per-axis scales along `axis` (ONNX QuantizeLinear-13)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis)


@op("QuantizeLinear", since=19, contract=_Q_SAT)
def QuantizeLinear_19(x, y_scale, y_zero_point=None, *, axis=1, saturate=1):
    """Adds float8 outputs and `saturate` (ONNX QuantizeLinear-19)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@op("QuantizeLinear", since=21, contract=_Q_SAT)
def QuantizeLinear_21(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                      output_dtype=0):
    """Adds blocked scales, `output_dtype`, 16- and 4-bit ints (ONNX QuantizeLinear-21)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                     block_size=block_size, output_dtype=output_dtype)


@op("QuantizeLinear", since=23, contract=_Q_SAT)
def QuantizeLinear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                   output_dtype=0, precision=0):
    """Adds `precision` of x / y_scale (ONNX QuantizeLinear-23; 24, 25, 28 only add types)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                     block_size=block_size, output_dtype=output_dtype, precision=precision)


_DQ = Contract(nan="propagate")


@op("DequantizeLinear", since=10, contract=_DQ)
def DequantizeLinear_10(x, x_scale, x_zero_point=None):
    """Per-tensor y = (x - x_zero_point) * x_scale (ONNX DequantizeLinear-10)."""
    return _dequantize(x, x_scale, x_zero_point)


@op("DequantizeLinear", since=13, contract=_DQ)
def DequantizeLinear_13(x, x_scale, x_zero_point=None, *, axis=1):
    """Adds per-axis scales along `axis` (ONNX DequantizeLinear-13; 19 only adds types)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis)


@op("DequantizeLinear", since=21, contract=_DQ)
def DequantizeLinear_21(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """Adds blocked scales (ONNX DequantizeLinear-21)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@op("DequantizeLinear", since=23, contract=_DQ)
def DequantizeLinear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """Adds `output_dtype` (ONNX DequantizeLinear-23; 24, 25, 28 only add types)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                       output_dtype=output_dtype)


@op("DynamicQuantizeLinear", since=11, contract=Contract(nan="suppress", overflow="saturate"))
def DynamicQuantizeLinear(x):
    """uint8 quantization with scale/zero point from the range of x and 0 (ONNX DQL-11)."""
    x = np.asarray(x, dtype=np.float32)
    f32 = np.float32
    lo = min(f32(0), x.min()) if x.size else f32(0)
    hi = max(f32(0), x.max()) if x.size else f32(0)
    scale = f32((hi - lo) / f32(255))
    with np.errstate(all="ignore"):
        if scale == 0:  # x is all zeros: any scale works; keep 0 and map everything to 0
            zp = np.uint8(0)
            y = np.zeros(x.shape, np.uint8)
        else:
            zp = _saturate_int(np.rint(f32(0) - lo / scale), np.uint8)
            y = _saturate_int(np.rint(x / scale).astype(np.float64) + float(zp), np.uint8)
    return y, np.asarray(scale, dtype=np.float32), np.asarray(zp, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# Integer matrix products
# ---------------------------------------------------------------------------------------------


def _per_row(p, a: np.ndarray, what: str) -> np.ndarray:
    """A row-wise (a's second-to-last axis) parameter as int64/float broadcastable to `a`."""
    p = np.asarray(p)
    if p.ndim == 1 and p.size > 1:
        if a.ndim < 2 or p.shape[0] != a.shape[-2]:
            raise KernelError(f"{what}: per-row parameter of length {p.shape[0]} does not match "
                              f"the {a.shape} input's rows")
        return p.reshape(-1, 1)
    return p.reshape(()) if p.size == 1 and p.ndim <= 1 else p


def _per_col(p, b: np.ndarray, what: str) -> np.ndarray:
    """A column-wise (b's last axis) parameter, broadcastable to `b` and to the product."""
    p = np.asarray(p)
    if p.ndim == 1 and p.size > 1 and p.shape[0] != b.shape[-1]:
        raise KernelError(f"{what}: per-column parameter of length {p.shape[0]} does not match "
                          f"the {b.shape} input's columns")
    return p.reshape(()) if p.size == 1 and p.ndim <= 1 else p


def _centered(v: np.ndarray, zp, shaper, what: str) -> np.ndarray:
    c = cast_array(v, np.int64)
    if zp is not None:
        c = c - cast_array(shaper(zp, v, what), np.int64)
    return c


def _int_matmul(a: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError(f"{what}: inputs must have rank >= 1, got {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise KernelError(f"{what}: inner dimensions differ: {a.shape} @ {b.shape}")
    return np.matmul(a, b)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point, out_dtype) -> np.ndarray:
    """y = saturate(round(acc * multiplier) + y_zero_point), multiplier in float32."""
    with np.errstate(all="ignore"):
        y = np.rint(acc.astype(np.float32) * multiplier).astype(np.float64)
    if y_zero_point is not None:
        y = y + cast_array(np.asarray(y_zero_point), np.float64)
    return _saturate_int(y, out_dtype)


@op("MatMulInteger", since=10, contract=Contract(nan="none", overflow="wrap"))
def MatMulInteger(A, B, a_zero_point=None, b_zero_point=None):
    """int32 (A - a_zero_point) @ (B - b_zero_point) (ONNX MatMulInteger-10)."""
    what = "MatMulInteger"
    a = _centered(np.asarray(A), a_zero_point, _per_row, what)
    b = _centered(np.asarray(B), b_zero_point, _per_col, what)
    return _int_matmul(a, b, what).astype(np.int32)  # wraps like 32-bit accumulation


@op("QLinearMatMul", since=10, contract=Contract(nan="none", overflow="saturate"))
def QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Quantized matmul, requantized to y's scale and zero point (ONNX QLinearMatMul-10/21)."""
    what = "QLinearMatMul"
    a = np.asarray(a)
    b = np.asarray(b)
    acc = _int_matmul(_centered(a, a_zero_point, _per_row, what),
                      _centered(b, b_zero_point, _per_col, what), what)
    sa = _per_row(a_scale, a, what).astype(np.float32)
    sb = _per_col(b_scale, b, what).astype(np.float32)
    sy = _scalar(y_scale, what, "y_scale").astype(np.float32)
    out = np.asarray(y_zero_point).dtype if y_zero_point is not None else a.dtype
    yz = None if y_zero_point is None else _scalar(y_zero_point, what, "y_zero_point")
    return _requantize(acc, (sa * sb) / sy, yz, out)


# ---------------------------------------------------------------------------------------------
# Integer convolution
# ---------------------------------------------------------------------------------------------


def _conv_geometry(x_shape, w_shape, auto_pad, dilations, kernel_shape, pads, strides, what):
    """(strides, dilations, pads[begin..., end...]) for an N-D convolution, auto_pad resolved."""
    nd = len(x_shape) - 2
    if nd < 1 or len(w_shape) != nd + 2:
        raise KernelError(f"{what}: input {tuple(x_shape)} and weight {tuple(w_shape)} need "
                          f"matching ranks >= 3")
    kernel = list(w_shape[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise KernelError(f"{what}: kernel_shape {list(kernel_shape)} differs from the weight's "
                          f"spatial shape {kernel}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    if len(strides) != nd or len(dilations) != nd:
        raise KernelError(f"{what}: strides/dilations must have {nd} values")
    ext = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            n_out = -(-x_shape[i + 2] // strides[i])
            total = max(0, (n_out - 1) * strides[i] + ext[i] - x_shape[i + 2])
            small = total // 2
            pads[i], pads[i + nd] = (small, total - small) if auto_pad == "SAME_UPPER" else (
                total - small, small)
    elif auto_pad == "VALID" or not pads:
        pads = [0] * (2 * nd)
    elif len(pads) != 2 * nd:
        raise KernelError(f"{what}: pads must have {2 * nd} values, got {list(pads)}")
    for i in range(nd):
        if x_shape[i + 2] + pads[i] + pads[i + nd] < ext[i]:
            raise KernelError(f"{what}: dilated kernel extent {ext[i]} exceeds padded input "
                              f"size on spatial axis {i}")
    return strides, dilations, list(pads)


def _conv_int64(x: np.ndarray, w: np.ndarray, group: int, strides, dilations, pads, what):
    """N-D grouped convolution of int64 arrays (N,C,*S) * (M,C/group,*K) -> int64 (N,M,*O).

    Pads with 0, i.e. with the zero point once the caller has subtracted it.
    """
    nd = x.ndim - 2
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if group < 1 or c % group or m % group or cg != c // group:
        raise KernelError(f"{what}: group={group} does not fit input channels {c} and weight "
                          f"shape {w.shape}")
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    ext = [d * (k - 1) + 1 for d, k in zip(dilations, w.shape[2:])]
    win = sliding_window_view(xp, ext, axis=tuple(range(2, 2 + nd)))  # (N, C, *O_full, *ext)
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
              + tuple(slice(None, None, d) for d in dilations)]  # (N, C, *O, *K)
    spatial_k = tuple(range(2 + nd, 2 + 2 * nd))
    mg = m // group
    outs = []
    for g in range(group):
        xg = win[:, g * cg:(g + 1) * cg]
        wg = w[g * mg:(g + 1) * mg]
        # Contract over channels and kernel positions -> (N, *O, M/group).
        outs.append(np.tensordot(xg, wg, axes=((1,) + spatial_k, (1,) + tuple(range(2, 2 + nd)))))
    y = np.concatenate(outs, axis=-1)
    return np.moveaxis(y, -1, 1)


def _per_channel(p, m: int, nd: int, what: str) -> np.ndarray:
    """A weight scale/zero point: scalar or 1-D per output channel, shaped (M, 1, ...)."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1 or p.shape[0] != m:
        raise KernelError(f"{what}: per-channel parameter shape {p.shape} does not match "
                          f"{m} output channels")
    return p.reshape((m,) + (1,) * nd)


def _scalar(p, what: str, name: str) -> np.ndarray:
    p = np.asarray(p)
    if p.size != 1:
        raise KernelError(f"{what}: {name} must be a scalar (per-tensor), got shape {p.shape}")
    return p.reshape(())


def _conv_workspace(x_shape, w_shape=None, *rest, **attrs) -> int:
    """im2col-style windows: N * C * prod(spatial) * prod(kernel) int64 values (upper bound)."""
    if x_shape is None or w_shape is None:
        return 0
    return 8 * math.prod(x_shape) * math.prod(w_shape[2:])


def _qconv_workspace(x_shape, xs=None, xz=None, w_shape=None, *rest, **attrs) -> int:
    return _conv_workspace(x_shape, w_shape)


_AUTO_PAD = one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@op("ConvInteger", since=10, contract=Contract(
    nan="none", overflow="wrap", layout="NCHW", workspace_bytes=_conv_workspace,
    allowed={"auto_pad": _AUTO_PAD}))
def ConvInteger(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None,
                group=1, kernel_shape=None, pads=None, strides=None):
    """int32 convolution of (x - x_zero_point) and (w - w_zero_point) (ONNX ConvInteger-10)."""
    what = "ConvInteger"
    x = np.asarray(x)
    w = np.asarray(w)
    strides, dilations, pads = _conv_geometry(x.shape, w.shape, auto_pad, dilations,
                                              kernel_shape, pads, strides, what)
    xc = cast_array(x, np.int64)
    if x_zero_point is not None:
        xc = xc - cast_array(_scalar(x_zero_point, what, "x_zero_point"), np.int64)
    wc = cast_array(w, np.int64)
    if w_zero_point is not None:
        wc = wc - cast_array(_per_channel(w_zero_point, w.shape[0], x.ndim - 1, what), np.int64)
    y = _conv_int64(xc, wc, group, strides, dilations, pads, what)
    return y.astype(np.int32)  # wraps like 32-bit accumulation


@op("QLinearConv", since=10, contract=Contract(
    nan="none", overflow="saturate", layout="NCHW", workspace_bytes=_qconv_workspace,
    allowed={"auto_pad": _AUTO_PAD}))
def QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                pads=None, strides=None):
    """Quantized convolution plus int32 bias, requantized to y (ONNX QLinearConv-10)."""
    what = "QLinearConv"
    x = np.asarray(x)
    w = np.asarray(w)
    m, nd = w.shape[0], x.ndim - 2
    strides, dilations, pads = _conv_geometry(x.shape, w.shape, auto_pad, dilations,
                                              kernel_shape, pads, strides, what)
    xc = cast_array(x, np.int64)
    if x_zero_point is not None:
        xc = xc - cast_array(_scalar(x_zero_point, what, "x_zero_point"), np.int64)
    wc = cast_array(w, np.int64)
    if w_zero_point is not None:
        wc = wc - cast_array(_per_channel(w_zero_point, m, nd + 1, what), np.int64)
    acc = _conv_int64(xc, wc, group, strides, dilations, pads, what)
    if B is not None:
        bias = np.asarray(B)
        if bias.shape != (m,):
            raise KernelError(f"{what}: bias B must have shape ({m},), got {bias.shape}")
        acc = acc + bias.astype(np.int64).reshape((m,) + (1,) * nd)
    sx = _scalar(x_scale, what, "x_scale").astype(np.float32)
    sw = _per_channel(w_scale, m, nd, what).astype(np.float32)
    sy = _scalar(y_scale, what, "y_scale").astype(np.float32)
    out = np.asarray(y_zero_point).dtype if y_zero_point is not None else x.dtype
    yz = None if y_zero_point is None else _scalar(y_zero_point, what, "y_zero_point")
    return _requantize(acc, (sx * sw) / sy, yz, out)


def _q8(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


@QLinearConv.samples
def _qlinear_conv_samples(rng):
    """Per-tensor and per-channel weight scales, groups, strides, dilations, padding, bias."""
    f32 = np.float32
    for xt, wt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        name = f"{np.dtype(xt).name}x{np.dtype(wt).name}"
        x, w = _q8(rng, xt, (2, 4, 7, 6)), _q8(rng, wt, (6, 2, 3, 3))
        ws = rng.uniform(0.002, 0.02, 6).astype(f32)
        q = [np.asarray(0.02, f32), np.asarray(3, xt)]
        y = [np.asarray(0.3, f32), np.asarray(-5 if xt == np.int8 else 100, xt)]
        bias = rng.integers(-3000, 3000, 6).astype(np.int32)
        yield Sample([x, *q, w, ws, np.zeros(6, wt), *y, bias],
                     {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]},
                     label=f"{name} per-channel, grouped, strided", constants=(3, 8))
        yield Sample([x, *q, w[:, :1].repeat(4, axis=1), np.asarray(0.01, f32),
                      np.asarray(1, wt), *y], {"dilations": [2, 2], "auto_pad": "SAME_UPPER"},
                     label=f"{name} per-tensor, dilated, SAME_UPPER")
    x, w = _q8(rng, np.uint8, (1, 40, 9, 9)), _q8(rng, np.int8, (8, 40, 3, 3))
    yield Sample([x, np.asarray(0.05, f32), np.asarray(128, np.uint8), w,
                  np.asarray(0.05, f32), np.asarray(0, np.int8), np.asarray(0.5, f32),
                  np.asarray(128, np.uint8)], label="K=360 (float64 path), saturating")


@QLinearMatMul.samples
def _qlinear_matmul_samples(rng):
    f32 = np.float32
    for at, bt in ((np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)):
        for m, k, n in ((3, 5, 4), (17, 300, 9), (0, 4, 3)):
            yield Sample([_q8(rng, at, (m, k)), np.asarray(0.03, f32), np.asarray(2, at),
                          _q8(rng, bt, (k, n)), np.asarray(0.02, f32), np.asarray(1, bt),
                          np.asarray(0.1, f32), np.asarray(7, at)],
                         label=f"{np.dtype(at).name}x{np.dtype(bt).name} {m}x{k}x{n}")


# Multiply-adds, for the roofline in `opwarden bench` (two FLOPs per integer product).

@QLinearConv.flops
def _qlinear_conv_flops(ins, outs):
    """Each output element meets its group's weights, w[1:] (w is input 3)."""
    return 2.0 * shape_size(outs[0]) * shape_size(ins[3][1:]) if len(ins) >= 4 and outs else None


@QLinearMatMul.flops
def _qlinear_matmul_flops(ins, outs):
    """Each output element sums K = a's last dim products."""
    return 2.0 * shape_size(outs[0]) * int(ins[0][-1]) if len(ins) >= 4 and outs else None


# ConvInteger and MatMulInteger take their operands where Conv and MatMul do
ConvInteger.flops(_conv_flops)
MatMulInteger.flops(_matmul_flops)
