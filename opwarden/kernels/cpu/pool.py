"""Fast float32 pooling for the CPU: MaxPool/AveragePool (2-D) and the global pools, NHWC and NCHW.

Windowed NHWC pools are separable and read x in place (no padded copy): per band of output
rows, whole input rows fold along H into a small W-padded band buffer (long contiguous runs),
then its columns fold along W into y (C-long runs only when the W stride is > 1, over the output
size). Averages scale each band by its row counts and fix only the border columns. The steps of
each (shape, attributes) are planned once and cached: small pools are Python-overhead bound.
"""

from __future__ import annotations

import numpy as np

from opwarden.kernels.cpu.util import F32, output, scratch, tap_range
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


# Step codes of a plan: each step is (code, dst, dst_index, a, a_index, b, b_index), buffers
# 0 = x, 1 = the band buffer, 2 = y. UFUNC: dst = f(a, b); COPY: dst = a; FILL: dst = the
# identity; SCALE: dst *= a_index (a number or a broadcastable array).
UFUNC, COPY, FILL, SCALE = range(4)
_PLANS: dict[tuple, tuple] = {}


def _plan(xshape, kernel, s, d, begin, o, counts, band_bytes=None):
    """The steps of a 2-D NHWC pool (cached by the caller, so the Python work of slicing
    every band's taps is paid once per shape). counts: (ch, cw) for an average, else None.
    band_bytes: the band buffer's budget (BAND_BYTES unless given; the torch provider takes one
    band of all output rows, its per-call overhead being the larger cost).

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
    direct = kh == 1 and rows[0] == (0, oh) and bl == 0 and wuse == wp
    row_bytes = max(1, wp * c * 4)
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
    bufs = (x, x if direct else scratch("pool.band", band_shape), y)
    copyto, multiply = np.copyto, np.multiply
    for code, dst, di, a, ai, b, bi in steps:
        if code == UFUNC:
            ufunc(bufs[a][ai], bufs[b][bi], out=bufs[dst][di])
        elif code == COPY:
            copyto(bufs[dst][di], bufs[a][ai])
        elif code == FILL:
            bufs[dst][di] = ident
        else:
            v = bufs[dst][di]
            multiply(v, ai, out=v)


def _counts(n, k, s, d, b, e, o, include_pad) -> np.ndarray:
    """Per output position along one axis: window cells inside the input (or explicit pads)."""
    lo, hi = (-b, n + e) if include_pad else (0, n)
    start = np.arange(o) * s - b
    taps = start[:, None] + np.arange(k)[None, :] * d
    return ((taps >= lo) & (taps < hi)).sum(axis=1).astype(np.float64)


def _tup(v):
    return None if v is None else tuple(int(t) for t in v)


def _cached_plan(kind, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode,
                 count_include_pad):
    """(steps, direct, band shape, output shape) for this input shape and these attributes."""
    key = (kind, x.shape, _tup(kernel_shape), _tup(strides), _tup(dilations), _tup(pads),
           auto_pad, int(ceil_mode), int(count_include_pad), BAND_BYTES)
    hit = _PLANS.get(key)
    if hit is not None:
        return hit
    kernel, s, d, begin, end, o, _ = _geometry_nhwc(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    counts = None
    if kind == "avg":
        h, w = x.shape[1:3]
        counts = (_counts(h, kernel[0], s[0], d[0], begin[0], end[0], o[0], count_include_pad),
                  _counts(w, kernel[1], s[1], d[1], begin[1], end[1], o[1], count_include_pad))
    plan = _plan(x.shape, kernel, s, d, begin, o, counts) + ((x.shape[0], o[0], o[1],
                                                              x.shape[3]),)
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
    x = _as_f32(X)
    plan = _cached_plan("max", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    y = output(out, plan[3])
    if y.size:
        _run(plan, x, y, np.maximum, -np.inf)
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
    for opdef in REGISTRY.versions("MaxPool"):
        opdef.kernel(layout="NHWC", when=_rank4, name="maxpool.cpu.nhwc", **kw)(maxpool_nhwc)
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
