"""Fast 2-D float32 convolution for the CPU: NHWC and NCHW, GEMM-based, into planned buffers.

NHWC: a 1x1 convolution is one GEMM (N*H*W x C) @ (C x M). A k x k one on a large map with
enough input channels is "shifted GEMM": the input is padded (and split by stride phase) once,
and each tap is one accumulating BLAS GEMM over a shifted row range of that flat image, so no
patch matrix is built (see _phase_planes). Small maps copy patches of a band of output rows
(im2col, one strided copy per band) and run one GEMM per band and group; few-channel stems build
the patch matrix transposed, small kernels copying each tap straight from the input. Where a
patch matrix is built (group 1), the bias rides in its GEMM as a column (row) of ones.
Depthwise convolutions are one einsum over a strided window view. Bias, residual and activation
are otherwise applied on each band right after its GEMM; Relu against a zero array (util.relu).
NCHW: the patch matrix transposed (M x K) @ (K x P), weights used as they are.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import numpy as np

from opwarden.errors import KernelError
from opwarden.kernels.cpu.shuffle import channel_shuffle, shuffle_into
from opwarden.kernels.cpu.util import (
    F32,
    activation_workspace,
    add_into,
    add_rows,
    apply_activation,
    blas_adds,
    matmul_acc,
    output,
    packed,
    ptr,
    scratch,
    sgemm,
    tap_range,
)
from opwarden.memory.constants import is_constant
from opwarden.ops.conv import conv_out_shape, conv_pads, spatial_params

# Patch-matrix band size (bytes): big enough for BLAS to reach its peak, small enough to stay in
# the last-level cache together with the weights.
BAND_BYTES = 3 << 20
# Shifted-GEMM path: used when each group has at least this many input channels (a tap's GEMM
# has K = C/group, too thin below that: the stem convolutions take the patch-matrix path), with
# wide output bands of about this many bytes.
SHIFT_MIN_C = 16
# ... and at least this many output pixels: on small maps the wide rows waste a larger share
# (e.g. 9 computed columns for 7) and the per-tap GEMMs are too short for two BLAS threads;
# and at most this many output channels per input channel: each tap re-reads and re-writes the
# output (M floats a pixel) where the patch matrix writes C, so wide outputs favour the latter.
# (Measured on 3x3 convs of the zoo: 28x28+ maps with M <= 2C gain 10-70%; others lose.)
SHIFT_MIN_PIXELS = 700
# Patch rows of at most this many floats (kw * C, group 1) take the transposed stem path, with
# bands of about STEM_BAND_BYTES (taps copied straight from x) or STEM_PLANES_BAND_BYTES (taps
# from phase planes). (Measured per node in-model: the 7x7 stride-2 stems of ResNet-50,
# Inception-v2 and DenseNet-121 run 7-10% faster with 1 MiB bands than with 8 MiB; the 3x3
# stems, whose taps come straight from x, 7-11% slower on two of three models.)
STEM_MAX_RUN = 24
STEM_BAND_BYTES = 8 << 20
STEM_PLANES_BAND_BYTES = 1 << 20
# Stems with at most this many taps copy them straight from the input; larger kernels go
# through phase planes. (Measured on 224x224 RGB: 3x3 s1/s2 and 4x4 s4 copy 10-55% faster
# direct, 5x5 s2 15% and 7x7 s2 / 11x11 s4 30-50% slower.)
STEM_DIRECT_MAX_TAPS = 16
SHIFT_MAX_M_PER_C = 2
WIDE_BAND_BYTES = 4 << 20
# Outputs of at least this many floats get bias and residual written before the GEMM, which
# then accumulates (see _prefill).
PREFILL_MIN = 1 << 17
# GEMMs of at least this many multiply-adds (m*n*k) leave OpenBLAS's threads awake (see _hot):
# 4x its single-thread threshold, for a margin.
HOT_MNK = 1 << 20
# Pointwise convolutions over at most this many pixels compute the transposed product.
PW_T_MAX_PIXELS = 64
# ... and so do group-1 patch-matrix convolutions (k x k, or strided 1x1) over at most this many
# output pixels whose weights hold at least PATCH_T_MIN_WEIGHTS floats (see _few_pixels_nhwc;
# smaller weights stay in cache, and there the usual orientation measured 12-20% faster).
PATCH_T_MAX_PIXELS = 64
PATCH_T_MIN_WEIGHTS = 1 << 18
# Row-tap path (see _rowtap_nhwc) for k x k convolutions with row stride 1: on when True, for
# kernel rows of at least ROWTAP_MIN_RUN floats (kw * C) over at least ROWTAP_MIN_PIXELS output
# pixels, in bands of about ROWTAP_BAND_BYTES (row copies plus output).
ROWTAP = True
ROWTAP_MIN_RUN = 32
ROWTAP_MIN_PIXELS = 196
ROWTAP_BAND_BYTES = 3 << 20
# Winograd F(4x4, 3x3) for 3x3 stride-1 convolutions with constant weights (see
# _winograd_nhwc and wino_tile): on when True. It pays where the GEMMs are large against the
# weights, whose transformed copy is 4x larger and streams from memory on every call: at least
# WINO_MIN_TILES 4x4 output tiles with C*M >= WINO_MIN_CM, or WINO_WIDE_TILES with
# C*M >= WINO_WIDE_MIN_CM. (Measured in-model: VGG-19's 3x3 layers from 112x112x64->128 to
# 28x28x512 run 0.54-0.84x the direct time, 224x224x64 0.94x; ResNet-50's and Inception's,
# e.g. 28x28x128 or 56x56x64->192, 1.03-1.9x, and 14x14 or smaller maps 1.1-2.3x, so they
# stay direct.)
# OPWARDEN_WINOGRAD=0 in the environment turns it off (results then match the direct sums to
# float32 rounding instead of ~1e-5 relative, and the transformed weights are not held).
WINOGRAD = os.environ.get("OPWARDEN_WINOGRAD", "1").strip().lower() not in (
    "0", "false", "no", "off")
WINO_MIN_TILES = 49
WINO_MIN_CM = 1 << 15
WINO_WIDE_TILES = 784
WINO_WIDE_MIN_CM = 1 << 12  # (VGG-19's 224x224x64->64: 0.94x in-model, twice)
# Depthwise convolutions with unit W stride and at most DW_MERGE_MAX_C channels merge (OW, C)
# into one axis against weights tiled OW times (see _depthwise_nhwc), while those take at most
# DW_TILED_MAX_BYTES. (ShuffleNet in-model: C = 136 gains; C = 272 and 544, whose inner loops
# are long already, measured no gain, and their tiled weights cost cache.)
DW_TILED_MAX_BYTES = 1 << 20
DW_MERGE_MAX_C = 192
# Bands of about this many bytes per transformed buffer.
WINO_BAND_BYTES = 4 << 20
# The weight transform's float64 temporaries stay under about this many bytes.
WINO_PACK_BLOCK = 8 << 20


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


def _pad_nhwc(x: np.ndarray, begin, end, shuffle: int = 0) -> np.ndarray:
    """x (N, H, W, C) zero-padded on H and W into a scratch buffer (negative pads crop);
    always C-contiguous. With `shuffle` >= 2 its channels are also shuffled in that copy."""
    if not any(begin) and not any(end):
        if shuffle > 1:
            return channel_shuffle(x, group=shuffle, out=scratch("conv.pad", x.shape))
        return np.ascontiguousarray(x)
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
    if shuffle > 1:
        shuffle_into(x, shuffle, xp[:, bt:bt + h, bl:bl + w])
    else:
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


def _prefill(y: np.ndarray, bias, z, group: int = 1, always: bool = False,
             hot: bool = False) -> bool:
    """y = bias + z (either may be None) before GEMMs accumulate onto it; False (y untouched)
    when both are None, or when the epilogue adds them better after the GEMM. A residual
    sharing y's memory is always folded in first (the GEMM would overwrite it). Otherwise,
    after a `hot` GEMM (see _hot) with OpenBLAS's threaded adds at hand (util.add_rows,
    add_into), adding after the GEMM measured 1.4-2x faster than this prefill's
    single-threaded NumPy pass (3136x256: 206 vs 405 us), so y is left alone. Else one write
    pass here replaces the GEMM's own write plus a separate read-modify-write pass per term
    afterwards (about 10% of a 1x1 convolution with a large output); small or grouped outputs
    measured slower (per-call overhead). `always`: prefill whatever the size (callers whose
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
        # in C (measured 15-25% faster than a Python loop on ShuffleNet's grouped 1x1s).
        # Splitting a unit-stride last axis is always a view (a copied `out` would lose the
        # result), and costs ~1 us where as_strided took ~10 (5% of ShuffleNet's run).
        rows = a.shape[0]
        yv = y2.reshape(rows, group, mg).transpose(1, 0, 2)
        np.matmul(a.reshape(rows, group, k).transpose(1, 0, 2), pw, out=yv)
        return
    for g in range(group):
        if acc:
            matmul_acc(a[:, g * k:(g + 1) * k], pw[g], y2[:, g * mg:(g + 1) * mg], True)
        else:
            np.matmul(a[:, g * k:(g + 1) * k], pw[g], out=y2[:, g * mg:(g + 1) * mg])


def _own(z: np.ndarray | None, y: np.ndarray) -> np.ndarray | None:
    """The residual z, or a scratch copy of it when it shares y's memory (FusedConv may write
    Y in place over Z, see ops.fused): for the paths that write y before they read z. The
    pointwise and row-tap paths fold z in first (_prefill) and Winograd adds it element by
    element as it writes, so those run in place without the copy."""
    if z is None or not np.may_share_memory(z, y):
        return z
    own = scratch("conv.z", z.shape)
    np.copyto(own, z)
    return own


def _hot(m: int, n: int, k: int) -> bool:
    """Whether an (m x k) @ (k x n) GEMM just run leaves OpenBLAS's threads awake: OpenBLAS
    runs GEMMs of m*n*k <= 262144 on one thread (its SMP threshold), and its threads spin for
    OPENBLAS_THREAD_TIMEOUT after their last work before sleeping. Waking a sleeping one was
    measured at ~450 us on this kind of VM, so threaded adds only follow a hot GEMM."""
    return m * n * k >= HOT_MNK


def _epilogue(y: np.ndarray, bias, z, activation: str, params, hot: bool = False) -> None:
    """y += bias (broadcast on the last axis or given pre-shaped), y += z, y = act(y); in place.
    `hot` (see _hot): the adds run on OpenBLAS's threads where they can (util.add_rows,
    add_into); measured 3-4x (bias) and 1.6x (residual) faster on large outputs."""
    if bias is not None:
        add_rows(y, bias, hot)
    if z is not None:
        add_into(y, z, hot)
    if activation:
        apply_activation(y, activation, params)


# ---------------------------------------------------------------------------------------------
# NHWC


def _pack_nhwc(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, Cg, kh, kw) -> (group, kh*kw*Cg, M/group), rows ordered (kh, kw, c)."""
    m, cg, kh, kw = w.shape
    mg = m // group
    if kh == kw == 1 and group == 1 and w.dtype == F32 and w.flags.c_contiguous:
        # 1x1: the transposed weight is a free view (BLAS takes transposed operands), so the
        # weights are not held twice. Grouped 1x1 weights are small and their many small GEMMs
        # run twice as fast on a contiguous copy (ShuffleNet), so those are packed.
        return w.reshape(group, mg, cg).transpose(0, 2, 1)
    p = np.asarray(w, F32).reshape(group, mg, cg, kh, kw).transpose(0, 3, 4, 2, 1)
    return np.ascontiguousarray(p.reshape(group, kh * kw * cg, mg))


def _pack_depthwise(w: np.ndarray) -> np.ndarray:
    """W (C, 1, kh, kw) -> (kh, kw, C): one channel vector per tap."""
    return np.ascontiguousarray(np.asarray(w, F32)[:, 0].transpose(1, 2, 0))


# Checked geometry per (layout, shapes, attributes): the same convolution is called with the same
# shapes on every run, and the checks and pad arithmetic cost ~8 us a call in Python (1.5-3% of
# SqueezeNet and ShuffleNet). Entries are small; the table is cleared if it ever grows large.
_GEOMETRY: dict[tuple, tuple] = {}


def _tup(v) -> tuple | None:
    return None if v is None else tuple(v)


def _prologue(x, W, B, Z, group, kernel_shape, strides, dilations, pads, auto_pad, out, nhwc):
    """What both layouts check and derive first: (strides, dilations, pads begin/end, output
    buffer, residual, bias). The lists returned are shared between calls: read them only."""
    key = (nhwc, x.shape, W.shape, None if B is None else np.shape(B), group,
           _tup(kernel_shape), _tup(strides), _tup(dilations), _tup(pads), auto_pad)
    geom = _GEOMETRY.get(key)
    if geom is None:
        tag = " (NHWC)" if nhwc else ""
        cin = x.shape[3 if nhwc else 1] if x.ndim == 4 else -1
        _check(x, W, B, group, cin, kernel_shape, "Conv" + tag)
        hw = x.shape[1:3] if nhwc else x.shape[2:4]
        geom = geometry(hw, W.shape[2:4], strides, dilations, pads, auto_pad)
        if len(_GEOMETRY) > 4096:
            _GEOMETRY.clear()
        _GEOMETRY[key] = geom
    s, d, begin, end, (oh, ow) = geom
    n = x.shape[0]
    m = W.shape[0]
    y = output(out, (n, oh, ow, m) if nhwc else (n, m, oh, ow))
    z = None if Z is None else _f32(Z)
    if z is not None and z.shape != y.shape:
        tag = " (NHWC)" if nhwc else ""
        raise KernelError(f"FusedConv{tag}: residual Z {z.shape} must match the output {y.shape}")
    bias = None if B is None else _f32(B)
    return s, d, begin, end, y, z, bias


def conv_nhwc(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), input_shuffle=0, out=None,
    branches=None,
):
    """Y = act(Conv(shuffle(X), W, B) + Z) with X, Z, Y in NHWC; W stays (M, C/group, kh, kw).
    `input_shuffle` g >= 2 shuffles X's channels with group g first (see ops.fused).
    `branches` (FusedConv's, see ops.fused.branch_convs): only for finite X, W and B, whose
    products with W's structural zeros are exact zeros (kernels.fused checks); the patch-matrix
    path then skips those products (see _branch_plan), the others multiply them."""
    group = int(group)
    shuffle = int(input_shuffle or 0)
    # Not made contiguous here: an NHWC view of an NCHW tensor (the layout pass's transpose of
    # a graph input) is gathered once by the padding / patch copies below, not twice.
    x = np.asarray(X, dtype=F32)
    if shuffle > 1 and not (W.shape[1] == 1 and W.shape[0] == group):
        # Depthwise convolutions shuffle inside their padding copy; others copy it here.
        x = channel_shuffle(x, group=shuffle, out=scratch("conv.shuffle", x.shape))
        shuffle = 0
    s, d, begin, end, y, z, bias = _prologue(
        x, W, B, Z, group, kernel_shape, strides, dilations, pads, auto_pad, out, nhwc=True
    )
    n, h, wd, c = x.shape
    m, cg, kh, kw = W.shape
    oh, ow = y.shape[1:3]
    if n == 0 or oh * ow * m == 0:
        return y
    bplan = _branch_plan(W.shape, branches) if branches and group == 1 else None
    routes = _routes_nhwc(x.shape, W.shape, group, s, d, begin, end, oh, ow, bplan is not None)
    route = routes[0]
    if route == "depthwise":
        z = _own(z, y)
        _depthwise_nhwc(x, W, s, d, begin, end, y, bias, shuffle)
        _epilogue(y, None, z, activation, activation_params)
        return y
    k = kh * kw * cg
    if route == "pointwise":
        # Pointwise: the input already is the patch matrix, one GEMM per group.
        a = x.reshape(n * h * wd, c)
        y2 = y.reshape(n * oh * ow, m)
        zz = None if z is None else z.reshape(y2.shape)
        if group == 1 and y2.shape[0] <= PW_T_MAX_PIXELS and W.dtype == F32 \
                and W.flags.c_contiguous:
            # Few pixels: Y.T = W @ X.T (W as stored) runs 7-16% faster in OpenBLAS than
            # X @ W.T; the transposing copy back is small and takes the bias along.
            zz = _own(zz, y2)
            yt = scratch("conv.yt", (m, y2.shape[0]))
            np.matmul(W.reshape(m, c), a.T, out=yt)
            if bias is not None:
                np.add(yt.T, bias, out=y2)
            else:
                np.copyto(y2, yt.T)
            _epilogue(y2, None, zz, activation, activation_params, _hot(m, y2.shape[0], c))
            return y
        if group > 1 and zz is not None and np.may_share_memory(zz, y2):
            # Grouped, in place over the residual: the batched matmul (which cannot
            # accumulate) writes a scratch that the residual add then reads; the same traffic
            # as out of place (copying z aside first measured 3.7% slower on ShuffleNet).
            t = scratch("conv.grouped", y2.shape)
            _gemms(a, _packed_nhwc(W, group), t, group, False)
            np.add(t, zz, out=y2)
            _epilogue(y2, bias, None, activation, activation_params)
            return y
        # (Grouped GEMMs run per group: small, their threads are not known to be awake.)
        hot = group == 1 and _hot(y2.shape[0], m, c)
        acc = _prefill(y2, bias, zz, group, hot=hot)
        _gemms(a, _packed_nhwc(W, group), y2, group, acc)
        if acc:
            _epilogue(y2, None, None, activation, activation_params)
        else:
            _epilogue(y2, bias, zz, activation, activation_params, hot)
        return y
    if route == "winograd":
        tile = wino_tile(c, m, oh, ow)
        u = _winograd_weights(W, tile)
        if u is not None and _finite(x) and (bias is None or _finite(bias)):
            _winograd_nhwc(x, u, tile, begin, y, bias, z, activation, activation_params)
            return y
        route = routes[1]  # weights computed at run time, or a NaN / Inf about
    if route == "shifted":
        _shifted_nhwc(x, _packed_nhwc_c(W, group), s, d, begin, (kh, kw), group, y, bias,
                      _own(z, y), activation, activation_params)
        return y
    if route == "rowtap":
        _rowtap_nhwc(x, W, s, d, begin, end, (kh, kw), y, bias, z, activation,
                     activation_params, bplan)
        return y
    if route == "stem":
        _stem_nhwc(x, W, B, s, d, begin, end, (kh, kw), y, bias, _own(z, y),
                   activation, activation_params)
        return y
    z = _own(z, y)
    xp = _pad_nhwc(x, begin, end)
    # Patches as one strided view (rows, cols, group, kh, kw, cg) of the padded image, so each
    # band is filled by a single copy whose inner run is a whole (kw, cg) row of the window
    # when the group is 1 and dilation is 1.
    hp, wp = xp.shape[1:3]
    e = xp.itemsize
    # (np.ndarray over xp's buffer: 5 us less per call than as_strided; xp is contiguous.)
    view = np.ndarray(
        (n, oh, ow, group, kh, kw, cg), F32, xp, 0,
        (hp * wp * c * e, s[0] * wp * c * e, s[1] * c * e, cg * e, d[0] * wp * c * e,
         d[1] * c * e, e))
    view.flags.writeable = False
    if route == "few_pixels":
        _few_pixels_nhwc(view, W, B, bias, y, z, activation, activation_params)
        return y
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
                else:
                    np.matmul(cols, wb, out=y2)
                _epilogue(y2, None, zz, activation, activation_params, _hot(rr * ow, m, kb))
                continue
            cols = scratch("conv.cols", (rr, ow, group, kh, kw, cg))
            np.copyto(cols, view[i, r0:r1])
            c2 = cols.reshape(rr * ow, group * k)
            # (Prefilling the bias here measured 3% slower: the bands are cache-sized.)
            _gemms(c2, pw, y2, group, False)
            _epilogue(y2, bias, zz, activation, activation_params,
                      group == 1 and _hot(rr * ow, m, k))
    return y


def _routes_nhwc(x_shape, w_shape, group, s, d, begin, end, oh, ow, branched) -> tuple:
    """The path conv_nhwc takes for these shapes: (route,) or, where the first may decline at
    run time, (route, fallback). Winograd declines for weights computed at run time and for
    inputs that are not all finite. Shared by conv_nhwc and nhwc_workspace, so the workspace
    declared is the one of the path that runs."""
    n, h, w, c = x_shape
    m, cg, kh, kw = w_shape
    if n == 0 or oh * ow * m == 0:
        return ("empty",)
    if cg == 1 and m == group:
        return ("depthwise",)
    if (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end):
        return ("pointwise",)
    first: tuple = ()
    if (not branched and WINOGRAD and (kh, kw) == (3, 3) and s == [1, 1] and d == [1, 1]
            and group == 1 and min(*begin, *end) >= 0 and wino_tile(c, m, oh, ow)):
        first = ("winograd",)
    if (not branched and cg >= SHIFT_MIN_C and oh * ow >= SHIFT_MIN_PIXELS
            and m // group <= SHIFT_MAX_M_PER_C * cg and sgemm() is not None):
        return (*first, "shifted")
    if (ROWTAP and group == 1 and s[0] == 1 and kh > 1 and kw * cg >= ROWTAP_MIN_RUN
            and oh * ow >= ROWTAP_MIN_PIXELS and sgemm() is not None):
        return (*first, "rowtap")
    if group == 1 and kw * cg <= STEM_MAX_RUN:
        return (*first, "stem")
    if (group == 1 and not branched and n * oh * ow <= PATCH_T_MAX_PIXELS
            and kh * kw * cg * m >= PATCH_T_MIN_WEIGHTS):
        return (*first, "few_pixels")
    return (*first, "patch")


def _static_geometry(x, w, hw, strides, dilations, pads, auto_pad):
    """geometry() for a workspace rule: None unless X and W are known 4-D shapes with a valid
    convolution between them."""
    if len(x) != 4 or len(w) != 4 or not all(isinstance(v, int) for v in (*x, *w)):
        return None
    try:
        return geometry(hw, w[2:4], strides, dilations, pads, auto_pad or "NOTSET")
    except KernelError:
        return None


def _band_rows(total: int, budget: int, row_bytes: int) -> int:
    """Rows per band as the kernels size them: about `budget` bytes, at least one row."""
    return max(1, min(total, budget // max(1, row_bytes)))


def _plane_geometry(s, d, khw, oh, ow) -> tuple[list[int], list[int], int, int]:
    """_phase_planes' layout: (row phases, column phases, plane rows hq, plane columns wq).
    wq >= ow + the last tap's column offset keeps every valid output's reads inside its plane
    row; one spare row takes the overrun of the last wide row (its columns past ow are
    discarded)."""
    kh, kw = khw
    pas = sorted({(a * d[0]) % s[0] for a in range(kh)})
    pbs = sorted({(b * d[1]) % s[1] for b in range(kw)})
    return pas, pbs, oh + ((kh - 1) * d[0]) // s[0] + 1, ow + ((kw - 1) * d[1]) // s[1]


def _phase_planes_floats(x_shape, s, d, khw, oh, ow) -> int:
    """Floats of _phase_planes' buffer for one image."""
    pas, pbs, hq, wq = _plane_geometry(s, d, khw, oh, ow)
    return len(pas) * len(pbs) * hq * wq * x_shape[3]


def nhwc_workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, input_shuffle=0, branches=None,
                   activation="", activation_params=None, **_) -> int:
    """Workspace bytes of conv_nhwc (X and Z in NHWC): the scratch buffers of the path it takes
    for these shapes (the larger of the two where Winograd may decline), per-call packed
    weights (weights that are not initializers are packed on every call; an initializer's
    packing is cached with it, weight memory) and the residual's copy where the path writes Y
    before it reads Z (in place over Z). The `opwarden check` workspace check measures each
    path against this. Unknown shapes: 0."""
    geom = _static_geometry(x, w, x[1:3], strides, dilations, pads, auto_pad)
    if geom is None:
        return 0
    s, d, begin, end, (oh, ow) = geom
    group = int(group or 1)
    n, h, wd, c = x
    m, cg, kh, kw = w
    if group < 1 or m % group or cg * group != c:
        return 0
    bplan = _branch_plan(tuple(w), branches) if branches and group == 1 else None
    routes = _routes_nhwc(tuple(x), tuple(w), group, s, d, begin, end, oh, ow,
                          bplan is not None)
    y_floats = n * oh * ow * m
    k = kh * kw * cg
    kb = k + bool(b)  # (an omitted optional input comes as None or as the empty shape ())
    zcopy = y_floats if z else 0
    shuffled = (n * h * wd * c if int(input_shuffle or 0) > 1 and routes[0] != "depthwise"
                else 0)
    padded = n * (h + max(begin[0], 0) + max(end[0], 0)) * (wd + max(begin[1], 0)
                                                            + max(end[1], 0)) * c

    def floats(route: str) -> int:
        if route == "empty":
            return 0
        if route == "depthwise":
            if _dw_merged(s, d, kh, kw, ow, c):  # tiled weights and bias
                return zcopy + padded + (kh * kw + 1) * ow * c + kh * kw * c
            return zcopy + padded + kh * kw * c
        if route == "pointwise":
            pixels = n * oh * ow
            if group == 1 and pixels <= PW_T_MAX_PIXELS:
                return zcopy + m * pixels
            return (y_floats if group > 1 and z else 0) + (m * cg if group > 1
                                                                     else 0)
        if route == "winograd":
            t = wino_tile(c, m, oh, ow)
            a2 = (t + 2) ** 2
            th, tw = -(-oh // t), -(-ow // t)
            rows = _band_rows(th, WINO_BAND_BYTES, a2 * tw * max(m, c) * 4)
            tiles = rows * tw
            return (th * t + 2) * (tw * t + 2) * c + tiles * (2 * a2 * c + a2 * m + t * t * m)
        if route == "shifted":
            planes = _phase_planes_floats(x, s, d, (kh, kw), oh, ow)
            wq = _plane_geometry(s, d, (kh, kw), oh, ow)[3]
            rows = _band_rows(oh, WIDE_BAND_BYTES, wq * m * 4)
            return zcopy + planes + (rows * wq * m if wq != ow else 0) + k * m
        if route == "rowtap":
            rows = _band_rows(oh, ROWTAP_BAND_BYTES, ow * (kw * c + m) * 4)
            band = (rows + (kh - 1) * d[0]) * ow * kw * c
            return padded + band + k * m + (c * m if bplan else 0)
        if route == "stem":
            direct = kh * kw <= STEM_DIRECT_MAX_TAPS
            budget = STEM_BAND_BYTES if direct else STEM_PLANES_BAND_BYTES
            rows = _band_rows(oh, budget, ow * kb * 4)
            planes = 0 if direct else _phase_planes_floats(x, s, d, (kh, kw), oh, ow)
            return zcopy + k * m + (kb * m if b else 0) + planes + kb * rows * ow
        pad = padded if any(begin) or any(end) else n * h * wd * c
        if route == "few_pixels":
            pixels = n * oh * ow
            return zcopy + pad + pixels * kb + m * pixels + m * kb
        rows = _band_rows(oh, BAND_BYTES, ow * kb * group * 4)
        return zcopy + pad + rows * ow * (kb if group == 1 else group * k) + kb * m

    return (4 * (shuffled + max(floats(r) for r in routes))
            + activation_workspace(activation, activation_params, y_floats))


def _rowtap_nhwc(x, W, s, d, begin, end, khw, y, bias, z, activation, params, bplan) -> None:
    """k x k convolution with row stride 1 as one accumulating GEMM per kernel row: each band
    of the padded input is copied once as R[r, j] = (x[r, j*s1 + b*d1, :] for b < kw), a
    (rows, OW, kw*C) matrix whose row r + a*d0 is kernel row a's patch of output row r; kernel
    row a is then a plain GEMM of K = kw*C over a row range of R. The copy is kw times the
    input where the patch matrix is kh*kw times the output, and K is kw times the shifted
    path's. Bias and residual are written first, the GEMMs accumulate.

    With FusedConv `branches` (finite inputs; see _branch_plan) a whole-kernel branch runs
    over its output columns only and a 1x1 branch as one GEMM of K = C over its tap's columns
    of the centre row, so W's structural zeros are never multiplied."""
    gemm = sgemm()
    n, oh, ow, m = y.shape
    c = x.shape[3]
    kh, kw = khw
    kc = kw * c
    e = 4
    pw = _packed_nhwc_c(W, 1)[0]  # (kh*kw*C, M) rows ordered (kh, kw, c): block a = kernel row a
    xp = _pad_nhwc(x, begin, end)
    sn, sh, sw, sc = xp.strides
    rows = _band_rows(oh, ROWTAP_BAND_BYTES, ow * (kc + m) * e)
    spec = bplan or [(0, m, -1)]
    wholes = [(m0, mb) for m0, mb, tap in spec if tap < 0]
    ones = [(m0, mb, tap) for m0, mb, tap in spec if tap >= 0]
    w1s = [ptr(_branch1x1_weights(W, m0, mb, tap, c)) for m0, mb, tap in ones]
    pwp = ptr(pw)
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            nr = rr + (kh - 1) * d[0]
            rt = scratch("conv.rowtap", (nr, ow, kw, c))
            np.copyto(rt, np.ndarray((nr, ow, kw, c), F32, xp, i * sn + r0 * sh,
                                     (sh, s[1] * sw, d[1] * sw, sc)))
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            hot = _hot(rr * ow, m, kc)
            acc = _prefill(y2, bias, None if z is None else z[i, r0:r1].reshape(y2.shape),
                           1, always=True, hot=hot)
            base, yb = rt.ctypes.data, y2.ctypes.data
            for m0, mb in wholes:
                for a in range(kh):
                    gemm(rr * ow, mb, kc, base + a * d[0] * ow * kc * e, kc,
                         pwp + (a * kc * m + m0) * e, m,
                         1.0 if acc or a else 0.0, yb + m0 * e, m)
            for (m0, mb, tap), w1 in zip(ones, w1s):
                a, b = divmod(tap, kw)
                gemm(rr * ow, mb, c, base + (a * d[0] * ow * kc + b * c) * e, kc,
                     w1, mb, 1.0 if acc else 0.0, yb + m0 * e, m)
            _epilogue(y2, None if acc else bias, None if acc or z is None
                      else z[i, r0:r1].reshape(y2.shape), activation, params, hot)


def _branch_plan(wshape, branches) -> list[tuple[int, int, int]] | None:
    """FusedConv branches as (first output channel, channels, tap) for the patch-matrix path:
    tap -1 for a branch with W's whole kernel, else the index of the single (centre) tap of a
    1x1 branch; None when a branch is neither (it then multiplies its structural zeros)."""
    _m, _c, kh, kw = wshape
    spec = [int(v) for v in branches]
    plan, m0 = [], 0
    for j in range(0, len(spec) - 2, 3):
        mb, bh, bw = spec[j:j + 3]
        if (bh, bw) == (kh, kw):
            plan.append((m0, mb, -1))
        elif (bh, bw) == (1, 1) and kh % 2 and kw % 2:
            plan.append((m0, mb, (kh // 2) * kw + kw // 2))
        else:
            return None
        m0 += mb
    return plan


def _branch_gemms(cols, wb, W, bias, plan, cg, y2) -> None:
    """y2 = cols @ wb, skipping W's structural zeros: a whole-kernel branch is one GEMM over
    every patch column (the bias as the ones column), a 1x1 branch one GEMM over its tap's C
    columns only, accumulating onto its bias. Measured on SqueezeNet's fire modules (1x1 and
    3x3 expand, 55x55 to 13x13): 0.65-0.79x the time of the two convolutions and the Concat."""
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


def _packed_nhwc(W, group: int) -> np.ndarray:
    """W packed for NHWC (see _pack_nhwc), cached with W."""
    return packed(W, ("nhwc", group), lambda w: _pack_nhwc(w, group))


def _packed_nhwc_c(W, group: int) -> np.ndarray:
    """_packed_nhwc, C-contiguous: the paths that hand BLAS raw pointers (1x1 packs are
    transposed views)."""
    pw = _packed_nhwc(W, group)
    if pw.flags.c_contiguous:
        return pw
    return packed(W, ("nhwc.c", group), lambda w: np.ascontiguousarray(_pack_nhwc(w, group)))


def _branch1x1_weights(W, m0: int, mb: int, tap: int, cg: int) -> np.ndarray:
    """A 1x1 FusedConv branch's weights (C, mb): output channels m0.. of W at its one tap,
    cached with W."""
    return packed(W, ("branch1x1", m0, mb, tap), lambda w: np.ascontiguousarray(
        np.asarray(w, F32)[m0:m0 + mb].reshape(mb, cg, -1)[:, :, tap].T))


def _few_pixels_nhwc(view, W, B, bias, y, z, activation, params) -> None:
    """Group-1 patch-matrix convolution over few output pixels (the 7x7 maps of ResNet-50 and
    Inception): Y.T = W' @ cols.T with W' (M, K [+1]) as one row per output channel, then one
    transposing copy into y. With the weights streaming from memory (every layer's weights
    are read once per run), OpenBLAS runs this orientation 0.81-0.94x the time of
    cols @ W'.T at 49 pixels with K * M >= 2^18 (K 832-4608, M 384-2048, weights rotated
    through 10-12 copies; about even at 64 pixels or K = M / 4), as the pointwise path does.
    Measured through conv_nhwc: ResNet-50's 7x7 3x3 layers 0.85-0.87x, its strided 1x1
    0.94x."""
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
    yt = scratch("conv.yt", (m, rows))
    np.matmul(wt, cols.T, out=yt)
    y2 = y.reshape(rows, m)
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


def _bias_row(W, B, bias, order=None) -> np.ndarray | None:
    """W packed for NHWC, group 1 (K [+1], M): rows ordered (kh, kw, c), or tap by tap in
    `order` (the stem's, see _stem_groups), with the bias appended as row K when there is one.
    Cached in place of the plain packing while W (and B) are constants (initializers);
    otherwise built per call in a scratch buffer. None for 1x1 kernels in (kh, kw) order:
    their plain packing is a free view of W, and a packed copy would hold the weights twice
    (ResNet-50's strided 1x1 convolutions: +22 MiB peak)."""
    if order is None and W.shape[2:] == (1, 1):
        return None
    m, cg, kh, kw = W.shape
    k = kh * kw * cg
    kb = k + (bias is not None)
    taps = range(kh * kw) if order is None else order

    def build(w, wb):
        # Written straight from W (no temporary packed copy, and not the plain packing too:
        # the weights are held once).
        np.take(np.asarray(w, F32).transpose(2, 3, 1, 0).reshape(kh * kw, cg, m), taps, axis=0,
                out=wb[:k].reshape(kh * kw, cg, m))
        if bias is not None:
            wb[k] = bias
        return wb

    if is_constant(W) and (bias is None or (bias is B and is_constant(B))):
        return packed(W, ("nhwc.bias", order), lambda w: build(w, np.empty((kb, m), F32)),
                      deps=() if bias is None else (B,))
    return build(W, scratch("conv.wb", (kb, m)))


def _stem_nhwc(x, W, B, s, d, begin, end, khw, y, bias, z, activation, params) -> None:
    """Convolutions with few input channels (the RGB stem): the patch matrix is built
    transposed, (kh*kw*C [+1], pixels), so each of its rows is copied in runs of OW contiguous
    floats rather than gathered one float every s*C; the bias rides in the GEMM as a row of
    ones. Small kernels copy each tap straight from x (see _stem_taps); larger ones, whose taps
    re-read each input float many times, from channel-major phase planes (see _phase_planes),
    all taps of one phase in one copy (see _stem_groups)."""
    n, oh, ow, m = y.shape
    c = x.shape[3]
    kh, kw = khw
    k = kh * kw * c
    kb = k + (bias is not None)
    direct = kh * kw <= STEM_DIRECT_MAX_TAPS
    groups = None if direct else _stem_groups(tuple(s), tuple(d), khw)
    wb = _bias_row(W, B, bias, tuple(range(kh * kw)) if direct else groups[1])
    band = STEM_BAND_BYTES if direct else STEM_PLANES_BAND_BYTES
    rows = _band_rows(oh, band, ow * kb * 4)
    for i in range(n):
        if not direct:
            planes = _phase_planes(x, i, s, d, begin, khw, oh, ow, "conv.planes", chw=True)[0]
            sp = planes.strides
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            cols = scratch("conv.cols", (kb, rr * ow))
            if direct:
                _stem_taps(x[i], s, d, begin, khw, r0, r1, ow,
                           cols[:k].reshape(kh * kw, c, rr, ow))
            else:
                k0 = 0
                for ph, qa, sa, na, qb, sb, nb in groups[0]:
                    # Taps (qa + u*sa, qb + v*sb) of this phase: one strided view of the
                    # planes, inner runs of ow contiguous floats.
                    rows_k = na * nb * c
                    np.copyto(cols[k0:k0 + rows_k].reshape(na, nb, c, rr, ow), np.ndarray(
                        (na, nb, c, rr, ow), F32, planes,
                        ph * sp[0] + (qa + r0) * sp[2] + qb * sp[3],
                        (sa * sp[2], sb * sp[3], sp[1], sp[2], sp[3])))
                    k0 += rows_k
            if bias is not None:
                cols[k] = 1
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            np.matmul(cols.T, wb, out=y2)
            _epilogue(y2, None, None if z is None else z[i, r0:r1].reshape(y2.shape),
                      activation, params, _hot(rr * ow, m, kb))


_STEM_GROUPS: dict[tuple, tuple] = {}


def _stem_groups(s, d, khw) -> tuple:
    """The taps of a phase-plane stem grouped by plane: ([(plane, qa0, qa step, rows of taps,
    qb0, qb step, columns of taps)], tap order). A plane's taps are the product of the kernel
    rows and columns of its phase, whose plane offsets step evenly (by d / gcd(s, d)), so each
    group is one strided copy where a copy per tap cost ~2 us of call overhead each (49 per
    band for a 7x7 stem: 0.60 -> 0.29 ms of copies for 224x224, measured hot; in-model, each
    run after an ONNX Runtime run, the 7x7 stride-2 stems of ResNet-50 4.11 -> 3.48 ms,
    Inception-v1 4.32 -> 3.43, DenseNet-121 3.89 -> 3.40, ZFNet 4.86 -> 4.41). The patch rows
    follow the tap order (each tap's C rows together) and so do the weights' rows."""
    key = (s, d, khw)
    hit = _STEM_GROUPS.get(key)
    if hit is not None:
        return hit
    kh, kw = khw
    pas, pbs = _plane_geometry(s, d, khw, 1, 1)[:2]
    groups, order = [], []
    for u, pa in enumerate(pas):
        ra = [a for a in range(kh) if (a * d[0]) % s[0] == pa]
        qa = [(a * d[0]) // s[0] for a in ra]
        for v, pb in enumerate(pbs):
            rb = [b for b in range(kw) if (b * d[1]) % s[1] == pb]
            qb = [(b * d[1]) // s[1] for b in rb]
            sa = qa[1] - qa[0] if len(qa) > 1 else 1
            sb = qb[1] - qb[0] if len(qb) > 1 else 1
            groups.append((u * len(pbs) + v, qa[0], sa, len(qa), qb[0], sb, len(qb)))
            order += [a * kw + b for a in ra for b in rb]
    hit = (tuple(groups), tuple(order))
    _STEM_GROUPS[key] = hit
    return hit


def _stem_taps(xi, s, d, begin, khw, r0, r1, ow, c4) -> None:
    """c4[t, :, r - r0, j] = xpad[r*s0 + a*d0, j*s1 + b*d1, :] for tap t = (a, b), output rows
    r0 <= r < r1, from image xi (H, W, C) without a padded copy: each tap is one strided copy
    of its in-bounds block and zero strips where it reads padding."""
    h, w, _c = xi.shape
    xc = xi.transpose(2, 0, 1)  # (C, H, W): for the NCHW graph input, rows of W floats
    kh, kw = khw
    rr = r1 - r0
    bt, bl = begin
    for a in range(kh):
        # Output rows whose source row r*s0 + a*d0 - bt lies inside x, clipped to the band.
        off = a * d[0] - bt
        lo, hi = tap_range(a * d[0], h, r1, s[0], bt)
        lo = max(r0, lo)
        hi = max(lo, hi)
        lo, hi = lo - r0, hi - r0
        for b in range(kw):
            offw = b * d[1] - bl
            j0, j1 = tap_range(b * d[1], w, ow, s[1], bl)
            ct = c4[a * kw + b]
            if lo:
                ct[:, :lo] = 0
            if hi < rr:
                ct[:, hi:] = 0
            if j0:
                ct[:, lo:hi, :j0] = 0
            if j1 < ow:
                ct[:, lo:hi, j1:] = 0
            if hi > lo and j1 > j0:
                sr, sc = (lo + r0) * s[0] + off, j0 * s[1] + offw
                np.copyto(ct[:, lo:hi, j0:j1],
                          xc[:, sr:sr + (hi - lo - 1) * s[0] + 1:s[0],
                             sc:sc + (j1 - j0 - 1) * s[1] + 1:s[1]])


def _phase_planes(x, i, s, d, begin, khw, oh, ow, tag, chw=False):
    """Image i of x (N, H, W, C) padded and split by stride phase into planes
    P[p, r, j, :] = xpad[pa + r*s0, pb + j*s1, :] (zero outside x) for the phases (pa, pb) the
    taps use. Returns (planes, wq, taps): taps lists each (a, b)'s element offset of its
    top-left input in the flattened planes. Output pixel (r, j) of tap (a, b) then reads flat
    row offset + r*wq + j, so every tap is a plain shifted row range of one 2-D matrix.
    With `chw` the planes are (phases, C, hq, wq), plane u * len(pbs) + v holding phase
    (pas[u], pbs[v]) (see _stem_groups), and taps is None."""
    n, h, w, c = x.shape
    kh, kw = khw
    pas, pbs, hq, wq = _plane_geometry(s, d, khw, oh, ow)
    if chw:  # filled through an (hq, wq, C) view, as the channel-last planes are
        planes = scratch(tag, (len(pas) * len(pbs), c, hq, wq)).transpose(0, 2, 3, 1)
    else:
        planes = scratch(tag, (len(pas) * len(pbs), hq, wq, c))
    bt, bl = begin
    index = {}
    for u, pa in enumerate(pas):
        # Rows r whose source row pa + r*s0 - bt lies inside x.
        r0 = min(hq, max(0, -((pa - bt) // s[0])))
        r1 = max(r0, min(hq, (h - 1 - pa + bt) // s[0] + 1))
        for v, pb in enumerate(pbs):
            j0 = min(wq, max(0, -((pb - bl) // s[1])))
            j1 = max(j0, min(wq, (w - 1 - pb + bl) // s[1] + 1))
            p = planes[u * len(pbs) + v]
            index[pa, pb] = u * len(pbs) + v
            p[:r0] = 0
            p[r1:] = 0
            p[r0:r1, :j0] = 0
            p[r0:r1, j1:] = 0
            if r1 > r0 and j1 > j0:
                xr, xc = pa + r0 * s[0] - bt, pb + j0 * s[1] - bl
                p[r0:r1, j0:j1] = x[i, xr:xr + (r1 - r0 - 1) * s[0] + 1:s[0],
                                    xc:xc + (j1 - j0 - 1) * s[1] + 1:s[1]]
    if chw:
        return planes.transpose(0, 3, 1, 2), wq, None
    taps = []
    for a in range(kh):
        pa, qa = (a * d[0]) % s[0], (a * d[0]) // s[0]
        for b in range(kw):
            pb, qb = (b * d[1]) % s[1], (b * d[1]) // s[1]
            taps.append(((index[pa, pb] * hq + qa) * wq + qb) * c)
    return planes, wq, taps


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
            for g in range(group):
                bptr = pwp + g * pw.strides[0]
                for t, off in enumerate(taps):
                    gemm(rr * wq, mg, cg, base + (off + r0 * wq * c + g * cg) * e, c,
                         bptr + t * cg * mg * e, mg, 0.0 if t == 0 else 1.0,
                         ywp + g * mg * e, m)
            hot = group == 1 and _hot(rr * wq, mg, cg)
            if not direct:
                if bias is not None:
                    np.add(yw[:, :ow], bias, out=yb)
                else:
                    np.copyto(yb, yw[:, :ow])
                _epilogue(yb, None, None if z is None else z[i, r0:r1], activation, params, hot)
            else:
                _epilogue(yb, bias, None if z is None else z[i, r0:r1], activation, params, hot)


# Winograd F(m x m, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
# 2016): an (m+2)^2 input tile d gives an m x m output tile A^T [(G g G^T) * (B^T d B)] A, with
# (m+2)^2 multiplications per tile and channel pair instead of 9 m^2. F(4x4, 3x3): points 0,
# +-1, +-2 and infinity, 4x fewer. (F(2x2, 3x3), 2.25x fewer with smaller constants, measured
# slower than the direct convolution in-model on every zoo shape, so it is not offered.)
_WINO_MATS = {
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def _wino_transforms(m: int):
    """(B^T (x) B^T, G, A^T (x) A^T, bias index) for F(m x m, 3x3). Both 2-D transforms as one
    matrix each (Kronecker products), so each is a single GEMM over all tiles and channels of a
    band: ((m+2)^2 x (m+2)^2) @ ((m+2)^2 x tiles*C) in, (m^2 x (m+2)^2) @ (... x tiles*M) out.
    (Measured as fast as two separable stages with their extra pass.) A^T's column 1 is all
    ones, so a bias added to transformed element (1, 1) reaches every output of the tile
    unchanged: one small add per band."""
    bt, g, at = (np.array(a, np.float64) for a in _WINO_MATS[m])
    return np.kron(bt, bt).astype(F32), g, np.kron(at, at).astype(F32), m + 2 + 1


_WINO = {m: _wino_transforms(m) for m in _WINO_MATS}


def wino_tile(c: int, m: int, oh: int, ow: int) -> int:
    """The Winograd output tile for a 3x3 stride-1 convolution of C -> M channels onto an
    OH x OW map: 4 for F(4x4, 3x3), 0 for the direct convolution."""
    tiles = -(-oh // 4) * -(-ow // 4)
    if c * m >= WINO_MIN_CM and tiles >= WINO_MIN_TILES:
        return 4
    if c * m >= WINO_WIDE_MIN_CM and tiles >= WINO_WIDE_TILES:
        return 4
    return 0


def _finite(a: np.ndarray) -> bool:
    """No NaN or Inf in a (one reduction; an overflowing sum of finite values says False,
    which only sends the caller down its exact path)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.add.reduce(a, axis=None)))


def _winograd_weights(W, tile: int) -> np.ndarray | None:
    """U[p*a + q] = (G W[k, c] G^T)[p, q] as (a*a, C, M) float32 (a = tile + 2), computed in
    float64 and cached with W; None when W may change between calls (packing is the costly
    part) or is not finite (a NaN or Inf weight would reach every output of a tile, not just
    its own)."""
    if not is_constant(W):
        return None

    g = _WINO[tile][1]

    def build(w):
        m, c = w.shape[:2]
        u = np.empty((g.shape[0] ** 2, c, m), F32)
        # In blocks of output channels: the float64 product of a whole 512x512 layer would be
        # a 75 MB temporary next to everything else resident at the first run.
        step = max(1, WINO_PACK_BLOCK // max(1, g.shape[0] ** 2 * c * 8))
        for k0 in range(0, m, step):
            k1 = min(m, k0 + step)
            part = np.einsum("pa,kcab,qb->pqck", g, np.asarray(w[k0:k1], np.float64), g)
            u[:, :, k0:k1] = part.reshape(-1, c, k1 - k0)
        return u if np.isfinite(u).all() else u[:0]

    u = packed(W, ("wino", tile), build)
    return u if u.size else None


def _winograd_nhwc(x, u, t, begin, y, bias, z, activation, params) -> None:
    """3x3 stride-1 convolution by Winograd F(t x t, 3x3), in bands of t-row output tiles.

    Per band: the (t+2)^2 input tiles (stride t) of the zero-padded image are gathered into an
    (a*a, tiles*C) matrix (a = t+2) by one strided copy, transformed by one GEMM, multiplied by
    the transformed weights in a*a GEMMs of (tiles x C) @ (C x M) (one batched np.matmul), the
    bias added to one of the products, transformed back by one GEMM and scattered to the
    output. Those GEMMs carry 2.25x (t=2) or 4x (t=4) fewer multiplications than the direct
    convolution.

    Numerics: differences to the direct sum are of the order of float32 rounding times the
    transform's constants (measured relative error 3e-6 to 9e-6 of the largest output). The
    caller only comes here with finite inputs and weights: a NaN or Inf would spread to the whole
    tile (the transforms mix every input of a tile), where the direct convolution confines
    it to the outputs that read it."""
    n, h, w, c = x.shape
    oh, ow, m = y.shape[1:]
    bb, _g, aa, bidx = _WINO[t]
    a = t + 2
    a2 = a * a
    th, tw = -(-oh // t), -(-ow // t)
    hp, wp = th * t + 2, tw * t + 2
    bt, bl = begin
    h1, w1 = min(h, hp - bt), min(w, wp - bl)
    e = 4
    rows = _band_rows(th, WINO_BAND_BYTES, a2 * tw * max(m, c) * e)
    for i in range(n):
        xp = scratch("conv.wpad", (hp, wp, c))
        xp[:bt] = 0
        xp[bt + h1:] = 0
        xp[bt:bt + h1, :bl] = 0
        xp[bt:bt + h1, bl + w1:] = 0
        xp[bt:bt + h1, bl:bl + w1] = x[i, :h1, :w1]
        for t0 in range(0, th, rows):
            t1 = min(th, t0 + rows)
            nb = t1 - t0
            tiles = nb * tw
            d = scratch("conv.wd", (a2, tiles * c))
            np.copyto(d.reshape(a, a, nb, tw, c), np.ndarray(
                (a, a, nb, tw, c), F32, xp, t0 * t * wp * c * e,
                (wp * c * e, c * e, t * wp * c * e, t * c * e, e)))
            v = scratch("conv.wv", (a2, tiles, c))
            np.matmul(bb, d, out=v.reshape(a2, tiles * c))
            prod = scratch("conv.wm", (a2, tiles, m))
            np.matmul(v, u, out=prod)
            if bias is not None:
                add_rows(prod[bidx], bias, _hot(tiles, m, c))
            o = scratch("conv.wo", (t * t, tiles * m))
            np.matmul(aa, prod.reshape(a2, tiles * m), out=o)
            r0, r1 = t0 * t, min(oh, t1 * t)
            yb = y[i, r0:r1]
            zb = None if z is None else z[i, r0:r1]
            if zb is None:
                apply_activation(o, activation, params)  # contiguous: the fast loops
            o5 = o.reshape(t, t, nb, tw, m).transpose(2, 0, 3, 1, 4)  # (ty, p, tx, q, M)
            if r1 - r0 == nb * t and ow == tw * t:
                y5 = yb.reshape(nb, t, tw, t, m)
                if zb is None:
                    np.copyto(y5, o5)
                else:
                    np.add(o5, zb.reshape(y5.shape), out=y5)
            else:  # a partial last tile row or column: one copy per tile position
                for p in range(t):
                    rp = len(range(p, r1 - r0, t))
                    for q in range(t):
                        cq = len(range(q, ow, t))
                        if zb is None:
                            np.copyto(yb[p::t, q::t], o5[:rp, p, :cq, q])
                        else:
                            np.add(o5[:rp, p, :cq, q], zb[p::t, q::t], out=yb[p::t, q::t])
            if zb is not None:
                apply_activation(yb, activation, params)


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

    NumPy's einsum runs the tap reduction inside its inner loop: measured 2-3x faster on the
    ShuffleNet shapes than the former per-tap multiply and add passes (18 passes over the
    output for a 3x3 kernel), with no temporaries, and the same float32 sums in the same order.
    With unit stride and dilation along W, a tap's (OW, C) block of the padded image is one
    contiguous run, so the view is (oh, kh, kw, OW*C) against weights tiled OW times: the
    einsum's inner loop runs OW*C long instead of C (measured 28x28x136: 235 -> 151 us,
    56x56x112: 903 -> 621 us; 7x7 maps unchanged), and the bias is one contiguous add.
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
        # (xp is always C-contiguous; np.ndarray over it is ~8 us faster a call than as_strided)
        v = np.ndarray(shape, xp.dtype, xp, i * sn, strides)
        np.einsum("hwabc,abc->hwc", v, wt, out=y[i])
    if bias is not None:
        y += bias  # (NumPy's: OpenBLAS's threads may have gone to sleep since the last GEMM)


# ---------------------------------------------------------------------------------------------
# NCHW


def _pack_nchw(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, Cg, kh, kw) -> (group, M/group, Cg*kh*kw): rows of the left GEMM operand; a view of
    a C-contiguous float32 W (its rows already are those), else one copy."""
    m = w.shape[0]
    return np.ascontiguousarray(w, dtype=F32).reshape(group, m // group, -1)


def conv_nchw(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), out=None,
):
    """Y = act(Conv(X, W, B) + Z) in NCHW, 2-D, float32."""
    group = int(group)
    x = _f32(X)
    s, d, begin, end, y, z, bias = _prologue(
        x, W, B, Z, group, kernel_shape, strides, dilations, pads, auto_pad, out, nhwc=False
    )
    z = _own(z, y)
    n, c, h, wd = x.shape
    m, cg, kh, kw = W.shape
    oh, ow = y.shape[2:4]
    bias = None if bias is None else bias.reshape(m, 1)
    if n == 0 or oh * ow * m == 0:
        return y
    p = oh * ow
    if cg == 1 and m == group:
        pw = packed(W, "dw_nchw", lambda w: np.ascontiguousarray(np.asarray(w, F32)[:, 0]))
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
    rows = _band_rows(oh, BAND_BYTES, cols_per_row)
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


def nchw_workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, activation="",
                   activation_params=None, **_) -> int:
    """Workspace bytes of conv_nchw: a contiguous copy of X when it is a strided view, one
    image's padded copy, the patch band (or the depthwise tap product), per-call packed weights
    (see nhwc_workspace) and the residual's copy when Y is written over Z. Unknown shapes: 0."""
    geom = _static_geometry(x, w, x[2:4], strides, dilations, pads, auto_pad)
    if geom is None:
        return 0
    s, d, begin, end, (oh, ow) = geom
    group = int(group or 1)
    n, c, h, wd = x
    m, cg, kh, kw = w
    if n == 0 or oh * ow * m == 0:
        return 0
    act = activation_workspace(activation, activation_params, n * m * oh * ow)
    zcopy = n * m * oh * ow if z else 0  # (omitted: None or ())
    zcopy += n * c * h * wd  # (X's contiguous copy, counted with the residual's)
    padded = c * (h + max(begin[0], 0) + max(end[0], 0)) * (wd + max(begin[1], 0)
                                                            + max(end[1], 0))
    if cg == 1 and m == group:
        return act + 4 * (zcopy + padded + m * oh * ow + m * kh * kw)
    if (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end):
        return act + 4 * (zcopy + m * cg)
    rows = _band_rows(oh, BAND_BYTES, ow * cg * kh * kw * group * 4)
    return act + 4 * (zcopy + padded + c * kh * kw * rows * ow + m * cg * kh * kw)


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
    from opwarden.ops.base import REGISTRY

    for opdef in REGISTRY.versions("Conv"):
        opdef.kernel("cpu", dtypes=["float32"], layout="NHWC", priority=10, when=_conv_ok,
                     name="conv.cpu.nhwc", accepts_out=True,
                     workspace_bytes=nhwc_workspace)(_conv_nhwc_kernel)
        opdef.kernel("cpu", dtypes=["float32"], layout="NCHW", priority=10, when=_conv_ok,
                     name="conv.cpu.nchw", accepts_out=True,
                     workspace_bytes=nchw_workspace)(_conv_nchw_kernel)
