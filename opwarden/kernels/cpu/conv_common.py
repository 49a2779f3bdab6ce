"""What every fast 2-D convolution shares: geometry, checks, padding, packing, the epilogue.

Both layouts' kernels (kernels/cpu/conv.py) and each NHWC algorithm (conv_gemm, conv_rowtap,
conv_stem, conv_depthwise, conv_winograd) build on these: the checked geometry of a call
(cached per shapes and attributes, see _prologue), the zero-padded NHWC copy, the stride-phase
planes the shifted and stem paths read taps from, W packed as NHWC patch rows (cached with W
while it is a constant), FusedConv's branch plan (which products with W's structural zeros
may be skipped) and the epilogue that adds bias and residual and applies the activation in
place, on OpenBLAS's threads right after a GEMM large enough to have woken them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from opwarden import native
from opwarden.blas import blas_thread_count
from opwarden.errors import KernelError
from opwarden.kernels.cpu.blas_split import split_threads, splits
from opwarden.kernels.cpu.shuffle import channel_shuffle, shuffle_into
from opwarden.kernels.cpu.util import (
    F32,
    add_into,
    add_rows,
    apply_activation,
    output,
    packed,
    scratch,
)
from opwarden.memory.constants import is_constant
from opwarden.ops.conv import conv_out_shape, conv_pads, spatial_params

# GEMMs of at least this many multiply-adds (m*n*k) leave OpenBLAS's threads awake (see _hot):
# 4x its single-thread threshold, for a margin.
HOT_MNK = 1 << 20


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
    OPENBLAS_THREAD_TIMEOUT after their last work before sleeping. Waking a sleeping one costs
    more than the add saves, so threaded adds only follow a hot GEMM. A GEMM that blas_split
    shared out ran on single-threaded calls: OpenBLAS's threads are not awake after it."""
    return m * n * k >= HOT_MNK and not splits(m * n * k)


def _native_epilogue(y: np.ndarray, bias, z, activation: str, params) -> bool:
    """The epilogue on native.conv_epilogue; False (y untouched) where it does not apply."""
    if (not native.available() or not isinstance(y, np.ndarray) or y.dtype != F32
            or not y.flags.c_contiguous or not y.flags.writeable or y.size == 0
            or native.epilogue_act_code(activation or "", params) is None):
        return False
    cols = y.shape[-1] if y.ndim else 1
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != F32 or bias.shape != (cols,):
            return False  # (a pre-shaped bias, e.g. NCHW's (M, 1, 1), broadcasts otherwise)
        bias = np.ascontiguousarray(bias)
    if z is not None:
        if (not isinstance(z, np.ndarray) or z.dtype != F32 or z.shape != y.shape
                or not z.flags.c_contiguous or np.may_share_memory(z, y)):
            return False  # (z in y's memory: the NumPy path's order of reads decides)
    threads = blas_thread_count() if split_threads() <= 1 else 1
    native.conv_epilogue(y, bias, z, activation or "", params, threads)
    return True


def _epilogue(y: np.ndarray, bias, z, activation: str, params, hot: bool = False) -> None:
    """y += bias (broadcast on the last axis or given pre-shaped), y += z, y = act(y); in place.
    `hot` (see _hot): the adds run on OpenBLAS's threads where they can (util.add_rows,
    add_into), faster than NumPy's single-threaded adds on large outputs. With the compiled
    kernels, C-contiguous float32 operands and a piecewise activation, Swish or Sigmoid, one
    pass does it all (native.conv_epilogue: bit for bit the NumPy path for the piecewise ones,
    the compiled SiLU's bits for Swish, within 4e-7 of float64 for Sigmoid)."""
    if (bias is not None or z is not None or activation) and _native_epilogue(
            y, bias, z, activation, params):
        return
    if bias is not None:
        add_rows(y, bias, hot)
    if z is not None:
        add_into(y, z, hot)
    if activation:
        apply_activation(y, activation, params)


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


# Checked geometry per (layout, shapes, attributes): the same convolution is called with the same
# shapes on every run, and the checks and pad arithmetic are a noticeable share of a small
# convolution's time in Python. Entries are small; the table is cleared if it ever grows large.
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


def _branch1x1_weights(W, m0: int, mb: int, tap: int, cg: int) -> np.ndarray:
    """A 1x1 FusedConv branch's weights (C, mb): output channels m0.. of W at its one tap,
    cached with W."""
    return packed(W, ("branch1x1", m0, mb, tap), lambda w: np.ascontiguousarray(
        np.asarray(w, F32)[m0:m0 + mb].reshape(mb, cg, -1)[:, :, tap].T))


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


def _finite(a: np.ndarray) -> bool:
    """No NaN or Inf in a (one reduction; an overflowing sum of finite values says False,
    which only sends the caller down its exact path)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.add.reduce(a, axis=None)))


class Facts(NamedTuple):
    """What the NHWC workspace rules read of a call (conv.nhwc_workspace builds it): shapes,
    geometry and the floats several paths share (Y, the residual's copy, the padded input)."""

    x: tuple
    w: tuple
    s: list
    d: list
    begin: list
    end: list
    oh: int
    ow: int
    group: int
    bias: bool
    bplan: list | None
    zcopy: int
    padded: int
