"""The GEMM-shaped NHWC convolutions: pointwise, shifted GEMM, banded im2col, few pixels.

Pointwise (1x1, stride 1, no padding): the input already is the patch matrix, one GEMM per
group (the transposed product over few pixels). Shifted GEMM (k x k on a large map with
enough input channels): the input is padded and split by stride phase once, and each tap is
one accumulating BLAS GEMM over a shifted row range of that flat image, so no patch matrix is
built (see conv_common._phase_planes). Banded im2col (small maps, and whatever no other path
takes): patches of a band of output rows are copied by one strided copy and each band and
group is one GEMM; for group 1 the bias rides in the GEMM as a column of ones. Few pixels
(group 1, large weights, at most PATCH_T_MAX_PIXELS outputs): the same patch matrix in the
transposed product. Each path's scratch is counted by its `*_floats` rule (conv.nhwc_workspace).
"""

from __future__ import annotations

import numpy as np

from opwarden import native
from opwarden.kernels.cpu import packed_gemm
from opwarden.kernels.cpu.blas_split import SPLIT, over_rows, split_gemm
from opwarden.kernels.cpu.conv_common import (
    Facts,
    _band_rows,
    _bias_row,
    _branch1x1_weights,
    _epilogue,
    _hot,
    _own,
    _packed_nhwc,
    _packed_nhwc_c,
    _pad_nhwc,
    _phase_planes,
    _phase_planes_floats,
    _plane_geometry,
)
from opwarden.kernels.cpu.util import (
    F32,
    add_rows,
    blas_adds,
    matmul_acc,
    packed,
    ptr,
    scratch,
    sgemm,
)
from opwarden.memory.constants import is_constant
from opwarden.native.bound import conv_epilogue_call

# Patch-matrix band size (bytes): big enough for BLAS to reach its peak, small enough to stay in
# the last-level cache together with the weights.
BAND_BYTES = 3 << 20
# Shifted GEMM: used when each group has at least SHIFT_MIN_C input channels (a tap's GEMM has
# K = C/group, too thin below that), at least SHIFT_MIN_PIXELS output pixels (on small maps the
# wide rows waste a larger share, e.g. 9 computed columns for 7, and the per-tap GEMMs are too
# short for two BLAS threads) and at most SHIFT_MAX_M_PER_C output channels per input channel
# (each tap re-reads and re-writes the output, M floats a pixel, where the patch matrix writes
# C, so wide outputs favour the latter); in wide output bands of about WIDE_BAND_BYTES.
SHIFT_MIN_C = 16
SHIFT_MIN_PIXELS = 700
SHIFT_MAX_M_PER_C = 2
WIDE_BAND_BYTES = 4 << 20
# Outputs of at least this many floats get bias and residual written before the GEMM, which
# then accumulates (see _prefill).
PREFILL_MIN = 1 << 17
# Pointwise convolutions over at most this many pixels compute the transposed product.
PW_T_MAX_PIXELS = 64
# ... and so do group-1 patch-matrix convolutions (k x k, or strided 1x1) over at most this many
# output pixels per image whose weights hold at least PATCH_T_MIN_WEIGHTS floats (see
# _few_pixels_nhwc; smaller weights stay in cache, where the usual orientation is faster).
PATCH_T_MAX_PIXELS = 64
PATCH_T_MIN_WEIGHTS = 1 << 18


def _prefill(y: np.ndarray, bias, z, group: int = 1, always: bool = False,
             hot: bool = False) -> bool:
    """y = bias + z (either may be None) before GEMMs accumulate onto it; False (y untouched)
    when both are None, or when the epilogue adds them better after the GEMM. A residual
    sharing y's memory is always folded in first (the GEMM would overwrite it). Otherwise,
    after a `hot` GEMM (see _hot) with OpenBLAS's threaded adds at hand (util.add_rows,
    add_into), adding after the GEMM is faster than this prefill's single-threaded NumPy
    pass, so y is left alone. Else one write pass here replaces the GEMM's own write plus a
    separate read-modify-write pass per term afterwards; small or grouped outputs are slower
    so (per-call overhead). `always`: prefill whatever the size (callers whose
    GEMMs accumulate anyway), except after a hot GEMM."""
    if z is not None and np.shares_memory(z, y):
        if z.ctypes.data != y.ctypes.data or z.strides != y.strides:
            np.add(z, 0 if bias is None else bias, out=y)  # (a partial overlap)
        elif bias is not None:  # y holds z already; before this GEMM the threads are awake
            add_rows(y, bias, hot)  # if the operator before was a large GEMM too (ResNet's 3x3)
        return True
    if (hot and blas_adds()) or (not always and (group > 1 or y.size < PREFILL_MIN)):
        return False
    if z is not None:
        if bias is not None:
            np.add(z, bias, out=y)
        else:
            np.copyto(y, z)
        return True
    if bias is not None:
        np.copyto(y, bias)
        return True
    return False


def _gemms(a: np.ndarray, pw: np.ndarray, y2: np.ndarray, group: int, acc: bool) -> None:
    """y2 (+)= a @ pw[g] for each group's column block (a: rows x group*K)."""
    k, mg = pw.shape[1:]
    if group > 1 and not acc and a.strides[1] == a.itemsize and y2.strides[1] == y2.itemsize:
        # One batched matmul over (group, rows, K) views: NumPy loops the groups' BLAS calls
        # in C, faster than a Python loop over the groups. Splitting a unit-stride last axis
        # is always a view (a copied `out` would lose the result), and cheaper than
        # as_strided.
        rows = a.shape[0]
        yv = y2.reshape(rows, group, mg).transpose(1, 0, 2)
        np.matmul(a.reshape(rows, group, k).transpose(1, 0, 2), pw, out=yv)
        return
    if group == 1 and not acc and packed_gemm.takes(a, pw[0], pw):
        packed_gemm.matmul_into(a, pw[0], y2, None, pw)
        return
    if group == 1 and split_gemm(a, pw[0], y2, accumulate=acc):
        return
    for g in range(group):
        if acc:
            matmul_acc(a[:, g * k:(g + 1) * k], pw[g], y2[:, g * mg:(g + 1) * mg], True)
        else:
            np.matmul(a[:, g * k:(g + 1) * k], pw[g], out=y2[:, g * mg:(g + 1) * mg])


def nhwc_pointwise(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                   bplan) -> None:
    """1x1, stride 1, no padding: the input already is the patch matrix, one GEMM per group."""
    n, h, wd, c = x.shape
    m, cg = W.shape[:2]
    group = c // cg
    a = x.reshape(n * h * wd, c)
    y2 = y.reshape(-1, m)
    zz = None if z is None else z.reshape(y2.shape)
    if group == 1 and y2.shape[0] == 1 and W.dtype == F32 and W.flags.c_contiguous:
        # One pixel (a squeeze-excite gate after a global pool): a matrix-vector product
        # straight into y, then the one-pass epilogue; no transposed scratch to copy back.
        zz = _own(zz, y2)
        np.matmul(W.reshape(m, c), a[0], out=y2[0])
        _epilogue(y2, bias, zz, activation, params)
        return
    if group == 1 and y2.shape[0] <= PW_T_MAX_PIXELS and W.dtype == F32 \
            and W.flags.c_contiguous:
        # Few pixels: Y.T = W @ X.T (W as stored) runs faster in OpenBLAS than X @ W.T; the
        # transposing copy back is small and takes the bias along.
        zz = _own(zz, y2)
        yt = scratch("conv.yt", (m, y2.shape[0]))
        if not split_gemm(W.reshape(m, c), a.T, yt):
            np.matmul(W.reshape(m, c), a.T, out=yt)
        if bias is not None:
            np.add(yt.T, bias, out=y2)
        else:
            np.copyto(y2, yt.T)
        _epilogue(y2, None, zz, activation, params, _hot(m, y2.shape[0], c))
        return
    if group > 1 and zz is not None and np.may_share_memory(zz, y2):
        # Grouped, in place over the residual: the batched matmul (which cannot accumulate)
        # writes a scratch that the residual add then reads; the same traffic as out of place
        # (copying z aside first is slower).
        t = scratch("conv.grouped", y2.shape)
        _gemms(a, _packed_nhwc(W, group), t, group, False)
        np.add(t, zz, out=y2)
        _epilogue(y2, bias, None, activation, params)
        return
    # (Grouped GEMMs run per group: small, their threads are not known to be awake.)
    hot = group == 1 and _hot(y2.shape[0], m, c)
    pw = _packed_nhwc(W, group)
    if (group == 1 and packed_gemm.takes(a, pw[0], pw)
            and (zz is None or not np.shares_memory(zz, y2))):
        acc = False  # the packed GEMM, then bias and residual in the one epilogue pass
    else:
        acc = _prefill(y2, bias, zz, group, hot=hot)
    _gemms(a, pw, y2, group, acc)
    if acc:
        _epilogue(y2, None, None, activation, params)
    else:
        _epilogue(y2, bias, zz, activation, params, hot)


def _epilogue_call(y2, b, act: str, params, hot: bool, z: bool = False):
    """_epilogue(y2, b, z2, act, params, hot) as a callable f(z2) (None: nothing to do), on
    the compiled pass bound to y2 where it takes it (see _native_epilogue); with `z` the
    residual z2 it is given is apart from y2's memory, C-contiguous float32."""
    if b is None and not act and not z:
        return None
    if (native.available() and native.epilogue_act_code(act, params) is not None
            and (b is None or (b.dtype == F32 and b.shape == (y2.shape[1],)))):
        return conv_epilogue_call(y2, None if b is None else np.ascontiguousarray(b), act,
                                  params)
    return lambda z2=None: _epilogue(y2, b, z2, act, params, hot)


def bind_pointwise(x, W, B, s, d, begin, end, y, bias, activation, params):
    """nhwc_pointwise for a prepared step of one group, its choices made once: the GEMV of one
    pixel, the transposed product of a few, or the GEMM, this one also with a residual (apart
    from Y, or the memory Y is written in place of: FusedConv's alias); the epilogue on the
    compiled pass (native.bound) where it takes it. The same calls in the same order as
    nhwc_pointwise makes them; other calls run the algorithm itself."""
    n, h, wd, c = x.shape
    m, cg = W.shape[:2]
    rows = n * h * wd
    if SPLIT or cg != c or W.dtype != F32 or not W.flags.c_contiguous:
        return None
    act = activation.decode() if isinstance(activation, bytes) else str(activation or "")
    params = params or ()
    y2 = y.reshape(rows, m)
    few = 1 < rows <= PW_T_MAX_PIXELS
    gemm = not few and rows > 1
    owner = None
    if not gemm:
        w2, hot, acc = W.reshape(m, c), (few and _hot(m, rows, c)), False
    else:
        owner = _packed_nhwc(W, 1)
        w2 = owner[0]
        hot = _hot(rows, m, c)
    # nhwc_pointwise's choices: the packed GEMM where it takes the weight (bias and residual
    # then in the epilogue), else _prefill's (apart from a residual in Y's memory): bias and
    # residual written first for the GEMM to accumulate on, or added by the epilogue
    pk = gemm and packed_gemm.takes(x.reshape(rows, c), w2, owner)
    prefill = gemm and not pk and not (hot and blas_adds()) and y.size >= PREFILL_MIN
    acc = prefill and bias is not None
    # (few pixels: the bias rides on the transposing copy)
    epi = _epilogue_call(y2, None if acc or few else bias, act, params, hot)
    epi_acc = _epilogue_call(y2, None, act, params, False) if gemm else None
    epi_z = _epilogue_call(y2, bias, act, params, hot, z=True) if gemm else None
    seen: dict = {}  # id of a residual view -> (the view, "alias" / "apart" / None)

    def kind(z) -> str | None:
        got = seen.get(id(z))
        if got is not None and got[0] is z:
            return got[1]
        k = None  # (a partial overlap: the algorithm's own copy)
        if z.strides == y.strides and z.ctypes.data == y.ctypes.data:
            k = "alias"
        elif not np.may_share_memory(z, y):
            k = "apart"
        if len(seen) < 8:  # (views are fixed per step: the same object, the same memory)
            seen[id(z)] = (z, k)
        return k

    def call(x, z) -> None:
        zk = None if z is None or not gemm else kind(z)
        if not x.flags.c_contiguous or (z is not None and zk is None):
            nhwc_pointwise(x, W, B, s, d, begin, end, y, bias, z, activation, params, 0, None)
            return
        a = x.reshape(rows, c)
        if z is not None:
            z2 = z.reshape(rows, m)
            if zk == "alias" or prefill:
                if zk == "alias":
                    if bias is not None:
                        add_rows(y2, bias, hot)
                elif bias is not None:
                    np.add(z2, bias, out=y2)
                else:
                    np.copyto(y2, z2)
                matmul_acc(a, w2, y2, True)
                if epi_acc is not None:
                    epi_acc()
            elif pk:
                packed_gemm.matmul_into(a, w2, y2, None, owner)
                epi_z(z2)
            else:
                np.matmul(a, w2, out=y2)
                epi_z(z2)
            return
        if rows == 1:
            np.matmul(w2, a[0], out=y2[0])
        elif few:
            yt = scratch("conv.yt", (m, rows))
            np.matmul(w2, a.T, out=yt)
            if bias is not None:
                np.add(yt.T, bias, out=y2)
            else:
                np.copyto(y2, yt.T)
        elif acc:
            np.copyto(y2, bias)
            matmul_acc(a, w2, y2, True)
        elif pk:
            packed_gemm.matmul_into(a, w2, y2, None, owner)
        else:
            np.matmul(a, w2, out=y2)
        if epi is not None:
            epi()

    return call


def pointwise_floats(f: Facts) -> int:
    n = f.x[0]
    m, cg = f.w[:2]
    pixels = n * f.oh * f.ow
    if f.group == 1 and pixels <= PW_T_MAX_PIXELS:
        return f.zcopy + m * pixels
    return (f.zcopy if f.group > 1 else 0) + (m * cg if f.group > 1 else 0)


def nhwc_shifted(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                 bplan) -> None:
    """k x k convolution as one accumulating GEMM per tap (see _shifted_nhwc)."""
    group = x.shape[3] // W.shape[1]
    _shifted_nhwc(x, _packed_nhwc_c(W, group), s, d, begin, W.shape[2:], group, y, bias,
                  _own(z, y), activation, params)


def shifted_floats(f: Facts) -> int:
    m, cg, kh, kw = f.w
    planes = _phase_planes_floats(f.x, f.s, f.d, (kh, kw), f.oh, f.ow)
    wq = _plane_geometry(f.s, f.d, (kh, kw), f.oh, f.ow)[3]
    rows = _band_rows(f.oh, WIDE_BAND_BYTES, wq * m * 4)
    return f.zcopy + planes + (rows * wq * m if wq != f.ow else 0) + kh * kw * cg * m


def _patch_view(x, W, s, d, begin, end, oh, ow) -> np.ndarray:
    """Patches as one read-only strided view (N, OH, OW, group, kh, kw, cg) of the padded
    image, so each band is filled by a single copy whose inner run is a whole (kw, cg) row of
    the window when the group is 1 and dilation is 1."""
    xp = _pad_nhwc(x, begin, end)
    n, hp, wp, c = xp.shape
    _m, cg, kh, kw = W.shape
    e = xp.itemsize
    # (np.ndarray over xp's buffer costs less per call than as_strided; xp is contiguous.)
    view = np.ndarray(
        (n, oh, ow, c // cg, kh, kw, cg), F32, xp, 0,
        (hp * wp * c * e, s[0] * wp * c * e, s[1] * c * e, cg * e, d[0] * wp * c * e,
         d[1] * c * e, e))
    view.flags.writeable = False
    return view


def nhwc_few_pixels(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                    bplan) -> None:
    """Group-1 patch matrix over few output pixels, transposed (see _few_pixels_nhwc)."""
    z = _own(z, y)
    view = _patch_view(x, W, s, d, begin, end, y.shape[1], y.shape[2])
    _few_pixels_nhwc(view, W, B, bias, y, z, activation, params)


def _patch_input_floats(f: Facts) -> int:
    """The padded input the patch views read (X's contiguous copy where nothing is padded)."""
    return f.padded if any(f.begin) or any(f.end) else int(np.prod(f.x))


def few_pixels_floats(f: Facts) -> int:
    m, cg, kh, kw = f.w
    kb = kh * kw * cg + f.bias
    pixels = f.x[0] * f.oh * f.ow
    return f.zcopy + _patch_input_floats(f) + pixels * kb + m * pixels + m * kb


def nhwc_im2col(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                bplan) -> None:
    """Banded im2col: one strided copy of a band's patches, one GEMM per band and group."""
    n, oh, ow, m = y.shape
    _m, cg, kh, kw = W.shape
    group = x.shape[3] // cg
    k = kh * kw * cg
    z = _own(z, y)
    view = _patch_view(x, W, s, d, begin, end, oh, ow)
    # Group 1 with a bias: the bias rides in the GEMM as a column of ones in the patch matrix
    # and a last row of the weights, which saves a broadcast add over each band.
    wb = None if bias is None or group > 1 else _bias_row(W, B, bias)
    pw = None if wb is not None else _packed_nhwc(W, group)
    kb = k + (wb is not None)
    rows = _band_rows(oh, BAND_BYTES, ow * kb * group * 4)
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            zz = None if z is None else z[i, r0:r1].reshape(y2.shape)
            if wb is not None:
                cols = scratch("conv.cols", (rr * ow, kb))
                np.copyto(cols[:, :k].reshape(rr, ow, group, kh, kw, cg), view[i, r0:r1])
                cols[:, k] = 1
                if bplan is not None and sgemm() is not None:
                    _branch_gemms(cols, wb, W, bias, bplan, cg, y2)
                elif not _packed_into(cols, wb, y2) and not split_gemm(cols, wb, y2):
                    np.matmul(cols, wb, out=y2)
                _epilogue(y2, None, zz, activation, params, _hot(rr * ow, m, kb))
                continue
            cols = scratch("conv.cols", (rr, ow, group, kh, kw, cg))
            np.copyto(cols, view[i, r0:r1])
            c2 = cols.reshape(rr * ow, group * k)
            # (Prefilling the bias here is slower: the bands are cache-sized.)
            _gemms(c2, pw, y2, group, False)
            _epilogue(y2, bias, zz, activation, params, group == 1 and _hot(rr * ow, m, k))


def im2col_floats(f: Facts) -> int:
    m, cg, kh, kw = f.w
    k = kh * kw * cg
    kb = k + f.bias
    rows = _band_rows(f.oh, BAND_BYTES, f.ow * kb * f.group * 4)
    return (f.zcopy + _patch_input_floats(f) + rows * f.ow * (kb if f.group == 1 else f.group * k)
            + kb * m)


def _shifted_nhwc(x, pw, s, d, begin, khw, group, y, bias, z, activation, params) -> None:
    """k x k convolution as one accumulating GEMM per tap over shifted row ranges of the
    padded, phase-split input: no patch matrix. Each band of output rows is computed "wide"
    (wq >= ow columns, the extra ones garbage) and its valid columns copied out with the bias."""
    gemm = sgemm()
    n, oh, ow, m = y.shape
    c = x.shape[3]
    cg, mg = c // group, m // group
    e = 4
    pwp = ptr(pw)  # (pw: C-contiguous, group-major)
    # group 1 on the packed GEMM: every tap of a band in one call, the weight packed once
    pk = group == 1 and packed_gemm.weight_takes(pw[0].reshape(-1, m), pw)
    for i in range(n):
        planes, wq, taps = _phase_planes(x, i, s, d, begin, khw, oh, ow, "conv.planes")
        base = planes.ctypes.data
        rows = _band_rows(oh, WIDE_BAND_BYTES, wq * m * 4)
        direct = wq == ow
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            yb = y[i, r0:r1]
            yw = yb if direct else scratch("conv.wide", (rr, wq, m))
            ywp = yw.ctypes.data

            def wide_rows(a: int, b: int, ywp=ywp, rb=r0 * wq, base=base, taps=taps) -> None:
                # Rows a:b of the band's wide output, all taps: one thread accumulates them.
                for g in range(group):
                    bptr = pwp + g * pw.strides[0]
                    for t, off in enumerate(taps):
                        gemm(b - a, mg, cg, base + (off + (rb + a) * c + g * cg) * e, c,
                             bptr + t * cg * mg * e, mg, 0.0 if t == 0 else 1.0,
                             ywp + (a * m + g * mg) * e, m)

            if not _packed_taps(pk, planes, c, np.array(taps, np.int64) + r0 * wq * c, rr * wq,
                                pw, yw):
                over_rows(rr * wq, rr * wq * m * cg * len(taps), wide_rows)
            hot = group == 1 and _hot(rr * wq, mg, cg)
            if not direct:
                if bias is not None:
                    np.add(yw[:, :ow], bias, out=yb)
                else:
                    np.copyto(yb, yw[:, :ow])
                _epilogue(yb, None, None if z is None else z[i, r0:r1], activation, params, hot)
            else:
                _epilogue(yb, bias, None if z is None else z[i, r0:r1], activation, params, hot)


# (The packed-GEMM branches of the convolution routes live in these helpers, so that the
# routes' own lines run on every machine: test_check_reaches_every_line_of_the_convolution_
# kernels.)


def _packed_into(a: np.ndarray, b: np.ndarray, y: np.ndarray, owner=None) -> bool:
    """y = a @ b on the packed GEMM for a constant weight b (or all of the constant `owner`);
    False (nothing done) where it does not take them."""
    if not (y.flags.c_contiguous and packed_gemm.takes(a, b, owner)):
        return False
    packed_gemm.matmul_into(a, b, y, None, owner)
    return True


def _packed_taps(pk: bool, a: np.ndarray, lda: int, offs: np.ndarray, rows: int,
                 owner: np.ndarray, y: np.ndarray, accumulate: bool = False) -> bool:
    """y (+)= the taps' shifted row ranges of `a` times owner[0] (the taps' weights stacked,
    [taps lda, M]) on the packed GEMM when `pk`; False (nothing done) where not, or where the
    buffers are not contiguous."""
    if not (pk and a.flags.c_contiguous and y.flags.c_contiguous):
        return False
    m = owner.shape[-1]
    packed_gemm.taps_into(a.reshape(-1), lda, offs, rows, owner[0].reshape(-1, m),
                          y.reshape(rows, m), owner, accumulate)
    return True


def _few_pixels_nhwc(view, W, B, bias, y, z, activation, params) -> None:
    """Group-1 patch-matrix convolution over few output pixels (the 7x7 maps of ResNet-50 and
    Inception): Y.T = W' @ cols.T with W' (M, K [+1]) as one row per output channel, then one
    transposing copy into y. With the weights streaming from memory (every layer's weights
    are read once per run), OpenBLAS runs this orientation faster than cols @ W'.T for large
    weights over few pixels, as the pointwise path does."""
    n, oh, ow, m = y.shape
    kh, kw, cg = view.shape[4:]
    k = kh * kw * cg
    rows = n * oh * ow
    wt = _weights_t(W, B, bias)
    kb = wt.shape[1]
    cols = scratch("conv.cols", (rows, kb))
    np.copyto(cols[:, :k].reshape(n, oh, ow, 1, kh, kw, cg), view)
    if kb > k:
        cols[:, k] = 1
    y2 = y.reshape(rows, m)
    # (the packed GEMM streams the weight once in the usual orientation, straight into y)
    if not _packed_into(cols, wt.T, y2, wt if is_constant(wt) else W):
        yt = scratch("conv.yt", (m, rows))
        if not split_gemm(wt, cols.T, yt):
            np.matmul(wt, cols.T, out=yt)
        np.copyto(y2, yt.T)
    _epilogue(y2, bias if kb == k else None, None if z is None else z.reshape(y2.shape),
              activation, params, _hot(m, rows, kb))


def _weights_t(W, B, bias) -> np.ndarray:
    """W as (M, K) with columns ordered (kh, kw, c) as the NHWC patches are, plus the bias as
    column K when there is one (no bias for 1x1 kernels: W as stored is already (M, K), a free
    view). Cached with read-only W and B, else built per call in a scratch buffer."""
    m, cg, kh, kw = W.shape
    k = kh * kw * cg
    if (kh, kw) == (1, 1) and W.dtype == F32 and W.flags.c_contiguous:
        return W.reshape(m, k)
    kb = k + (bias is not None)

    def build(w, wt):
        np.copyto(wt[:, :k].reshape(m, kh, kw, cg), np.asarray(w).transpose(0, 2, 3, 1))
        if kb > k:
            wt[:, k] = bias
        return wt

    if is_constant(W) and (bias is None or (bias is B and is_constant(B))):
        return packed(W, ("nhwc.t", kb), lambda w: build(w, np.empty((m, kb), F32)),
                      deps=() if bias is None else (B,))
    return build(W, scratch("conv.wt", (m, kb)))


def _branch_gemms(cols, wb, W, bias, plan, cg, y2) -> None:
    """y2 = cols @ wb, skipping W's structural zeros: a whole-kernel branch is one GEMM over
    every patch column (the bias as the ones column), a 1x1 branch one GEMM over its tap's C
    columns only, accumulating onto its bias: faster than the separate convolutions and their
    Concat (SqueezeNet's fire modules)."""
    gemm = sgemm()
    rows, kb = cols.shape
    m = y2.shape[1]
    e = 4
    cp, yp = cols.ctypes.data, y2.ctypes.data
    for m0, mb, tap in plan:
        if tap < 0:
            gemm(rows, mb, kb, cp, kb, ptr(wb) + m0 * e, m, 0.0, yp + m0 * e, m)
            continue
        w1 = _branch1x1_weights(W, m0, mb, tap, cg)
        np.copyto(y2[:, m0:m0 + mb], bias[m0:m0 + mb])
        gemm(rows, mb, cg, cp + tap * cg * e, kb, ptr(w1), mb, 1.0, yp + m0 * e, m)
