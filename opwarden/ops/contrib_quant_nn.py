"""Operators: quantized com.microsoft pooling, QGemm, QLinearConv (channels_last) and the
com.microsoft QuantizeLinear / DequantizeLinear; see contrib_quant.py for the arithmetic rules
they share with ONNX Runtime's CPU kernels (round half to even, saturation, float32 steps).
"""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.cast import int_range
from opwarden.ops.contrib_quant import F32, MS, Q8, _q8, _qparams, saturate, scalar_param
from opwarden.ops.conv import conv_out_shape, conv_pads, spatial_params
from opwarden.ops.pool import pool_geometry
from opwarden.ops.quant import QLinearConv as _QLinearConvOnnx
from opwarden.ops.quant import _dequantize, _quantize

_BIT = one_of(0, 1)
_AUTO_PAD = one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _to_nchw(x: np.ndarray, channels_last: int) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last else x


def _from_nchw(y: np.ndarray, channels_last: int) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y


def _pool_params(X, x_scale, x_zero_point, y_scale, y_zero_point, what):
    dt = X.dtype
    if X.ndim < 3:
        raise KernelError(f"{what}: input must be (N, C, *spatial), got shape {X.shape}")
    return (F32(scalar_param(x_scale, what, "x_scale")),
            int(scalar_param(x_zero_point, what, "x_zero_point", dt)),
            F32(scalar_param(y_scale, what, "y_scale")),
            int(scalar_param(y_zero_point, what, "y_zero_point", dt)))


# ---------------------------------------------------------------------------------------------
# QLinearGlobalAveragePool
# ---------------------------------------------------------------------------------------------


def global_average_nchw(x: np.ndarray, sx, zx: int, sy, zy: int) -> np.ndarray:
    """ORT's integer global average of an NCHW array: an exact int32 sum minus zx * size,
    times float32 sx / (sy * size), rounded, plus zy, saturated (shape (N, C, 1, ...))."""
    size = math.prod(x.shape[2:])
    acc = x.reshape(x.shape[0], x.shape[1], -1).astype(np.int64).sum(axis=-1) - zx * size
    with np.errstate(all="ignore"):
        scale = F32(sx / F32(sy * F32(size)))
        y = np.rint(acc.astype(F32) * scale).astype(np.float64) + zy
    return saturate(y, x.dtype).reshape(x.shape[:2] + (1,) * (x.ndim - 2))


@op("QLinearGlobalAveragePool", domain=MS, since=1,
    inputs=["X: T", "x_scale: tensor(float)", "x_zero_point: T", "y_scale: tensor(float)",
            "y_zero_point: T"],
    outputs=["Y: T"], types={"T": Q8}, attrs={"channels_last": 0},
    contract=Contract(nan="none", overflow="saturate", allowed={"channels_last": _BIT}))
def QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point, *,
                             channels_last=0):
    """Quantized global average pool over the spatial axes, NCHW or (channels_last) NHWC
    (com.microsoft QLinearGlobalAveragePool-1); bit-exact with ORT's integer kernel."""
    what = "QLinearGlobalAveragePool"
    sx, zx, sy, zy = _pool_params(X, x_scale, x_zero_point, y_scale, y_zero_point, what)
    x = _to_nchw(X, channels_last)
    if x.size == 0 or math.prod(x.shape[2:]) == 0:
        if math.prod(x.shape[2:]) == 0 and x.size == 0 and math.prod(x.shape[:2]):
            raise KernelError(f"{what}: empty spatial extent in input shape {X.shape}")
        return _from_nchw(np.zeros(x.shape[:2] + (1,) * (x.ndim - 2), X.dtype), channels_last)
    return _from_nchw(global_average_nchw(x, sx, zx, sy, zy), channels_last)


@QLinearGlobalAveragePool.infer
def _gap_infer(x, *rest, channels_last=0, **_):
    if x.shape is None:
        return TensorFact(x.dtype, None)
    s = x.shape
    if channels_last:
        return TensorFact(x.dtype, (s[0],) + (1,) * (len(s) - 2) + (s[-1],))
    return TensorFact(x.dtype, tuple(s[:2]) + (1,) * (len(s) - 2))


@QLinearGlobalAveragePool.samples
def _gap_samples(rng):
    for dt in (np.uint8, np.int8):
        for shape, cl, label in (((2, 3, 5, 4), 0, "NCHW"), ((2, 5, 4, 3), 1, "NHWC"),
                                 ((1, 4, 7), 0, "1-D"), ((1, 2, 2, 2, 3), 0, "3-D"),
                                 ((0, 3, 2, 2), 0, "empty batch"), ((1, 16, 15, 15), 0, "15x15")):
            yield Sample([_q8(rng, dt, shape), *_qparams(rng, dt), *_qparams(rng, dt)],
                         {"channels_last": cl}, label=f"{np.dtype(dt).name} {label}")


# ---------------------------------------------------------------------------------------------
# QLinearAveragePool
# ---------------------------------------------------------------------------------------------


def _avgpool_nchw(x, sx, zx, sy, zy, kernel_shape, strides, pads, auto_pad, ceil_mode,
                  count_include_pad):
    kernel, s, _d, begin, end, out, extra = pool_geometry(
        x.shape, kernel_shape, strides, None, pads, auto_pad, ceil_mode)
    sp = x.shape[2:]
    if list(sp) == list(kernel) and not any(begin) and not any(end):
        return global_average_nchw(x, sx, zx, sy, zy)  # ORT's shortcut to the integer path
    deq = (sx * (x.astype(np.int32) - zx).astype(F32)).astype(F32)
    full_end = [e + a for e, a in zip(end, extra)]
    pad = [(0, 0), (0, 0)] + [(b, e) for b, e in zip(begin, full_end)]
    xp = np.pad(deq, pad)
    inside = np.pad(np.ones(sp, np.int64), [(b, e) for b, e in zip(begin, full_end)])
    acc = np.zeros(x.shape[:2] + tuple(out), F32)
    count = np.zeros(tuple(out), np.int64)
    # Sequential float32 sum in row-major kernel order, as ORT's loops; padding adds 0.0.
    for off in np.ndindex(*kernel):
        sl = tuple(slice(o, o + (n - 1) * st + 1, st) for o, n, st in zip(off, out, s))
        acc += xp[(slice(None), slice(None)) + sl]
        count += inside[sl]
    div = np.full(tuple(out), math.prod(kernel)) if count_include_pad else count
    with np.errstate(all="ignore"):
        avg = (acc / div.astype(F32)).astype(F32)
        y = np.rint((avg / sy).astype(F32) + F32(zy))
    return saturate(y, x.dtype)


@op("QLinearAveragePool", domain=MS, since=1,
    inputs=["X: T", "x_scale: tensor(float)", "x_zero_point?: T", "y_scale: tensor(float)",
            "y_zero_point?: T"],
    outputs=["Y: T"], types={"T": Q8},
    attrs={"auto_pad": "NOTSET", "ceil_mode": 0, "channels_last": 0, "count_include_pad": 0,
           "kernel_shape": "INTS", "pads": ("INTS", None), "strides": ("INTS", None)},
    contract=Contract(nan="none", overflow="saturate", allowed={
        "auto_pad": _AUTO_PAD, "ceil_mode": _BIT, "channels_last": _BIT,
        "count_include_pad": _BIT}))
def QLinearAveragePool(X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *,
                       auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                       kernel_shape=None, pads=None, strides=None):
    """Quantized average pool, 1-D to 3-D, NCHW or NHWC (com.microsoft QLinearAveragePool-1).

    As ORT: a count_include_pad divisor is the full kernel size (also for a ceil_mode window
    past the padding); the average is requantized as rint(avg / y_scale + y_zero_point).
    """
    what = "QLinearAveragePool"
    sx, zx, sy, zy = _pool_params(X, x_scale, x_zero_point, y_scale, y_zero_point, what)
    if X.ndim > 5:
        raise KernelError(f"{what}: 1-D to 3-D pooling only, got input rank {X.ndim}")
    x = _to_nchw(X, channels_last)
    y = _avgpool_nchw(x, sx, zx, sy, zy, kernel_shape, strides, pads, auto_pad, ceil_mode,
                      count_include_pad)
    return _from_nchw(y, channels_last)


@QLinearAveragePool.infer
def _avgpool_infer(x, *rest, channels_last=0, kernel_shape=None, strides=None, pads=None,
                   auto_pad="NOTSET", ceil_mode=0, **_):
    if not x.static or kernel_shape is None:
        return TensorFact(x.dtype, None)
    s = tuple(x.shape)
    nchw = (s[0], s[-1]) + s[1:-1] if channels_last else s
    if len(nchw) != len(kernel_shape) + 2:
        return TensorFact(x.dtype, None)
    *_, out, _extra = pool_geometry(nchw, kernel_shape, strides, None, pads, auto_pad,
                                    ceil_mode)
    if channels_last:
        return TensorFact(x.dtype, (s[0], *out, s[-1]))
    return TensorFact(x.dtype, (s[0], s[1], *out))


@QLinearAveragePool.samples
def _avgpool_samples(rng):
    cases = (((1, 3, 6, 6), {"kernel_shape": [3, 3]}, "3x3"),
             ((2, 2, 7, 5), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
              "strided, padded"),
             ((2, 2, 7, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                             "count_include_pad": 1}, "count_include_pad"),
             ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
              "ceil_mode"),
             ((1, 2, 5, 5), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, "SAME_UPPER"),
             ((1, 3, 9), {"kernel_shape": [4], "strides": [2]}, "1-D"),
             ((1, 2, 4, 4, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, "3-D"),
             ((1, 3, 4, 4), {"kernel_shape": [4, 4]}, "whole image (integer path)"))
    for dt in (np.uint8, np.int8):
        for shape, attrs, label in cases:
            yield Sample([_q8(rng, dt, shape), *_qparams(rng, dt), *_qparams(rng, dt)], attrs,
                         label=f"{np.dtype(dt).name} {label}")
        yield Sample([_q8(rng, dt, (1, 5, 5, 3)), *_qparams(rng, dt), *_qparams(rng, dt)],
                     {"kernel_shape": [2, 2], "channels_last": 1}, label="NHWC")
        yield Sample([_q8(rng, dt, (0, 2, 4, 4)), *_qparams(rng, dt), *_qparams(rng, dt)],
                     {"kernel_shape": [2, 2]}, label="empty batch")


# ---------------------------------------------------------------------------------------------
# QGemm
# ---------------------------------------------------------------------------------------------


def qgemm_operands(A, a_zero_point, B, b_zero_point, transA, transB, what="QGemm"):
    """(A' - za as int64 (M, K), B' - zb as int64 (K, N), N) with the shapes and zero points
    checked as ORT does (za per tensor; zb per tensor or per column of B')."""
    if A.ndim != 2 or B.ndim != 2:
        raise KernelError(f"{what}: A and B must be 2-D, got shapes {A.shape} and {B.shape}")
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise KernelError(f"{what}: inner dimensions differ: A' is {a.shape}, B' is {b.shape} "
                          f"(transA={transA}, transB={transB})")
    n = b.shape[1]
    za = int(scalar_param(a_zero_point, what, "a_zero_point", A.dtype))
    zb = np.asarray(b_zero_point if b_zero_point is not None else np.zeros((), B.dtype))
    if zb.dtype != B.dtype:
        raise KernelError(f"{what}: b_zero_point has type {zb.dtype}, expected {B.dtype}")
    if zb.size != 1 and zb.shape != (n,):
        raise KernelError(f"{what}: b_zero_point must be a scalar or have {n} entries (one per "
                          f"column of B'), got shape {zb.shape}")
    zb = zb.reshape(-1) if zb.size != 1 else zb.reshape(())
    return a.astype(np.int64) - za, b.astype(np.int64) - zb.astype(np.int64), n


def qgemm_finish(acc, C, a_scale, b_scale, y_scale, y_zero_point, alpha, what="QGemm"):
    """Add the int32 bias C to the int64 accumulator (M, N) and scale it as ORT: float32
    alpha * a_scale * b_scale [/ y_scale] per tensor or per column; requantized (round half to
    even, saturated) when y_zero_point is given, else float32."""
    m, n = acc.shape
    if C is not None:
        c = np.asarray(C)
        if c.dtype != np.int32:
            raise KernelError(f"{what}: C must be int32, got {c.dtype}")
        try:
            acc = acc + np.broadcast_to(c.astype(np.int64), (m, n))
        except ValueError:
            raise KernelError(f"{what}: C of shape {c.shape} does not broadcast to "
                              f"{(m, n)}") from None
    sa = F32(scalar_param(a_scale, what, "a_scale"))
    sb = np.asarray(b_scale, F32)
    if sb.size != 1 and sb.shape != (n,):
        raise KernelError(f"{what}: b_scale must be a scalar or have {n} entries, got shape "
                          f"{sb.shape}")
    sb = sb.reshape(-1) if sb.size != 1 else sb.reshape(())
    with np.errstate(all="ignore"):
        scale = (F32(F32(alpha) * sa) * sb).astype(F32)
        if y_scale is not None:
            scale = (scale / F32(scalar_param(y_scale, what, "y_scale"))).astype(F32)
        y = (acc.astype(np.int32).astype(F32) * scale).astype(F32)
        if y_zero_point is None:
            return y
        zy = np.asarray(y_zero_point)
        z = int(scalar_param(zy, what, "y_zero_point"))
        return saturate(np.rint(y).astype(np.float64) + z, zy.dtype)


@op("QGemm", domain=MS, since=1,
    inputs=["A: TA", "a_scale: T", "a_zero_point: TA", "B: TB", "b_scale: T",
            "b_zero_point: TB", "C?: TC", "y_scale?: T", "y_zero_point?: TYZ"],
    outputs=["Y: TY"],
    types={"T": ["float32"], "TA": Q8, "TB": Q8, "TC": ["int32"], "TYZ": Q8,
           "TY": ["float32", "uint8", "int8"]},
    attrs={"alpha": 1.0, "transA": 0, "transB": 0},
    contract=Contract(nan="none", overflow="saturate",
                      allowed={"transA": _BIT, "transB": _BIT}))
def QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """Quantized Gemm: alpha * (A' - za)(B' - zb) + C with int32 bias C, requantized to
    (y_scale, y_zero_point), or float32 when y_zero_point is absent (com.microsoft QGemm-1).
    Accumulates exactly (int64), then wraps to int32 as ORT's accumulator would."""
    a, b, _n = qgemm_operands(A, a_zero_point, B, b_zero_point, transA, transB)
    return qgemm_finish(a @ b, C, a_scale, b_scale, y_scale, y_zero_point, alpha)


@QGemm.infer
def _qgemm_infer(a, sa, za, b, sb, zb, c=None, ys=None, yz=None, *, transA=0, transB=0, **_):
    dt = yz.dtype if yz is not None else "float32"
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return TensorFact(dt, None)
    return TensorFact(dt, (a.shape[1] if transA else a.shape[0],
                           b.shape[0] if transB else b.shape[1]))


@QGemm.samples
def _qgemm_samples(rng):
    for ta, tb in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        a, b = _q8(rng, ta, (4, 6)), _q8(rng, tb, (6, 5))
        sa, za = _qparams(rng, ta)
        sb, zb = _qparams(rng, tb)
        bias = rng.integers(-2000, 2000, size=(5,)).astype(np.int32)
        ys, yz = _qparams(rng, ta, 0.2)
        name = f"{np.dtype(ta).name}x{np.dtype(tb).name}"
        yield Sample([a, sa, za, b, sb, zb, bias, ys, yz], label=f"{name} bias, requantized",
                     constants=(3, 6))
        yield Sample([a, sa, za, b, sb, zb], label=f"{name} float output")
        yield Sample([a.T.copy(), sa, za, b.T.copy(), sb, zb, bias.reshape(1, 5), ys, yz],
                     {"transA": 1, "transB": 1, "alpha": 0.5}, label=f"{name} transposed, alpha")
        col_s = rng.uniform(0.01, 0.05, 5).astype(F32)
        col_z = np.zeros(5, tb)
        yield Sample([a, sa, za, b, col_s, col_z, None, ys, yz], label=f"{name} per column")
        big_a, big_b = _q8(rng, ta, (33, 300)), _q8(rng, tb, (300, 40))
        yield Sample([big_a, sa, za, big_b, sb, zb, None, np.asarray(2.0, F32), yz],
                     label=f"{name} 33x300x40 saturating", constants=(3,))
        yield Sample([_q8(rng, ta, (0, 6)), sa, za, b, sb, zb, None, ys, yz],
                     label=f"{name} M = 0")


# ---------------------------------------------------------------------------------------------
# QLinearConv (com.microsoft: adds channels_last)
# ---------------------------------------------------------------------------------------------


def _qconv_ms_workspace(x_shape, xs=None, xz=None, w_shape=None, *rest, **attrs) -> int:
    if x_shape is None or w_shape is None:
        return 0
    return 8 * math.prod(x_shape) * (math.prod(w_shape[2:]) + 1)


@op("QLinearConv", domain=MS, since=1,
    inputs=["x: T1", "x_scale: tensor(float)", "x_zero_point: T1", "w: T2",
            "w_scale: tensor(float)", "w_zero_point: T2", "y_scale: tensor(float)",
            "y_zero_point: T3", "B?: T4"],
    outputs=["y: T3"], types={"T1": Q8, "T2": Q8, "T3": Q8, "T4": ["int32"]},
    attrs={"auto_pad": "NOTSET", "channels_last": 0, "dilations": ("INTS", None), "group": 1,
           "kernel_shape": ("INTS", None), "pads": ("INTS", None), "strides": ("INTS", None)},
    contract=Contract(nan="none", overflow="saturate", workspace_bytes=_qconv_ms_workspace,
                      allowed={"auto_pad": _AUTO_PAD, "channels_last": _BIT}))
def QLinearConvMS(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                  B=None, *, auto_pad="NOTSET", channels_last=0, dilations=None, group=1,
                  kernel_shape=None, pads=None, strides=None):
    """ONNX QLinearConv, with NHWC activations when channels_last (weights stay OIHW)
    (com.microsoft QLinearConv-1)."""
    y = _QLinearConvOnnx(_to_nchw(np.asarray(x), channels_last), x_scale, x_zero_point, w,
                         w_scale, w_zero_point, y_scale, y_zero_point, B, auto_pad=auto_pad,
                         dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                         strides=strides)
    return _from_nchw(y, channels_last)


@QLinearConvMS.infer
def _qconv_ms_infer(x, xs=None, xz=None, w=None, ws=None, wz=None, ys=None, yz=None, b=None, *,
                    auto_pad="NOTSET", channels_last=0, dilations=None, kernel_shape=None,
                    pads=None, strides=None, **_):
    dt = yz.dtype if yz is not None else None
    if x.shape is None or w is None or w.shape is None or len(x.shape) < 3:
        return TensorFact(dt, None)
    s = tuple(x.shape)
    n, sp = s[0], (s[1:-1] if channels_last else s[2:])
    m = w.shape[0]
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    if not all(isinstance(v, int) for v in (*sp, *kernel)) or len(kernel) != len(sp):
        out: tuple = (None,) * len(sp)
    else:
        st, di = spatial_params(len(sp), strides, dilations)
        begin, end = conv_pads(sp, kernel, st, di, pads, auto_pad)
        out = tuple(conv_out_shape(sp, kernel, st, di, begin, end))
    return TensorFact(dt, (n, *out, m) if channels_last else (n, m, *out))


@QLinearConvMS.samples
def _qconv_ms_samples(rng):
    for cl in (0, 1):
        x = _q8(rng, np.uint8, (1, 3, 6, 6))
        # Weights in [-64, 63]: without VNNI, ORT's x86 u8s8 kernel sums adjacent products in
        # saturating int16 (vpmaddubsw), so a full-range sample is not exact there.
        w = (_q8(rng, np.int8, (4, 3, 3, 3)) // 2).astype(np.int8)
        xs, xz = _qparams(rng, np.uint8, 0.02)
        ws = rng.uniform(0.005, 0.02, 4).astype(F32)
        ys, yz = _qparams(rng, np.uint8, 0.05)
        bias = rng.integers(-500, 500, 4).astype(np.int32)
        xin = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if cl else x
        yield Sample([xin, xs, xz, w, ws, np.zeros(4, np.int8), ys, yz, bias],
                     {"pads": [1, 1, 1, 1], "channels_last": cl},
                     label=f"per-channel, channels_last={cl}", constants=(3, 8))


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear (com.microsoft)
# ---------------------------------------------------------------------------------------------

_QINTS = ["int8", "uint8", "int16", "uint16", "int4", "uint4"]
_FLOAT = 1  # TensorProto.FLOAT


@op("QuantizeLinear", domain=MS, since=1,
    inputs=["x: T1", "y_scale: T1", "y_zero_point?: T2"], outputs=["y: T2"],
    types={"T1": ["float32", "float16"], "T2": _QINTS}, attrs={"axis": 1},
    contract=Contract(nan="none", overflow="saturate"))
def QuantizeLinearMS(x, y_scale, y_zero_point=None, *, axis=1):
    """saturate(rint(x / y_scale) + y_zero_point), per tensor or along `axis`, uint8 when no
    zero point is given; float16 inputs divide in float32, as ORT
    (com.microsoft QuantizeLinear-1)."""
    return _quantize(np.asarray(x), y_scale, y_zero_point, axis=axis, precision=_FLOAT)


@op("DequantizeLinear", domain=MS, since=1,
    inputs=["x: T1", "x_scale: T2", "x_zero_point?: T1"], outputs=["y: T2"],
    types={"T1": _QINTS + ["int32"], "T2": ["float32", "float16"]}, attrs={"axis": 1},
    contract=Contract(nan="propagate"))
def DequantizeLinearMS(x, x_scale, x_zero_point=None, *, axis=1):
    """(x - x_zero_point) * x_scale in float32, per tensor or along `axis`, in x_scale's type
    (com.microsoft DequantizeLinear-1)."""
    s = np.asarray(x_scale)
    y = _dequantize(np.asarray(x), s, x_zero_point, axis=axis, output_dtype=_FLOAT)
    return y.astype(s.dtype) if s.dtype == np.float16 else y


@QuantizeLinearMS.infer
def _q_infer(x, s, zp=None, **_):
    return TensorFact(zp.dtype if zp is not None else "uint8", x.shape)


@DequantizeLinearMS.infer
def _dq_infer(x, s, zp=None, **_):
    return TensorFact(s.dtype, x.shape)


def _qdq_types():
    import ml_dtypes

    return [np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16),
            np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)]


@QuantizeLinearMS.samples
def _q_samples(rng):
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(F32)
    x.flat[:4] = [0.5, 1.5, -2.5, 1e6]  # ties to even, saturation
    for dt in _qdq_types():
        lo, hi = int_range(dt)
        zp = np.asarray((lo + hi) // 2 + 1, dt)
        yield Sample([x, np.asarray(0.05, F32), zp], label=f"{dt.name} per tensor")
        yield Sample([x, rng.uniform(0.02, 0.1, 4).astype(F32), np.full(4, zp, dt)],
                     {"axis": 1}, label=f"{dt.name} per axis")
    yield Sample([x, np.asarray(0.05, F32)], label="no zero point (uint8)")
    yield Sample([np.clip(x, -60000, 60000).astype(np.float16), np.asarray(0.05, np.float16),
                  np.asarray(3, np.int8)],
                 label="float16")
    yield Sample([x[:0], np.asarray(0.05, F32), np.asarray(0, np.int8)], label="empty")


@DequantizeLinearMS.samples
def _dq_samples(rng):
    for dt in _qdq_types():
        lo, hi = int_range(dt)
        q = rng.integers(lo, hi + 1, size=(3, 4, 5)).astype(dt)
        zp = np.asarray((lo + hi) // 2, dt)
        yield Sample([q, np.asarray(0.05, F32), zp], label=f"{dt.name} per tensor")
        yield Sample([q, rng.uniform(0.02, 0.1, 4).astype(F32), np.full(4, zp, dt)],
                     {"axis": -2}, label=f"{dt.name} per axis")
    q = rng.integers(-2**31, 2**31, size=(6,)).astype(np.int32)
    yield Sample([q, np.asarray(0.001, F32)], label="int32, no zero point")
    yield Sample([q.astype(np.int8), np.asarray(0.05, np.float16)], label="float16 scale")
