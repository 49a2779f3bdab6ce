"""Grouped convolution with few channels per group on the compiled loop (native/grouped.c):
the "grouped" route of conv.py's NHWC dispatcher, variants conv.cpu.grouped and
fusedconv.cpu.grouped (ResNeXt's and RegNet's 3x3 group convolutions, grouped 1x1s), and
with one group the "direct" route (conv.cpu.direct, fusedconv.cpu.direct): convolutions with
few input channels, the RGB stems, whose patch matrix costs more to build than to multiply.

The shifted-GEMM and patch-matrix routes run one small GEMM per group (per tap, or over a
patch copy), whose calls cost more than their few multiply-adds at 4..32 channels per group.
The C loop reads each output pixel's taps straight from the unpadded image and keeps a block
of pixels' sums in registers (module docstring of grouped.c), then applies bias, residual and
activation while the row is in cache. Output rows are shared out over the session's threads
by blas_split.over_rows, or run on OpenMP threads where no session threads are set.

W (M, cg, kh, kw) is repacked once per constant weight (util.packed): (group, kh, kw, cg, mg)
in general, or for mg 4 (group/2, kh, kw, cg, 2, 4), two groups per 8-float vector.
"""

from __future__ import annotations

import numpy as np

from opwarden import native
from opwarden.blas import blas_thread_count
from opwarden.kernels.cpu.blas_split import SPLIT, over_rows, split_threads
from opwarden.kernels.cpu.conv_common import Facts, _own
from opwarden.kernels.cpu.util import F32, apply_activation, packed, scratch
from opwarden.native.bound import grouped_nhwc_call

# The route takes groups of at least GROUPED_MIN_CG input channels (cg 1 is depthwise) with
# mg output channels where the loop has a register-blocked path: mg a multiple of 8, or mg 4
# in pairs of groups (native.grouped_pair_ok); at most GROUPED_MAX_CG input channels per
# group, and above GROUPED_SHIFT_MAX_CG only where the shifted route (one GEMM per tap) does
# not apply: at 48 channels per group the two ran even. A 1x1 stride-1 convolution (one GEMM
# per group, the pointwise route) comes here up to GROUPED_PW_MAX_CG input channels per group
# (ShuffleNet's g8 with 12: even; 32 groups of 8: 1.8x). Measurements: benchmarks/NOTES.md.
GROUPED_MIN_CG = 2
GROUPED_MAX_CG = 64
GROUPED_SHIFT_MAX_CG = 32
GROUPED_PW_MAX_CG = 16


def grouped_takes(c: int, w_shape, group: int) -> bool:
    """Whether the grouped route takes W (M, cg, kh, kw) with `group` groups over C input
    channels: the extension built, group > 1, not depthwise, and channels per group the loop
    has a fast path for."""
    m, cg = w_shape[:2]
    if group < 2 or m % group or cg * group != c or not native.available():
        return False
    mg = m // group
    if not GROUPED_MIN_CG <= cg <= GROUPED_MAX_CG:
        return False
    return mg % 8 == 0 or native.grouped_pair_ok(group, cg, mg)


def direct_takes(m: int) -> bool:
    """Whether the direct route takes a group-1 convolution with few input channels (the
    stem; conv.py decides "few") and M output channels: the extension built and M a multiple
    of 8, the loop's register blocks (at M 16: 3-5x the transposed patch matrix of
    conv_stem on 224x224 RGB stems, see benchmarks/NOTES.md)."""
    return m % 8 == 0 and native.available()


def _pack_wide(group: int):
    """W (M, cg, kh, kw) -> (group, kh, kw, cg, mg)."""
    def pack(w: np.ndarray) -> np.ndarray:
        m, cg, kh, kw = w.shape
        v = np.asarray(w, F32).reshape(group, m // group, cg, kh, kw)
        return np.ascontiguousarray(v.transpose(0, 3, 4, 2, 1))
    return pack


def _pack_pair(group: int):
    """W (M, cg, kh, kw), mg 4 -> (group/2, kh, kw, cg, 2, 4): both groups of a pair per
    (tap, ci) in one 8-float vector."""
    def pack(w: np.ndarray) -> np.ndarray:
        m, cg, kh, kw = w.shape
        v = np.asarray(w, F32).reshape(group // 2, 2, m // group, cg, kh, kw)
        return np.ascontiguousarray(v.transpose(0, 4, 5, 3, 1, 2))
    return pack


def nhwc_grouped(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                 bplan) -> None:
    """The grouped route (conv.py's _RUN signature): y = act(Conv(x, W) + bias + z). The
    dispatcher has already shuffled x's channels (grouped nodes are not depthwise) and gives
    no branch plan (branches are group-1 only)."""
    n, h, wd, c = x.shape
    m, cg, kh, kw = W.shape
    group = c // cg
    pair = native.grouped_pair_ok(group, cg, m // group)
    wp = packed(W, ("grouped", group, pair), (_pack_pair if pair else _pack_wide)(group))
    if not x.flags.c_contiguous:  # (an NHWC view of an NCHW tensor)
        buf = scratch("grouped.x", x.shape)
        np.copyto(buf, x)
        x = buf
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=F32)
    if z is not None:
        if not (z.ctypes.data == y.ctypes.data and z.strides == y.strides):
            z = _own(z, y)  # (overlapping y other than as y itself)
        z = np.ascontiguousarray(z, dtype=F32)
    act = activation.decode() if isinstance(activation, bytes) else str(activation or "")
    params = params or ()
    later = native.dw_act_code(act, params) is None  # (applied after, by NumPy)
    kact = "" if later else act
    oh, ow = y.shape[1:3]

    def run(r0: int, r1: int) -> None:
        native.grouped_nhwc(x, wp, bias, z, y, group, (kh, kw), s, d, begin, kact, params, 1,
                            (r0, r1), pair)

    if split_threads() > 1:
        over_rows(n * oh, n * oh * ow * m * cg * kh * kw, run)
    else:  # (no session threads set: OpenMP on OpenBLAS's count)
        native.grouped_nhwc(x, wp, bias, z, y, group, (kh, kw), s, d, begin, kact, params,
                            blas_thread_count(), None, pair)
    if later and act:
        apply_activation(y, act, params)


def bind_grouped(x, W, B, s, d, begin, end, y, bias, activation, params):
    """nhwc_grouped as one bound native call (native.bound) for a prepared step, where it is
    one call: an activation the loop applies and no session threads sharing rows out
    (blas_split.SPLIT off)."""
    act = activation.decode() if isinstance(activation, bytes) else str(activation or "")
    params = params or ()
    if SPLIT or native.dw_act_code(act, params) is None:
        return None
    m, cg, kh, kw = W.shape
    group = x.shape[3] // cg
    pair = native.grouped_pair_ok(group, cg, m // group)
    wp = packed(W, ("grouped", group, pair), (_pack_pair if pair else _pack_wide)(group))
    b = None if bias is None else np.ascontiguousarray(bias, dtype=F32)
    f = grouped_nhwc_call(wp, b, y, group, (kh, kw), s, d, begin, act, params, pair)

    def call(x, z) -> None:
        if z is not None or not f(x):
            nhwc_grouped(x, W, B, s, d, begin, end, y, bias, z, activation, params, 0, None)

    return call


def grouped_floats(f: Facts) -> int:
    """X's contiguous copy (for a strided X) and the packed weights (packed on every call
    for weights that are not constants)."""
    m, cg, kh, kw = f.w
    return int(np.prod(f.x)) + m * cg * kh * kw
