"""Fast 2-D float32 convolution for the CPU: NHWC and NCHW, GEMM-based, into planned buffers.

NHWC: a 1x1 convolution is one GEMM (N*H*W x C) @ (C x M); a kxk one copies patches of a row
band of the output (im2col, chunked so the patch matrix stays cache-sized) and runs one GEMM per
band and group; depthwise convolutions are per-tap multiply-adds over the channel axis. Bias,
residual and activation are applied on each band right after its GEMM, while it is in cache.
NCHW: the same with the patch matrix transposed (M x K) @ (K x P), weights used as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from ..ops.conv import conv_out_shape, conv_pads, spatial_params
from ._util import F32, apply_activation, output, packed, scratch

# Patch-matrix band size (bytes): big enough for BLAS to reach its peak, small enough to stay in
# the last-level cache together with the weights.
BAND_BYTES = 3 << 20
# Depthwise band size (bytes of output): the accumulator and one product stay in L2.
DW_BAND_BYTES = 192 << 10


def geometry(hw, khw, strides, dilations, pads, auto_pad):
    """(strides, dilations, pads begin, pads end, output (OH, OW)) of a 2-D convolution."""
    s, d = spatial_params(2, strides, dilations)
    begin, end = conv_pads(hw, khw, s, d, pads, auto_pad)
    out_hw = conv_out_shape(hw, khw, s, d, begin, end)
    return s, d, begin, end, out_hw


def _check(x: np.ndarray, w: np.ndarray, b, group: int, cin: int, kernel_shape, what: str):
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(f"{what}: X {x.shape} and W {w.shape} must both be 4-D")
    m = w.shape[0]
    if group < 1 or cin != w.shape[1] * group or m % group:
        raise KernelError(
            f"{what}: X has {cin} channels and W is {w.shape} with group={group}; need "
            f"C == W.shape[1] * group and W.shape[0] divisible by group"
        )
    if kernel_shape and tuple(int(k) for k in kernel_shape) != w.shape[2:]:
        raise KernelError(f"{what}: kernel_shape {list(kernel_shape)} != W spatial {w.shape[2:]}")
    if b is not None and b.shape != (m,):
        raise KernelError(f"{what}: bias shape {b.shape} must be ({m},)")


def _f32(a):
    return None if a is None else np.ascontiguousarray(a, dtype=F32)


def _pad_nhwc(x: np.ndarray, begin, end) -> np.ndarray:
    """x (N, H, W, C) zero-padded on H and W into a scratch buffer (negative pads crop)."""
    if not any(begin) and not any(end):
        return x
    n, h, w, c = x.shape
    x = x[:, max(-begin[0], 0):h - max(-end[0], 0), max(-begin[1], 0):w - max(-end[1], 0)]
    bt, bl = max(begin[0], 0), max(begin[1], 0)
    et, el = max(end[0], 0), max(end[1], 0)
    h, w = x.shape[1:3]
    xp = scratch("conv.pad", (n, h + bt + et, w + bl + el, c))
    # Zero only the border; the interior is overwritten.
    xp[:, :bt] = 0
    xp[:, bt + h:] = 0
    xp[:, bt:bt + h, :bl] = 0
    xp[:, bt:bt + h, bl + w:] = 0
    xp[:, bt:bt + h, bl:bl + w] = x
    return xp


def _pad_nchw(x: np.ndarray, begin, end) -> np.ndarray:
    """x (C, H, W) (one image) zero-padded on H and W into a scratch buffer."""
    if not any(begin) and not any(end):
        return x
    c, h, w = x.shape
    x = x[:, max(-begin[0], 0):h - max(-end[0], 0), max(-begin[1], 0):w - max(-end[1], 0)]
    bt, bl = max(begin[0], 0), max(begin[1], 0)
    et, el = max(end[0], 0), max(end[1], 0)
    h, w = x.shape[1:3]
    xp = scratch("conv.pad", (c, h + bt + et, w + bl + el))
    xp[:, :bt] = 0
    xp[:, bt + h:] = 0
    xp[:, bt:bt + h, :bl] = 0
    xp[:, bt:bt + h, bl + w:] = 0
    xp[:, bt:bt + h, bl:bl + w] = x
    return xp


def _epilogue(y: np.ndarray, bias, z, activation: str, params) -> None:
    """y += bias (broadcast on the last axis or given pre-shaped), y += z, y = act(y); in place."""
    if bias is not None:
        y += bias
    if z is not None:
        y += z
    if activation:
        apply_activation(y, activation, params)


# ---------------------------------------------------------------------------------------------
# NHWC


def _pack_nhwc(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, Cg, kh, kw) -> (group, kh*kw*Cg, M/group), rows ordered (kh, kw, c)."""
    m, cg, kh, kw = w.shape
    mg = m // group
    if kh == kw == 1 and w.dtype == F32 and w.flags.c_contiguous:
        # 1x1: the transposed weight is a free view (BLAS takes transposed operands), so the
        # weights are not held twice.
        return w.reshape(group, mg, cg).transpose(0, 2, 1)
    p = w.astype(F32).reshape(group, mg, cg, kh, kw).transpose(0, 3, 4, 2, 1)
    return np.ascontiguousarray(p.reshape(group, kh * kw * cg, mg))


def _pack_depthwise(w: np.ndarray) -> np.ndarray:
    """W (C, 1, kh, kw) -> (kh, kw, C): one channel vector per tap."""
    return np.ascontiguousarray(w.astype(F32)[:, 0].transpose(1, 2, 0))


def conv_nhwc(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), out=None,
):
    """Y = act(Conv(X, W, B) + Z) with X, Z, Y in NHWC; W stays (M, C/group, kh, kw)."""
    group = int(group)
    x = _f32(X)
    _check(x, W, B, group, x.shape[3] if x.ndim == 4 else -1, kernel_shape, "Conv (NHWC)")
    n, h, wd, c = x.shape
    m, cg, kh, kw = W.shape
    s, d, begin, end, (oh, ow) = geometry((h, wd), (kh, kw), strides, dilations, pads, auto_pad)
    y = output(out, (n, oh, ow, m))
    z = None if Z is None else _f32(Z)
    if z is not None and z.shape != y.shape:
        raise KernelError(f"FusedConv (NHWC): residual Z {z.shape} must match the output {y.shape}")
    bias = None if B is None else _f32(B)
    if n == 0 or oh * ow * m == 0:
        return y
    if cg == 1 and m == group:
        _depthwise_nhwc(x, W, s, d, begin, end, y)
        _epilogue(y, bias, z, activation, activation_params)
        return y
    pw = packed(W, ("nhwc", group), lambda w: _pack_nhwc(w, group))
    mg = m // group
    k = kh * kw * cg
    if (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end):
        # Pointwise: the input already is the patch matrix, one GEMM per group.
        a = x.reshape(n * h * wd, c)
        y2 = y.reshape(n * oh * ow, m)
        for g in range(group):
            np.matmul(a[:, g * cg:(g + 1) * cg], pw[g], out=y2[:, g * mg:(g + 1) * mg])
        _epilogue(y2, bias, None if z is None else z.reshape(y2.shape), activation,
                  activation_params)
        return y
    xp = _pad_nhwc(x, begin, end)
    rows = max(1, min(oh, BAND_BYTES // max(1, ow * k * group * 4)))
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            cols = scratch("conv.cols", (rr, ow, group, kh, kw, cg))
            for a in range(kh):
                h0 = r0 * s[0] + a * d[0]
                for b in range(kw):
                    w0 = b * d[1]
                    v = xp[i, h0:h0 + (rr - 1) * s[0] + 1:s[0], w0:w0 + (ow - 1) * s[1] + 1:s[1]]
                    cols[:, :, :, a, b, :] = v.reshape(rr, ow, group, cg)
            c2 = cols.reshape(rr * ow, group * k)
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            if group == 1:
                np.matmul(c2, pw[0], out=y2)
            else:
                for g in range(group):
                    np.matmul(c2[:, g * k:(g + 1) * k], pw[g], out=y2[:, g * mg:(g + 1) * mg])
            _epilogue(y2, bias, None if z is None else z[i, r0:r1].reshape(y2.shape),
                      activation, activation_params)
    return y


def _depthwise_nhwc(x, W, s, d, begin, end, y) -> None:
    """y[n, oh, ow, c] = sum over taps of xp[n, oh*s + a*d, ow*s + b*d, c] * W[c, 0, a, b]."""
    kh, kw = W.shape[2:]
    pw = packed(W, "dw_nhwc", _pack_depthwise)
    xp = _pad_nhwc(x, begin, end)
    n, oh, ow, c = y.shape
    rows = max(1, min(oh, DW_BAND_BYTES // max(1, ow * c * 4)))
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            acc = y[i, r0:r1]
            tmp = scratch("conv.dwtmp", (rr, ow, c))
            first = True
            for a in range(kh):
                h0 = r0 * s[0] + a * d[0]
                for b in range(kw):
                    w0 = b * d[1]
                    v = xp[i, h0:h0 + (rr - 1) * s[0] + 1:s[0], w0:w0 + (ow - 1) * s[1] + 1:s[1]]
                    if first:
                        np.multiply(v, pw[a, b], out=acc)
                        first = False
                    else:
                        np.multiply(v, pw[a, b], out=tmp)
                        acc += tmp


# ---------------------------------------------------------------------------------------------
# NCHW


def _pack_nchw(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, Cg, kh, kw) -> (group, M/group, Cg*kh*kw): rows of the left GEMM operand."""
    m = w.shape[0]
    return np.ascontiguousarray(w.astype(F32).reshape(group, m // group, -1))


def conv_nchw(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), out=None,
):
    """Y = act(Conv(X, W, B) + Z) in NCHW, 2-D, float32."""
    group = int(group)
    x = _f32(X)
    _check(x, W, B, group, x.shape[1] if x.ndim == 4 else -1, kernel_shape, "Conv")
    n, c, h, wd = x.shape
    m, cg, kh, kw = W.shape
    s, d, begin, end, (oh, ow) = geometry((h, wd), (kh, kw), strides, dilations, pads, auto_pad)
    y = output(out, (n, m, oh, ow))
    z = None if Z is None else _f32(Z)
    if z is not None and z.shape != y.shape:
        raise KernelError(f"FusedConv: residual Z {z.shape} must match the output {y.shape}")
    bias = None if B is None else _f32(B).reshape(m, 1)
    if n == 0 or oh * ow * m == 0:
        return y
    p = oh * ow
    if cg == 1 and m == group:
        pw = packed(W, "dw_nchw", lambda w: np.ascontiguousarray(w.astype(F32)[:, 0]))
        for i in range(n):
            xp = _pad_nchw(x[i], begin, end)
            acc = y[i]
            tmp = scratch("conv.dwtmp", (m, oh, ow))
            for a in range(kh):
                for b in range(kw):
                    v = xp[:, a * d[0]:a * d[0] + (oh - 1) * s[0] + 1:s[0],
                           b * d[1]:b * d[1] + (ow - 1) * s[1] + 1:s[1]]
                    wv = pw[:, a, b, None, None]
                    if a == 0 and b == 0:
                        np.multiply(v, wv, out=acc)
                    else:
                        np.multiply(v, wv, out=tmp)
                        acc += tmp
            _epilogue(y[i].reshape(m, p), bias, None if z is None else z[i].reshape(m, p),
                      activation, activation_params)
        return y
    pw = packed(W, ("nchw", group), lambda w: _pack_nchw(w, group))
    mg = m // group
    k = cg * kh * kw
    pointwise = (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end)
    cols_per_row = ow * k * group * 4
    rows = max(1, min(oh, BAND_BYTES // max(1, cols_per_row)))
    for i in range(n):
        y2 = y[i].reshape(m, p)
        if pointwise:
            a2 = x[i].reshape(c, h * wd)
            for g in range(group):
                np.matmul(pw[g], a2[g * cg:(g + 1) * cg], out=y2[g * mg:(g + 1) * mg])
            _epilogue(y2, bias, None if z is None else z[i].reshape(m, p), activation,
                      activation_params)
            continue
        xp = _pad_nchw(x[i], begin, end)
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            cols = scratch("conv.cols", (c, kh, kw, rr, ow))
            for a in range(kh):
                h0 = r0 * s[0] + a * d[0]
                for b in range(kw):
                    w0 = b * d[1]
                    cols[:, a, b] = xp[:, h0:h0 + (rr - 1) * s[0] + 1:s[0],
                                       w0:w0 + (ow - 1) * s[1] + 1:s[1]]
            c2 = cols.reshape(c * kh * kw, rr * ow)
            yb = y2[:, r0 * ow:r1 * ow]
            for g in range(group):
                np.matmul(pw[g], c2[g * k:(g + 1) * k], out=yb[g * mg:(g + 1) * mg])
            _epilogue(yb, bias, None if z is None else z[i].reshape(m, p)[:, r0 * ow:r1 * ow],
                      activation, activation_params)
    return y


# ---------------------------------------------------------------------------------------------
# Registration


def _conv_ok(x, w, *rest, **attrs: Any) -> bool:
    """2-D float32 convolutions with known ranks; anything else stays on the reference kernel."""
    if x.shape is None or w.shape is None or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    return all(f is None or f.dtype in (None, "float32") for f in (x, w, *rest))


def _conv_nhwc_kernel(X, W, B=None, *, out=None, **attrs):
    """Conv on NHWC activations (planned output)."""
    return conv_nhwc(X, W, B, None, out=out, **attrs)


def _conv_nchw_kernel(X, W, B=None, *, out=None, **attrs):
    """Conv on NCHW activations (planned output)."""
    return conv_nchw(X, W, B, None, out=out, **attrs)


def register() -> None:
    """Register the fast Conv variants on every Conv version."""
    from ..ops.base import REGISTRY

    for opdef in REGISTRY.versions("Conv"):
        opdef.kernel("cpu", dtypes=["float32"], layout="NHWC", priority=10, when=_conv_ok,
                     name="conv.cpu.nhwc", accepts_out=True)(_conv_nhwc_kernel)
        opdef.kernel("cpu", dtypes=["float32"], layout="NCHW", priority=10, when=_conv_ok,
                     name="conv.cpu.nchw", accepts_out=True)(_conv_nchw_kernel)
