"""Fast float32 pooling for the CPU: MaxPool/AveragePool (2-D) and the global pools, NHWC and NCHW.

Windowed pools fold one strided view per kernel offset into the output buffer, a row band at a
time so the accumulator stays in cache; averages divide by a separable count map.
"""

from __future__ import annotations

import numpy as np

from ..ops.base import REGISTRY
from ..ops.pool import _setup
from ._util import F32, output, scratch

BAND_BYTES = 256 << 10


def _geometry_nhwc(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """The reference geometry for an NHWC input: (kernel, s, d, begin, end, out, extra)."""
    n, h, w, c = x.shape
    return _setup((n, c, h, w), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)


def _padded_nhwc(x, begin, full_end, value) -> np.ndarray:
    if not any(begin) and not any(full_end):
        return x
    n, h, w, c = x.shape
    bt, bl = begin
    xp = scratch("pool.pad", (n, h + bt + full_end[0], w + bl + full_end[1], c))
    xp[:, :bt] = value
    xp[:, bt + h:] = value
    xp[:, bt:bt + h, :bl] = value
    xp[:, bt:bt + h, bl + w:] = value
    xp[:, bt:bt + h, bl:bl + w] = x
    return xp


def _fold(xp, y, kernel, s, d, ufunc) -> None:
    """y[n, oh, ow, :] = ufunc-reduce over the window at (oh, ow) of padded xp (NHWC)."""
    n, oh, ow, c = y.shape
    rows = max(1, min(oh, BAND_BYTES // max(1, ow * c * 4)))
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            acc = y[i, r0:r1]
            first = True
            for a in range(kernel[0]):
                h0 = r0 * s[0] + a * d[0]
                for b in range(kernel[1]):
                    w0 = b * d[1]
                    v = xp[i, h0:h0 + (rr - 1) * s[0] + 1:s[0], w0:w0 + (ow - 1) * s[1] + 1:s[1]]
                    if first:
                        np.copyto(acc, v)
                        first = False
                    else:
                        ufunc(acc, v, out=acc)


def _tap_range(off: int, size: int, o: int, st: int, b: int) -> tuple[int, int]:
    """Output indices [lo, hi) whose tap at kernel offset `off` reads inside the input."""
    lo = min(o, max(0, -((off - b) // st)))
    hi = min(o, (size - 1 - off + b) // st + 1)
    return lo, max(lo, hi)


def _fold_direct(x, y, kernel, s, d, begin, ufunc) -> bool:
    """_fold without a padded copy of x, separably: a band of input rows is first folded
    along W (into H: rows x OW x C), then H's rows along H into y. Each tap folds only the
    outputs whose window cell lies inside x (a padding cell adds nothing to a max or a sum).
    The H pass's views have long contiguous runs when the W stride is 1, the second pass's
    always (whole rows), where the 2-D window's views run C floats at a time. Needs a tap
    inside x for every output along each axis, to start from, and a window where this pays
    (see _separable); False (nothing done) otherwise."""
    n, h, w, c = x.shape
    if not _separable(kernel, s, begin, c):
        return False
    _, oh, ow, _ = y.shape
    (kh, kw), (s0, s1), (d0, d1), (bt, bl) = kernel, s, d, begin
    rows = [_tap_range(a * d0, h, oh, s0, bt) for a in range(kh)]
    cols = [_tap_range(b * d1, w, ow, s1, bl) for b in range(kw)]
    row_taps = _order(rows, oh)
    col_taps = _order(cols, ow)
    if row_taps is None or col_taps is None:
        return False
    band = max(1, min(oh, BAND_BYTES // max(1, s0 * ow * c * 4)))
    for i in range(n):
        for r0 in range(0, oh, band):
            r1 = min(oh, r0 + band)
            lo_in = max(0, r0 * s0 - bt)
            hi_in = min(h, (r1 - 1) * s0 + (kh - 1) * d0 - bt + 1)
            hb = scratch("pool.h", (hi_in - lo_in, ow, c))
            _fold_axis(hb, x[i, lo_in:hi_in], 1, (s1, d1, bl), col_taps, cols, 0, ufunc)
            local = [(max(lo, r0) - r0, min(hi, r1) - r0) for lo, hi in rows]
            _fold_axis(y[i, r0:r1], hb, 0, (s0, d0, bt + lo_in), row_taps, local, r0, ufunc)
    return True


def _separable(kernel, s, begin, c: int) -> bool:
    """Whether the separable fold pays: it does kh + kw folds where the 2-D one does kh * kw,
    but the first over more rows, with runs of only C floats when the W stride is not 1.
    Measured: a loss for 2x2 windows and for W-strided ones, unless it saves the padded copy
    of a wide input (the 112x112x64 stem pools: -13%)."""
    return kernel[0] * kernel[1] >= 9 and (s[1] == 1 or (any(begin) and c >= 64))


def _order(ranges, o):
    """Taps with a non-empty output range, those covering all o outputs first; None when
    none covers all."""
    full = [t for t, r in enumerate(ranges) if r == (0, o)]
    if not full:
        return None
    return full + [t for t, (lo, hi) in enumerate(ranges) if hi > lo and t not in full]


def _fold_axis(acc, base, axis, geom, taps, ranges, shift, ufunc) -> None:
    """acc = ufunc-fold over the taps along `axis`: local output q of tap t reads base at
    index (q + shift) * stride + t * dilation - offset, geom = (stride, dilation, offset);
    ranges are the local outputs [lo, hi) each tap reaches."""
    n = acc.shape[axis]
    st, dl, off = geom

    def part(a, lo, hi):
        return a[lo:hi] if axis == 0 else a[:, lo:hi]

    def src(t, lo, hi):
        first = (lo + shift) * st + t * dl - off
        sl = slice(first, first + (hi - lo - 1) * st + 1, st)
        return base[sl] if axis == 0 else base[:, sl]

    t0 = taps[0]
    rest = taps[1:]
    if len(taps) > 1 and ranges[taps[1]] == (0, n):
        ufunc(src(t0, 0, n), src(taps[1], 0, n), out=acc)
        rest = taps[2:]
    else:
        np.copyto(acc, src(t0, 0, n))
    for t in rest:
        lo, hi = ranges[t]
        if hi > lo:
            sub = part(acc, lo, hi)
            ufunc(sub, src(t, lo, hi), out=sub)


def _counts(n, k, s, d, b, e, o, include_pad) -> np.ndarray:
    """Per output position along one axis: window cells inside the input (or explicit pads)."""
    lo, hi = (-b, n + e) if include_pad else (0, n)
    start = np.arange(o) * s - b
    taps = start[:, None] + np.arange(k)[None, :] * d
    return ((taps >= lo) & (taps < hi)).sum(axis=1).astype(np.float32)


def maxpool_nhwc(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, storage_order=0, strides=None, noutputs=1, out=None):
    """MaxPool on NHWC activations (the Indices output is computed by the reference kernel)."""
    if noutputs > 1:
        return _via_reference("MaxPool", X, noutputs=noutputs, auto_pad=auto_pad,
                              ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                              pads=pads, storage_order=storage_order, strides=strides)
    x = np.ascontiguousarray(X, dtype=F32)
    kernel, s, d, begin, end, o, extra = _geometry_nhwc(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    y = output(out, (x.shape[0], o[0], o[1], x.shape[3]))
    if y.size == 0:
        return y
    if not _fold_direct(x, y, kernel, s, d, begin, np.maximum):
        xp = _padded_nhwc(x, begin, [e + t for e, t in zip(end, extra)], -np.inf)
        _fold(xp, y, kernel, s, d, np.maximum)
    return y


def averagepool_nhwc(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                     kernel_shape=None, pads=None, strides=None, out=None):
    """AveragePool on NHWC activations."""
    x = np.ascontiguousarray(X, dtype=F32)
    kernel, s, d, begin, end, o, extra = _geometry_nhwc(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    y = output(out, (x.shape[0], o[0], o[1], x.shape[3]))
    if y.size == 0:
        return y
    if not _fold_direct(x, y, kernel, s, d, begin, np.add):
        xp = _padded_nhwc(x, begin, [e + t for e, t in zip(end, extra)], 0.0)
        _fold(xp, y, kernel, s, d, np.add)
    h, w = x.shape[1:3]
    ch = _counts(h, kernel[0], s[0], d[0], begin[0], end[0], o[0], count_include_pad)
    cw = _counts(w, kernel[1], s[1], d[1], begin[1], end[1], o[1], count_include_pad)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (np.float32(1.0) / np.outer(ch, cw)).astype(F32)
        y *= inv[:, :, None]
    return y


def _via_reference(op_type, X, noutputs=1, **attrs):
    """Rare cases (MaxPool Indices): the reference kernel on NCHW, output 0 back to NHWC.

    Only output 0 is an NHWC activation; Indices keep their ONNX (NCHW) layout and meaning.
    """
    ref = REGISTRY.latest(op_type).reference
    res = ref(np.ascontiguousarray(np.moveaxis(X, -1, 1)), noutputs=noutputs, **attrs)
    res = res if isinstance(res, tuple) else (res,)
    return (np.ascontiguousarray(np.moveaxis(res[0], 1, -1)),) + tuple(res[1:])


def global_avg_nhwc(X, *, out=None):
    """GlobalAveragePool on NHWC: mean over H, W -> (N, 1, 1, C)."""
    n, h, w, c = X.shape
    y = output(out, (n, 1, 1, c))
    np.mean(X.reshape(n, h * w, c), axis=1, out=y.reshape(n, c))
    return y


def global_max_nhwc(X, *, out=None):
    """GlobalMaxPool on NHWC: max over H, W -> (N, 1, 1, C)."""
    n, h, w, c = X.shape
    y = output(out, (n, 1, 1, c))
    np.max(X.reshape(n, h * w, c), axis=1, out=y.reshape(n, c))
    return y


def global_avg_nchw(X, *, out=None):
    """GlobalAveragePool on NCHW (any spatial rank)."""
    n, c = X.shape[:2]
    y = output(out, (n, c) + (1,) * (X.ndim - 2))
    np.mean(X.reshape(n, c, -1), axis=2, out=y.reshape(n, c))
    return y


def global_max_nchw(X, *, out=None):
    """GlobalMaxPool on NCHW (any spatial rank)."""
    n, c = X.shape[:2]
    y = output(out, (n, c) + (1,) * (X.ndim - 2))
    np.max(X.reshape(n, c, -1), axis=2, out=y.reshape(n, c))
    return y


def _rank4(x, *rest, **attrs) -> bool:
    return x.shape is not None and len(x.shape) == 4 and all(
        isinstance(v, int) and v > 0 for v in x.shape[1:])


def _rank3plus(x, *rest, **attrs) -> bool:
    return x.shape is not None and len(x.shape) >= 3 and all(
        isinstance(v, int) and v > 0 for v in x.shape[1:])


def register() -> None:
    """Register the fast pooling variants on every version of the pooling operators."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in REGISTRY.versions("MaxPool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="maxpool.cpu.nhwc", **kw)(maxpool_nhwc)
    for opdef in REGISTRY.versions("AveragePool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="averagepool.cpu.nhwc",
                     **kw)(averagepool_nhwc)
    for opdef in REGISTRY.versions("GlobalAveragePool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="globalaveragepool.cpu.nhwc",
                     **kw)(global_avg_nhwc)
        opdef.kernel(layout="NCHW", when=_rank3plus, name="globalaveragepool.cpu.nchw",
                     **kw)(global_avg_nchw)
    for opdef in REGISTRY.versions("GlobalMaxPool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="globalmaxpool.cpu.nhwc",
                     **kw)(global_max_nhwc)
        opdef.kernel(layout="NCHW", when=_rank3plus, name="globalmaxpool.cpu.nchw",
                     **kw)(global_max_nchw)
