"""The depthwise NHWC convolution: one einsum over a strided window view (_depthwise_nhwc)."""

from __future__ import annotations

from functools import partial

import numpy as np

from opwarden.kernels.cpu.conv_common import Facts, _epilogue, _own, _pad_nhwc
from opwarden.kernels.cpu.util import F32, packed

# Depthwise convolutions with unit W stride and at most DW_MERGE_MAX_C channels merge (OW, C)
# into one axis against weights tiled OW times (see _depthwise_nhwc), while those take at most
# DW_TILED_MAX_BYTES (more channels have long inner loops already, and their tiled weights
# cost cache).
DW_TILED_MAX_BYTES = 1 << 20
DW_MERGE_MAX_C = 192


def nhwc_depthwise(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                   bplan) -> None:
    """Depthwise (see _depthwise_nhwc), then residual and activation."""
    z = _own(z, y)
    _depthwise_nhwc(x, W, s, d, begin, end, y, bias, shuffle)
    _epilogue(y, None, z, activation, params)


def depthwise_floats(f: Facts) -> int:
    _m, _cg, kh, kw = f.w
    c = f.x[3]
    if _dw_merged(f.s, f.d, kh, kw, f.ow, c):  # tiled weights and bias
        return f.zcopy + f.padded + (kh * kw + 1) * f.ow * c + kh * kw * c
    return f.zcopy + f.padded + kh * kw * c


def _pack_depthwise(w: np.ndarray) -> np.ndarray:
    """W (C, 1, kh, kw) -> (kh, kw, C): one channel vector per tap."""
    return np.ascontiguousarray(np.asarray(w, F32)[:, 0].transpose(1, 2, 0))


def _dw_merged(s, d, kh: int, kw: int, ow: int, c: int) -> bool:
    """Whether a depthwise convolution runs with (OW, C) merged into one axis (see
    _depthwise_nhwc): unit stride and dilation along W, at most DW_MERGE_MAX_C channels and
    tiled weights of at most DW_TILED_MAX_BYTES."""
    return (s[1] == 1 and d[1] == 1 and c <= DW_MERGE_MAX_C
            and kh * kw * ow * c * 4 <= DW_TILED_MAX_BYTES)


def _tile_taps(ow: int):
    """(kh, kw, C) tap vectors -> (kh, kw, OW*C): each tiled OW times along its row."""
    def pack(w: np.ndarray) -> np.ndarray:
        wt = _pack_depthwise(w)
        kh, kw, c = wt.shape
        return np.ascontiguousarray(
            np.broadcast_to(wt[:, :, None, :], (kh, kw, ow, c))).reshape(kh, kw, ow * c)
    return pack


def _depthwise_nhwc(x, W, s, d, begin, end, y, bias, shuffle: int = 0) -> None:
    """y[n, oh, ow, c] = sum over taps of xp[n, oh*s + a*d, ow*s + b*d, c] * W[c, 0, a, b]
    (+ bias), as one einsum over a strided window view of the padded image.

    NumPy's einsum runs the tap reduction inside its inner loop: faster than per-tap multiply
    and add passes (18 passes over the output for a 3x3 kernel), with no temporaries, and the
    same float32 sums in the same order.
    With unit stride and dilation along W, a tap's (OW, C) block of the padded image is one
    contiguous run, so the view is (oh, kh, kw, OW*C) against weights tiled OW times: the
    einsum's inner loop runs OW*C long instead of C, and the bias is one contiguous add.
    A channel shuffle of the input (`shuffle` >= 2) rides on the padding copy, made anyway.
    """
    kh, kw = W.shape[2:]
    n, oh, ow, c = y.shape
    xp = _pad_nhwc(x, begin, end, shuffle)
    # xp is C-contiguous: its strides from its shape (a size-1 axis may carry any stride).
    sc = xp.itemsize
    sw = c * sc
    sh = xp.shape[2] * sw
    sn = xp.shape[1] * sh
    merged = (_dw_merged(s, d, kh, kw, ow, c) and (c == 1 or y.strides[3] == 4)
              and (ow == 1 or y.strides[2] == 4 * c))
    if merged:
        wt = packed(W, ("dw_tiled", ow), _tile_taps(ow))  # (kh, kw, OW*C)
        row_bias = None if bias is None else packed(bias, ("dw_bias", ow),
                                                    partial(np.tile, reps=ow))  # (OW*C,)
        shape, strides = (oh, kh, kw, ow * c), (s[0] * sh, d[0] * sh, sw, sc)
        for i in range(n):
            v = np.ndarray(shape, xp.dtype, xp, i * sn, strides)
            yi = y[i].reshape(oh, ow * c)  # (a view: checked unit-stride (OW, C) rows)
            np.einsum("habk,abk->hk", v, wt, out=yi)
            if row_bias is not None:
                yi += row_bias
        return
    wt = packed(W, "dw_taps", _pack_depthwise)  # (kh, kw, C)
    shape, strides = (oh, ow, kh, kw, c), (s[0] * sh, s[1] * sw, d[0] * sh, d[1] * sw, sc)
    for i in range(n):
        # (xp is always C-contiguous; np.ndarray over it costs less a call than as_strided)
        v = np.ndarray(shape, xp.dtype, xp, i * sn, strides)
        np.einsum("hwabc,abc->hwc", v, wt, out=y[i])
    if bias is not None:
        y += bias  # (NumPy's: OpenBLAS's threads may have gone to sleep since the last GEMM)
