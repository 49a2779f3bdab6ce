"""Integer GEMM and convolution for QGemm, QLinearMatMul, QLinearConv and
DynamicQuantizeMatMul through float BLAS.

The operands, less their zero points, are integers of at most 9 bits (|v| <= 255). A float32
GEMM of such integers is exact while every partial sum is an integer below 2**24, so the
inner dimension is cut into chunks within that bound, each chunk a float32 GEMM, the chunks
summed in float64. A constant weight's chunks come from its own |w| sums (255 * sum |w| <=
2**24 per output over a chunk: `quant_linear.weight_splits`), computed once with its float32
centered copy (`util.packed`); other operands use the types' bound (|a - za| * |b - zb| *
chunk <= 2**24, 514 for uint8 times int8). The accumulator equals the reference's exact
integer one at float32 GEMM speed; the requantization that follows is the reference's own
float32 arithmetic. Quantize/Dequantize/DynamicQuantizeLinear and MatMulInteger live in
`quant_linear`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opwarden import native
from opwarden.blas import compute_threads
from opwarden.errors import KernelError
from opwarden.kernels.cpu import quant_linear
from opwarden.kernels.cpu.quant_linear import (
    F32,
    centered_f32,
    exact_matmul,
    is_int8,
    latest,
    requantize_into,
    span,
    weight_splits,
)
from opwarden.kernels.cpu.util import packed
from opwarden.memory.constants import is_constant
from opwarden.ops.base import REGISTRY
from opwarden.ops.contrib_quant_nn import qgemm_finish
from opwarden.ops.conv import conv_pads

# Largest K for which a float32 dot product of values in [-255, 255] stays exact.
F32_EXACT_K = (1 << 24) // (255 * 255)


def exact_float(k: int) -> type:
    """The narrowest float type whose GEMM over an inner dimension `k` of any 8-bit operands
    is exact in one call (the kernels here chunk instead; kept for callers sizing buffers)."""
    return np.float32 if k <= F32_EXACT_K else np.float64


def _weight_f32(w: np.ndarray, zp, shaped, tag: str, shape_fn=None,
                k_axis: int = -2) -> tuple[np.ndarray, int, np.ndarray | None]:
    """A weight as float32 less its zero point `zp` (`shaped` to broadcast against it),
    cached when both are constants, the bound on its |values| and, for a cached one, its
    exact chunk boundaries along `k_axis` of the packed form (quant_linear.weight_splits)."""
    zarr = None if shaped is None else np.asarray(shaped)

    def pack(a):
        c = centered_f32(a, zarr)
        return c if shape_fn is None else np.ascontiguousarray(shape_fn(c))

    deps = (zp,) if isinstance(zp, np.ndarray) else ()
    if zp is not None and not deps:
        return pack(w), span(w.dtype, zarr), None
    wf = packed(w, ("quant", tag), pack, deps)
    if not is_constant(w):  # an activation operand: the type's bound, no per-call analysis
        return wf, span(w.dtype, zarr), None
    splits = packed(w, ("quant-splits", tag), lambda _: weight_splits(wf, k_axis), deps)
    return wf, span(w.dtype, zarr), splits


def qgemm_blas(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
               y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """QGemm with the integer product on float BLAS (exact; see the module docstring)."""
    if A.ndim != 2 or B.ndim != 2:
        raise KernelError(f"QGemm: A and B must be 2-D, got shapes {A.shape} and {B.shape}")
    a = A.T if transA else A
    kb, nb = (B.shape[1], B.shape[0]) if transB else B.shape
    if a.shape[1] != kb:
        raise KernelError(f"QGemm: inner dimensions differ: A' is {a.shape}, B' is "
                          f"{(kb, nb)}")
    zb = np.asarray(b_zero_point)
    if zb.size not in (1, nb):
        raise KernelError(f"QGemm: b_zero_point must be a scalar or have {nb} entries, "
                          f"got shape {zb.shape}")
    za = None if a_zero_point is None else np.asarray(a_zero_point)
    bt = (lambda c: c.T) if transB else None
    bzp = zb.reshape(-1) if not transB or zb.size == 1 else zb.reshape(-1, 1)
    bf, bound_b, splits = _weight_f32(B, b_zero_point, bzp, f"qgemm{transB}", bt)
    acc = exact_matmul(centered_f32(a, za), bf, span(a.dtype, za), bound_b, splits)
    return qgemm_finish(acc.astype(np.int64), C, a_scale, b_scale, y_scale, y_zero_point,
                        alpha)


def _scalar(p, what: str, name: str) -> np.ndarray:
    p = np.asarray(p)
    if p.size != 1:
        raise KernelError(f"{what}: {name} must be a scalar (per-tensor), got shape {p.shape}")
    return p.reshape(())


def qlinear_matmul_blas(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                        y_zero_point, out=None):
    """QLinearMatMul (2-D or batched, numpy broadcasting; per-tensor a, per-tensor or
    per-column b) with the integer product on float BLAS."""
    what = "QLinearMatMul"
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise KernelError(f"{what}: inner dimensions differ: {a.shape} @ {b.shape}")
    za = np.asarray(a_zero_point)
    zb = np.asarray(b_zero_point)
    n = b.shape[-1]
    if za.size != 1 and not (a.ndim == 2 and za.shape == (a.shape[0],)):
        raise KernelError(f"{what}: a_zero_point of shape {za.shape} is neither per tensor "
                          f"nor per row")
    if zb.size != 1 and zb.shape != (n,):
        raise KernelError(f"{what}: b_zero_point of shape {zb.shape} is neither per tensor "
                          f"nor per column of {n}")
    zar = za.reshape(()) if za.size == 1 else za.reshape(-1, 1)
    zbr = zb.reshape(()) if zb.size == 1 else zb
    bf, bound_b, splits = _weight_f32(b, b_zero_point, zbr, "qlmm")
    acc = exact_matmul(centered_f32(a, zar), bf, span(a.dtype, zar), bound_b, splits)
    sa = np.asarray(a_scale, F32)
    sa = sa.reshape(()) if sa.size == 1 else sa.reshape(-1, 1)
    sb = np.asarray(b_scale, F32)
    sb = sb.reshape(()) if sb.size == 1 else sb.reshape(-1)
    sy = _scalar(y_scale, what, "y_scale").astype(F32)
    with np.errstate(all="ignore"):
        mult = ((sa * sb) / sy).astype(F32)
    zy = _scalar(y_zero_point, what, "y_zero_point")
    return requantize_into(acc, mult, zy, out)


def _matmul_ok(a, sa, za, b, sb, zb, *rest, **attrs) -> bool:
    if a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return False
    return all(f is None or f.dtype in (None, "float32") for f in (sa, sb)) and is_int8(
        a.dtype, b.dtype)


def _conv_geometry(x, w, auto_pad, dilations, kernel_shape, pads, strides, group, what):
    n, c = x.shape[:2]
    m, cg, kh, kw = w.shape
    if group < 1 or c % group or m % group or cg != c // group:
        raise KernelError(f"{what}: group={group} does not fit input channels {c} and weight "
                          f"shape {w.shape}")
    if kernel_shape is not None and list(kernel_shape) != [kh, kw]:
        raise KernelError(f"{what}: kernel_shape {list(kernel_shape)} differs from the "
                          f"weight's {[kh, kw]}")
    s = [int(v) for v in strides] if strides else [1, 1]
    d = [int(v) for v in dilations] if dilations else [1, 1]
    begin, end = conv_pads(x.shape[2:], [kh, kw], s, d, pads, auto_pad)
    ext = [d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1]
    hp, wp = x.shape[2] + begin[0] + end[0], x.shape[3] + begin[1] + end[1]
    if hp < ext[0] or wp < ext[1]:
        raise KernelError(f"{what}: dilated kernel {ext} exceeds the padded input {[hp, wp]}")
    oh, ow = (hp - ext[0]) // s[0] + 1, (wp - ext[1]) // s[1] + 1
    return s, d, begin, end, ext, oh, ow


def _depthwise(xp, wc, s, d, oh, ow, kh, kw):
    """Channel-wise convolution (group == C, one output per channel) as a loop over the
    kernel's taps, each a float32 multiply-add over the whole tensor (exact: K = kh * kw is
    tiny). xp: (N, C, Hp, Wp) centered float32; wc: (C, kh, kw)."""
    n, c = xp.shape[:2]
    acc = np.zeros((n, c, oh, ow), F32)
    tmp = np.empty_like(acc)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * d[0], j * d[1]
            tap = xp[:, :, r0:r0 + s[0] * (oh - 1) + 1:s[0], c0:c0 + s[1] * (ow - 1) + 1:s[1]]
            np.multiply(tap, wc[:, i, j].reshape(1, c, 1, 1), out=tmp)
            acc += tmp
    return acc


def _unit(v):
    """A 1-D convolution's attribute as the 2-D one of a unit height."""
    return None if v is None else [1, *v]


def qlinear_conv_im2col(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                        y_zero_point, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None, out=None):
    """1-D or 2-D QLinearConv: im2col windows times the weights on float32 BLAS (exact), a
    tap loop for depthwise convolutions; a 1-D one runs as 2-D with a unit height."""
    what = "QLinearConv"
    if x.ndim == 3 and w.ndim == 3:
        p1 = None if pads is None else [0, pads[0], 0, pads[1]]
        y = qlinear_conv_im2col(
            x[:, :, None], x_scale, x_zero_point, w[:, :, None], w_scale, w_zero_point,
            y_scale, y_zero_point, B, auto_pad=auto_pad, dilations=_unit(dilations),
            group=group, kernel_shape=_unit(kernel_shape), pads=p1, strides=_unit(strides))
        return y[:, :, 0]
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(f"{what}: this variant runs 1-D and 2-D convolutions, got {x.shape}, "
                          f"{w.shape}")
    m, cg, kh, kw = w.shape
    s, d, begin, end, ext, oh, ow = _conv_geometry(x, w, auto_pad, dilations, kernel_shape,
                                                   pads, strides, group, what)
    xz = _scalar(x_zero_point, what, "x_zero_point") if x_zero_point is not None else None
    wz = None if w_zero_point is None else np.asarray(w_zero_point)
    if wz is not None and wz.size not in (1, m):
        raise KernelError(f"{what}: w_zero_point of shape {wz.shape} does not match {m} "
                          f"output channels")
    wzr = None if wz is None else (wz.reshape(()) if wz.size == 1 else wz.reshape(-1, 1, 1, 1))
    wc, bound_w, splits = _weight_f32(w, w_zero_point, wzr, "qconv",
                                      lambda c: c.reshape(c.shape[0], -1), -1)
    wc = wc.reshape(w.shape)
    bound_x = span(x.dtype, xz)
    if cg == 1 and m == group and kh * kw * bound_x * bound_w < 1 << 24:
        acc = _depthwise(_centered_padded(x, xz, begin, end), wc.reshape(m, kh, kw), s, d, oh,
                         ow, kh, kw)
    else:
        acc = _grouped_gemm(x, xz, begin, end, wc, group, s, d, ext, oh, ow, bound_x, bound_w,
                            splits)
    return _conv_finish(acc, B, x_scale, w_scale, y_scale, y_zero_point, m, out, what)


def _centered_padded(x, xz, begin, end):
    """x less its zero point as float32, zero-padded (the padding is the zero point)."""
    xc = centered_f32(x, xz)
    if any(begin) or any(end):
        xc = np.pad(xc, [(0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])])
    return xc


def _grouped_gemm(x, xz, begin, end, wc, group, s, d, ext, oh, ow, bound_x, bound_w, splits):
    """Per image and group: weights (M/g, K) @ windows (K, OH*OW), giving NCHW directly. The
    windows come centered and padded in one compiled pass where the extension loaded, else
    from a centered, padded float32 copy of x through a strided view."""
    n = x.shape[0]
    m, cg, kh, kw = wc.shape
    mg = m // group
    one = len(splits) <= 2 if splits is not None else cg * kh * kw * bound_x * bound_w < 1 << 24
    acc = np.empty((n, m, oh * ow), F32 if one else np.float64)
    pointwise = kh == kw == 1 and s == [1, 1]
    compiled = not pointwise and native.available() and x.flags.c_contiguous \
        and x.dtype in (np.int8, np.uint8)
    if compiled:
        cols = np.empty((cg * kh * kw, oh * ow), F32)
        zp = 0 if xz is None else int(np.asarray(xz).reshape(-1)[0])
        threads = compute_threads()
    else:
        xc = _centered_padded(x, xz, begin, end)
        if not pointwise:
            win = sliding_window_view(xc, ext, axis=(2, 3))[:, :, ::s[0], ::s[1], ::d[0], ::d[1]]
    for b in range(n):
        for g in range(group):
            wg = wc[g * mg:(g + 1) * mg].reshape(mg, -1)
            if compiled:
                native.qconv_im2col(x, b, g * cg, (g + 1) * cg, (kh, kw), tuple(s), tuple(d),
                                    tuple(begin), (oh, ow), zp, cols, threads)
            elif pointwise:
                cols = xc[b, g * cg:(g + 1) * cg].reshape(cg, -1)
            else:  # (cg, OH, OW, kh, kw) -> (cg, kh, kw, OH, OW): K rows of OH*OW pixels
                cols = win[b, g * cg:(g + 1) * cg].transpose(0, 3, 4, 1, 2).reshape(
                    cg * kh * kw, oh * ow)
            exact_matmul(wg, cols, bound_w, bound_x, splits, out=acc[b, g * mg:(g + 1) * mg])
    return acc.reshape(n, m, oh, ow)


def _conv_finish(acc, B, x_scale, w_scale, y_scale, y_zero_point, m, out, what):
    bias = None
    if B is not None:
        bias = np.asarray(B)
        if bias.shape != (m,):
            raise KernelError(f"{what}: bias B must have shape ({m},), got {bias.shape}")
        bias = bias.reshape(m, 1, 1)
    sx = _scalar(x_scale, what, "x_scale").astype(F32)
    sw = np.asarray(w_scale, F32)
    if sw.size not in (1, m):
        raise KernelError(f"{what}: w_scale of shape {sw.shape} does not match {m} output "
                          f"channels")
    sw = sw.reshape(-1, 1, 1) if sw.size > 1 else sw.reshape(())
    sy = _scalar(y_scale, what, "y_scale").astype(F32)
    with np.errstate(all="ignore"):
        mult = ((sx * sw) / sy).astype(F32)
    return requantize_into(acc, mult, _scalar(y_zero_point, what, "y_zero_point"), out, bias)


def _conv_ok(x, xs, xz, w, ws, wz, ys, yz, *rest, **attrs) -> bool:
    if x.shape is None or w.shape is None or len(x.shape) != len(w.shape):
        return False
    return len(x.shape) in (3, 4) and is_int8(x.dtype, w.dtype) and all(
        f is None or f.dtype in (None, "float32") for f in (xs, ws, ys))


def _im2col_workspace(x_shape, xs=None, xz=None, w_shape=None, *rest, **attrs) -> int:
    """The float32 padded input and windows, the float32 weights, the float64 accumulator
    (upper bound: stride 1, padding of a kernel's size on each side)."""
    if x_shape is None or w_shape is None or len(x_shape) != len(w_shape):
        return 0
    if len(x_shape) == 3:
        x_shape, w_shape = (x_shape[0], x_shape[1], 1, x_shape[2]), (*w_shape[:2], 1, w_shape[2])
    if len(x_shape) != 4:
        return 0
    n, c, h, w = x_shape
    m, cg, kh, kw = w_shape
    pad_h, pad_w = h + 2 * kh, w + 2 * kw
    cols = pad_h * pad_w * cg * kh * kw
    return (4 * (2 * n * c * pad_h * pad_w + cols + m * cg * kh * kw)
            + 16 * n * m * pad_h * pad_w + 16 * m * (cg * kh * kw + 1))


def dynamic_quantize_matmul_blas(A, B, b_scale, b_zero_point=None, bias=None):
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 with the reference's scale
    and zero point in float32, the exact product on float32 BLAS, then the reference's float32
    rescale and bias."""
    what = "DynamicQuantizeMatMul"
    a = np.asarray(A, F32)
    lo = min(F32(a.min()) if a.size else F32(0), F32(0))
    hi = max(F32(a.max()) if a.size else F32(0), F32(0))
    n = B.shape[-1] if B.ndim else 1
    bs = np.asarray(b_scale, F32)
    if not (np.isfinite(lo) and np.isfinite(hi)) or B.ndim < 2 or a.ndim < 2 or bs.size not in (
            1, n) or a.shape[-1] != B.shape[-2]:
        # NaN/inf in A, a vector or a shape error: the reference decides (and explains).
        return latest(what, "com.microsoft").reference(A, B, b_scale, b_zero_point, bias)
    with np.errstate(all="ignore"):
        scale = F32(1) if hi == lo else F32(F32(hi - lo) / F32(255))
        zp = int(np.rint(min(max(F32(F32(0) - F32(lo / scale)), F32(0)), F32(255))))
        q = np.divide(a, scale, out=np.empty(a.shape, F32))
        np.rint(q, out=q)
        q += F32(zp)
        np.clip(q, 0, 255, out=q)
        q -= F32(zp)
    zb = None if b_zero_point is None else np.asarray(b_zero_point)
    if zb is not None and (zb.ndim > 1 or zb.size not in (1, n)):
        raise KernelError(f"{what}: b_zero_point must have 1 or {n} entries, got {zb.shape}")
    zbr = None if zb is None else (zb.reshape(()) if zb.size == 1 else zb.reshape(-1))
    bf, bound_b, splits = _weight_f32(B, b_zero_point, zbr, "dqmm")
    acc = exact_matmul(q, bf, max(zp, 255 - zp), bound_b, splits)
    with np.errstate(all="ignore"):
        y = acc.astype(F32) if acc.dtype != F32 else acc
        y *= (F32(scale) * (bs.reshape(()) if bs.size == 1 else bs.reshape(-1))).astype(F32)
        if bias is not None:
            bv = np.asarray(bias)
            if bv.shape != (n,):
                raise KernelError(f"{what}: bias must have shape ({n},), got {bv.shape}")
            y += bv.astype(F32)
    return y


def _gemm_workspace(a_shape, sa=None, za=None, b_shape=None, *rest, transA=0, transB=0,
                    **attrs) -> int:
    """The float32 centered A and B, B's chunk analysis on first use (two float64 K x N
    tables) and the float64 accumulator."""
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return 0
    m = a_shape[-1] if transA else a_shape[-2]
    n = b_shape[-2] if transB else b_shape[-1]
    batch = math.prod(a_shape[:-2]) if len(a_shape) > 2 else 1
    return 4 * math.prod(a_shape) + 20 * math.prod(b_shape) + 16 * batch * m * n


def register() -> None:
    """Register the BLAS variants of QGemm, QLinearMatMul and QLinearConv, and those of
    `quant_linear` (the compiled ones of `quant_native` register after these, from
    kernels/registry.py)."""

    latest("QGemm", "com.microsoft").kernel(
        "cpu", priority=10, name="qgemm.cpu.blas", workspace_bytes=_gemm_workspace,
        when=lambda a, *r, **k: a.shape is not None and len(a.shape) == 2)(qgemm_blas)
    for opdef in REGISTRY.versions("QLinearMatMul"):
        opdef.kernel("cpu", priority=10, name="qlinearmatmul.cpu.blas", when=_matmul_ok,
                     accepts_out=True, workspace_bytes=_gemm_workspace)(qlinear_matmul_blas)
    for opdef in REGISTRY.versions("QLinearConv"):
        opdef.kernel("cpu", priority=10, name="qlinearconv.cpu.im2col", when=_conv_ok,
                     workspace_bytes=_im2col_workspace, accepts_out=True)(qlinear_conv_im2col)
    latest("DynamicQuantizeMatMul", "com.microsoft").kernel(
        "cpu", priority=10, name="dynamicquantizematmul.cpu.blas",
        workspace_bytes=_gemm_workspace,
        when=lambda a, b, *r, **k: is_int8(b.dtype))(dynamic_quantize_matmul_blas)
    quant_linear.register()
