"""Fast pooling for the CPU: MaxPool/AveragePool (2-D) and the global pools, NHWC and NCHW.

Windowed NHWC pools are separable and read x in place (no padded copy): per band of output
rows, whole input rows fold along H into a small W-padded band buffer (long contiguous runs),
then its columns fold along W into y (C-long runs only when the W stride is > 1, over the output
size). Averages scale each band by its row counts and fix only the border columns. The steps of
each (shape, attributes) are planned once and cached: small pools are Python-overhead bound.

MaxPool also runs on uint8/int8 (a max is exact in any dtype; QDQ models pool quantized or
dequantized activations in NCHW) and on NCHW: there the planes are (N*C, H, W, 1), so the H pass
is the same, but a W tap of the band is an element-strided view NumPy folds slowly; instead the
W pass runs over the band flattened (contiguous, the W padding columns keep windows from
crossing rows: a running max over the kw taps of every position) and then picks every stride-th
position of each row into y.
"""

from __future__ import annotations

import numpy as np

from opwarden import native
from opwarden.kernels.cpu.util import F32, ones_row, output, scratch, tap_range
from opwarden.native import maxpool as _native_maxpool
from opwarden.ops.base import REGISTRY
from opwarden.ops.pool import pool_geometry

# Budget for the H-folded band (the W pass reads it back): small enough to stay in L2 with the
# input rows it came from, large enough that the per-op Python overhead stays small.
BAND_BYTES = 256 << 10


def _geometry_nhwc(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """The reference geometry for an NHWC input: (kernel, s, d, begin, end, out, extra)."""
    n, h, w, c = x.shape
    return pool_geometry((n, c, h, w), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)


def _as_f32(X) -> np.ndarray:
    """X as float32 with a contiguous last axis (no copy when it already is)."""
    x = np.asarray(X)
    if x.dtype != F32 or x.strides[-1] != 4:
        x = np.ascontiguousarray(x, dtype=F32)
    return x


INT_MAX_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8))


def _as_max_input(X) -> np.ndarray:
    """MaxPool's input: uint8/int8 kept (with a contiguous last axis), the rest as float32."""
    x = np.asarray(X)
    if x.dtype in INT_MAX_DTYPES:
        return x if x.strides[-1] == 1 else np.ascontiguousarray(x)
    return _as_f32(x)


def _lowest(dtype: np.dtype):
    """The identity of a max in `dtype` (what padding cells read)."""
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


# Step codes of a plan: each step is (code, dst, dst_index, a, a_index, b, b_index), buffers
# 0 = x, 1 = the band buffer, 2 = y. UFUNC: dst = f(a, b); COPY: dst = a; FILL: dst = the
# identity; SCALE: dst *= a_index (a number or a broadcastable array); FLATW: dst = the W fold
# of the band's first `a` elements, flattened (b_index: ow, kw, stride, dilation, band width).
UFUNC, COPY, FILL, SCALE, FLATW = range(5)
_PLANS: dict[tuple, tuple] = {}


def _plan(xshape, kernel, s, d, begin, o, counts, band_bytes=None, itemsize=4,
          flat_w=False):
    """The steps of a 2-D NHWC pool (cached by the caller, so the Python work of slicing
    every band's taps is paid once per shape). counts: (ch, cw) for an average, else None.
    band_bytes: the band buffer's budget (BAND_BYTES unless given; the torch provider takes one
    band of all output rows, its per-call overhead being the larger cost). flat_w (NCHW, c = 1):
    the W pass is one FLATW step per band instead of one strided fold per tap.

    Per band of images / output rows: fold whole input rows along H into the band buffer
    (its W-padding columns hold the identity, filled once per call), then fold its columns
    along W into y, then (averages) scale the band while it is in cache."""
    n, h, w, c = xshape
    oh, ow = o
    (kh, kw), (s0, s1), (d0, d1), (bt, bl) = kernel, s, d, begin
    wp = (ow - 1) * s1 + (kw - 1) * d1 + 1  # band width in padded columns
    wuse = max(0, min(w, wp - bl))  # input columns any window reads
    rows = [tap_range(a * d0, h, oh, s0, bt) for a in range(kh)]
    # One tap and no W padding: the band is a strided view of x, no H pass at all.
    direct = kh == 1 and rows[0] == (0, oh) and bl == 0 and wuse == wp and not flat_w
    # flat_w holds the band and its running max: two buffers of the band's size.
    row_bytes = max(1, wp * c * itemsize * (2 if flat_w else 1))
    budget = BAND_BYTES if band_bytes is None else band_bytes
    if oh * row_bytes <= budget:
        nb, band = max(1, min(n, budget // (oh * row_bytes))), oh
    else:
        nb, band = 1, max(1, budget // row_bytes)
    steps = []
    if not direct:
        if bl:
            steps.append((FILL, 1, np.s_[:, :, :bl], 0, None, 0, None))
        if bl + wuse < wp:
            steps.append((FILL, 1, np.s_[:, :, bl + wuse:], 0, None, 0, None))
    for i0 in range(0, n, nb):
        im = slice(i0, min(n, i0 + nb))
        tm = slice(0, im.stop - i0)
        for r0 in range(0, oh, band):
            r1 = min(oh, r0 + band)
            if direct:
                first = r0 * s0 - bt
                src, base = 0, (im, slice(first, first + (r1 - r0 - 1) * s0 + 1, s0))
            else:
                src, base = 1, (tm, slice(0, r1 - r0))
                steps += _rows_steps(rows, r0, r1, (s0, d0, bt), im, tm, bl, wuse)
            if flat_w:
                steps.append((FLATW, 2, (im, slice(r0, r1)), (im.stop - i0) * (r1 - r0) * wp,
                              (ow, kw, s1, d1, wp), 0, None))
            else:
                steps += _cols_steps(src, base, (im, slice(r0, r1)), ow, kw, s1, d1)
            if counts is not None:
                steps += _scale_steps(counts, (im, slice(r0, r1)))
    return tuple(steps), direct, (nb, band, wp, c)


def _rows_steps(rows, r0, r1, geom, im, tm, bl, wuse):
    """Band rows [r0, r1): band[:, q, bl:bl + wuse] = fold over the H taps of x's input rows
    for output row r0 + q, each tap a set of whole rows (long runs); rows a tap misses (H
    padding) are left out of that tap, so a band with no tap covering all of it starts from
    the identity."""
    st, dl, off = geom
    rr = r1 - r0
    cols = slice(0, wuse)
    local = [(max(lo, r0) - r0, min(hi, r1) - r0) for lo, hi in rows]

    def src(a, lo, hi):
        first = (lo + r0) * st + a * dl - off
        return (im, slice(first, first + (hi - lo - 1) * st + 1, st), cols)

    def dst(lo, hi):
        return (tm, slice(lo, hi), slice(bl, bl + wuse))

    full = [a for a, r in enumerate(local) if r == (0, rr)]
    rest = [a for a, (lo, hi) in enumerate(local) if hi > lo and a not in full]
    out = []
    if len(full) >= 2:
        out.append((UFUNC, 1, dst(0, rr), 0, src(full[0], 0, rr), 0, src(full[1], 0, rr)))
        full = full[2:]
    elif full:
        out.append((COPY, 1, dst(0, rr), 0, src(full[0], 0, rr), 0, None))
        full = []
    else:
        out.append((FILL, 1, dst(0, rr), 0, None, 0, None))
    for a in full:
        out.append((UFUNC, 1, dst(0, rr), 1, dst(0, rr), 0, src(a, 0, rr)))
    for a in rest:
        lo, hi = local[a]
        out.append((UFUNC, 1, dst(lo, hi), 1, dst(lo, hi), 0, src(a, lo, hi)))
    return out


def _cols_steps(src, base, ydst, ow, kw, st, dl):
    """y band = fold over b < kw of band[:, :, j * st + b * dl] (the band is padded along W,
    so every tap covers every column). Stride 1: each tap is one long run per row."""
    def tap(b):
        return base + (slice(b * dl, b * dl + (ow - 1) * st + 1, st),)

    if kw == 1:
        return [(COPY, 2, ydst, src, tap(0), 0, None)]
    out = [(UFUNC, 2, ydst, src, tap(0), src, tap(1))]
    out += [(UFUNC, 2, ydst, 2, ydst, src, tap(b)) for b in range(2, kw)]
    return out


def _scale_steps(counts, ydst):
    """Divide a band of y by its windows' counts: whole rows by the row count times the
    interior column count (long runs), then only the columns whose count differs."""
    ch, cw = counts
    im, rs = ydst
    ch = ch[rs]
    typical = cw[len(cw) // 2]
    odd = np.flatnonzero(cw != typical)
    with np.errstate(divide="ignore", invalid="ignore"):
        if len(odd) > 4:
            inv = (1.0 / np.outer(ch, cw)).astype(F32)[:, :, None]
            return [(SCALE, 2, ydst, 0, inv, 0, None)]
        row = (1.0 / (ch * typical)).astype(F32)
        out = []
        if np.all(row == row[0]):
            if row[0] != 1:
                out.append((SCALE, 2, ydst, 0, row[0], 0, None))
        else:
            out.append((SCALE, 2, ydst, 0, row[:, None, None], 0, None))
        for j in odd:
            out.append((SCALE, 2, (im, rs, int(j)), 0, np.float32(typical / cw[j]), 0, None))
    return out


def _run(plan, x, y, ufunc, ident) -> None:
    """Run a plan: y = ufunc-fold of each window of x (NHWC), padding cells reading `ident`
    (never copied), then (averages) divided by the window counts."""
    steps, direct, band_shape, _ = plan
    band = x if direct else scratch("pool.band", band_shape, x.dtype)
    bufs = (x, band, y)
    copyto, multiply = np.copyto, np.multiply
    for code, dst, di, a, ai, b, bi in steps:
        if code == UFUNC:
            ufunc(bufs[a][ai], bufs[b][bi], out=bufs[dst][di])
        elif code == COPY:
            copyto(bufs[dst][di], bufs[a][ai])
        elif code == FILL:
            bufs[dst][di] = ident
        elif code == FLATW:
            _flat_w(band, a, ai, ufunc, bufs[dst][di])
        else:
            v = bufs[dst][di]
            multiply(v, ai, out=v)


def _flat_w(band, count, geom, ufunc, ydst) -> None:
    """ydst (images, rows, ow) = the W fold of the band's first `count` elements (rows of wp,
    W padding included): f[i] = fold over b < kw of flat[i + b * dl] over the flat band (long
    contiguous runs), then y[.., j] = f[row * wp + j * st]. The positions a row's windows start
    at are < wp - (kw - 1) * dl, so no window read crosses into the next row."""
    ow, kw, st, dl, wp = geom
    flat = band.reshape(-1)[:count]
    span = count - (kw - 1) * dl
    if kw == 1:
        acc = flat
    else:
        acc = scratch("pool.flatw", (count,), band.dtype)
        ufunc(flat[:span], flat[dl:dl + span], out=acc[:span])
        for b in range(2, kw):
            ufunc(acc[:span], flat[b * dl:b * dl + span], out=acc[:span])
    rows = acc[:count].reshape(ydst.shape[0], ydst.shape[1], wp)
    np.copyto(ydst, rows[:, :, 0:(ow - 1) * st + 1:st])


def _counts(n, k, s, d, b, e, o, include_pad) -> np.ndarray:
    """Per output position along one axis: window cells inside the input (or explicit pads)."""
    lo, hi = (-b, n + e) if include_pad else (0, n)
    start = np.arange(o) * s - b
    taps = start[:, None] + np.arange(k)[None, :] * d
    return ((taps >= lo) & (taps < hi)).sum(axis=1).astype(np.float64)


def _tup(v):
    return None if v is None else tuple(int(t) for t in v)


def _cached_plan(kind, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode,
                 count_include_pad, nchw=False):
    """(steps, direct, band shape, output shape) for this input shape and these attributes.
    nchw: x is (N, C, H, W), planned as NHWC planes (N * C, H, W, 1) with the flat W pass; the
    output shape is then (N, C, oh, ow)."""
    key = (kind, x.shape, x.dtype.itemsize, nchw, _tup(kernel_shape), _tup(strides),
           _tup(dilations), _tup(pads), auto_pad, int(ceil_mode), int(count_include_pad),
           BAND_BYTES)
    hit = _PLANS.get(key)
    if hit is not None:
        return hit
    if nchw:
        n, c, h, w = x.shape
        kernel, s, d, begin, end, o, _ = pool_geometry(
            x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
        plan = _plan((n * c, h, w, 1), kernel, s, d, begin, o, None,
                     itemsize=x.dtype.itemsize, flat_w=True) + ((n, c, o[0], o[1]),)
        return _store_plan(key, plan)
    kernel, s, d, begin, end, o, _ = _geometry_nhwc(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    counts = None
    if kind == "avg":
        h, w = x.shape[1:3]
        counts = (_counts(h, kernel[0], s[0], d[0], begin[0], end[0], o[0], count_include_pad),
                  _counts(w, kernel[1], s[1], d[1], begin[1], end[1], o[1], count_include_pad))
    plan = _plan(x.shape, kernel, s, d, begin, o, counts, itemsize=x.dtype.itemsize) + (
        (x.shape[0], o[0], o[1], x.shape[3]),)
    return _store_plan(key, plan)


def _store_plan(key, plan):
    if len(_PLANS) > 512:  # a bound for shape-polymorphic callers; plans are cheap to rebuild
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def maxpool_nhwc(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, storage_order=0, strides=None, noutputs=1, out=None):
    """MaxPool on NHWC activations (the Indices output is computed by the reference kernel)."""
    if noutputs > 1:
        return _via_reference("MaxPool", X, noutputs=noutputs, auto_pad=auto_pad,
                              ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                              pads=pads, storage_order=storage_order, strides=strides)
    x = _as_max_input(X)
    plan = _cached_plan("max", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    y = output(out, plan[3], x.dtype)
    if y.size:
        _run(plan, x, y, np.maximum, _lowest(x.dtype))
    return y


def maxpool_nhwc_native(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                        kernel_shape=None, pads=None, storage_order=0, strides=None, noutputs=1,
                        out=None):
    """MaxPool on NHWC float32 activations, compiled (native/pool.c): each output pixel folds
    its in-image taps along C on OpenMP threads (one pass, no band buffer). Other dtypes and
    the Indices output take maxpool_nhwc."""
    x = np.asarray(X)
    if noutputs > 1 or x.dtype != F32 or x.ndim != 4:
        return maxpool_nhwc(X, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                            kernel_shape=kernel_shape, pads=pads, storage_order=storage_order,
                            strides=strides, noutputs=noutputs, out=out)
    x = np.ascontiguousarray(x)
    key = ("native", x.shape, _tup(kernel_shape), _tup(strides), _tup(dilations), _tup(pads),
           auto_pad, int(ceil_mode))
    geom = _PLANS.get(key)
    if geom is None:
        kernel, s, d, begin, _end, o, _ = _geometry_nhwc(
            x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
        geom = _store_plan(key, (tuple(kernel), tuple(s), tuple(d), tuple(begin),
                                 (x.shape[0], o[0], o[1], x.shape[3])))
    y = output(out, geom[4], x.dtype)
    if y.size:
        _native_maxpool.maxpool_nhwc(x, y, *geom[:4])
    return y


def _max_native_ok(x, *rest, **attrs) -> bool:
    return native.available() and _rank4(x, *rest, **attrs)


def maxpool_nchw(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, storage_order=0, strides=None, noutputs=1, out=None):
    """MaxPool on NCHW activations (2-D; the Indices output is computed by the reference)."""
    if noutputs > 1:
        return REGISTRY.latest("MaxPool").reference(
            X, noutputs=noutputs, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
            kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides)
    x = np.asarray(X)
    if x.dtype not in INT_MAX_DTYPES:
        x = x.astype(F32, copy=False)
    x = np.ascontiguousarray(x)
    plan = _cached_plan("max", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0,
                        nchw=True)
    y = output(out, plan[3], x.dtype)
    if y.size:
        n, c, h, w = x.shape
        _run(plan, x.reshape(n * c, h, w, 1), y.reshape(n * c, y.shape[2], y.shape[3]),
             np.maximum, _lowest(x.dtype))
    return y


def averagepool_nhwc(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                     kernel_shape=None, pads=None, strides=None, out=None):
    """AveragePool on NHWC activations."""
    x = _as_f32(X)
    plan = _cached_plan("avg", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode,
                        count_include_pad)
    y = output(out, plan[3])
    if y.size:
        _run(plan, x, y, np.add, 0.0)
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
    """GlobalAveragePool on NHWC: mean over H, W -> (N, 1, 1, C). float32: the sum as a BLAS
    product with a ones vector, then the division (NumPy's mean over the strided pixel axis
    adds row by row in one thread, 3-10x slower); the sum is in float32 either way."""
    n, h, w, c = X.shape
    y = output(out, (n, 1, 1, c))
    if (X.dtype != np.float32 or y.dtype != np.float32 or h * w < 2 or n * c == 0
            or not y.flags.c_contiguous):
        np.mean(X, axis=(1, 2), keepdims=True, out=y)
        return y
    y2 = y.reshape(n, c)  # a view: y is C-contiguous
    y2.fill(0)  # (a BLAS call with beta 0 may still scale, and keep, what y held)
    np.matmul(ones_row(h * w), X.reshape(n, h * w, c), out=y2)
    y2 /= np.float32(h * w)
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


def _avg_ok(x, *rest, **attrs) -> bool:
    """Rank 4, and explicit pads smaller than the window: a window wholly in the padding
    averages nothing (the reference's NaN without count_include_pad; ORT refuses such pads)."""
    pads, k = attrs.get("pads"), attrs.get("kernel_shape")
    if pads and k and any(int(p) >= int(kk) for p, kk in zip(pads, list(k) * 2)):
        return False
    return _rank4(x, *rest, **attrs)


def _rank3plus(x, *rest, **attrs) -> bool:
    return x.shape is not None and len(x.shape) >= 3 and all(
        isinstance(v, int) and v > 0 for v in x.shape[1:])


def register() -> None:
    """Register the fast pooling variants on every version of the pooling operators."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    kmax = {**kw, "dtypes": ["float32", "uint8", "int8"]}
    for opdef in REGISTRY.versions("MaxPool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="maxpool.cpu.nhwc", **kmax)(maxpool_nhwc)
        opdef.kernel(layout="NHWC", when=_max_native_ok, name="maxpool.cpu.nhwc_native",
                     **{**kw, "priority": 11})(maxpool_nhwc_native)
        opdef.kernel(layout="NCHW", when=_rank4, name="maxpool.cpu.nchw", **kmax)(maxpool_nchw)
    for opdef in REGISTRY.versions("AveragePool"):
        opdef.kernel(layout="NHWC", when=_avg_ok, name="averagepool.cpu.nhwc",
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
