"""Integer GEMM and convolution for QGemm, QLinearMatMul and QLinearConv through float BLAS.

The operands, less their zero points, are integers of at most 9 bits (|v| <= 255). A float
GEMM of such integers is exact while every partial sum is an integer the float type holds
exactly: |sum| <= K * 255 * 255, so float32 (24-bit mantissa) is exact for K <= 258 and
float64 (53 bits) for K < 1.3e11. These kernels pick float32 up to that bound and float64
beyond, so the int32 accumulator they produce equals the reference's exact integer one; the
requantization that follows is the reference's own float32 arithmetic.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opwarden.errors import KernelError
from opwarden.ops.base import REGISTRY
from opwarden.ops.cast import int_range
from opwarden.ops.contrib_quant_nn import qgemm_finish
from opwarden.ops.conv import conv_pads

# Largest K for which a float32 dot product of values in [-255, 255] stays exact.
F32_EXACT_K = (1 << 24) // (255 * 255)


def exact_float(k: int) -> type:
    """The narrowest float type whose GEMM over an inner dimension `k` is exact."""
    return np.float32 if k <= F32_EXACT_K else np.float64


def _centered(x: np.ndarray, zp, ft) -> np.ndarray:
    c = x.astype(ft)
    if zp is not None:
        z = np.asarray(zp)
        if z.size == 1:
            c -= ft(int(z.reshape(-1)[0]))
        else:
            c -= z.astype(ft)
    return c


def _int_acc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact int64 a @ b of float-held integers."""
    return np.matmul(a, b).astype(np.int64)


def _saturate(v: np.ndarray, dtype) -> np.ndarray:
    lo, hi = int_range(dtype)
    return np.clip(np.nan_to_num(v, nan=float(lo)), lo, hi).astype(np.int64).astype(dtype)


def qgemm_blas(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
               y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """QGemm with the integer product on float BLAS (exact; see the module docstring)."""
    if A.ndim != 2 or B.ndim != 2:
        raise KernelError(f"QGemm: A and B must be 2-D, got shapes {A.shape} and {B.shape}")
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise KernelError(f"QGemm: inner dimensions differ: A' is {a.shape}, B' is {b.shape}")
    zb = np.asarray(b_zero_point)
    if zb.size not in (1, b.shape[1]):
        raise KernelError(f"QGemm: b_zero_point must be a scalar or have {b.shape[1]} entries, "
                          f"got shape {zb.shape}")
    ft = exact_float(a.shape[1])
    acc = _int_acc(_centered(a, a_zero_point, ft), _centered(b, zb.reshape(-1), ft))
    return qgemm_finish(acc, C, a_scale, b_scale, y_scale, y_zero_point, alpha)


def _per_row_or_tensor(p, rows: int, what: str) -> np.ndarray:
    p = np.asarray(p)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    if p.ndim == 1 and p.shape[0] == rows:
        return p.reshape(-1, 1)
    raise KernelError(f"{what}: parameter of shape {p.shape} is neither per tensor nor per row")


def qlinear_matmul_blas(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                        y_zero_point):
    """QLinearMatMul (2-D operands) with the integer product on float BLAS."""
    what = "QLinearMatMul"
    if a.shape[1] != b.shape[0]:
        raise KernelError(f"{what}: inner dimensions differ: {a.shape} @ {b.shape}")
    ft = exact_float(a.shape[1])
    za = _per_row_or_tensor(a_zero_point, a.shape[0], what)
    zb = np.asarray(b_zero_point)
    acc = _int_acc(a.astype(ft) - za.astype(ft), b.astype(ft) - zb.astype(ft).reshape(
        zb.shape if zb.size > 1 else ()))
    sa = _per_row_or_tensor(a_scale, a.shape[0], what).astype(np.float32)
    sb = np.asarray(b_scale, np.float32)
    sb = sb.reshape(()) if sb.size == 1 else sb
    sy = np.asarray(y_scale, np.float32).reshape(())
    with np.errstate(all="ignore"):
        y = np.rint(acc.astype(np.float32) * ((sa * sb) / sy)).astype(np.float64)
    zy = np.asarray(y_zero_point)
    return _saturate(y + float(zy.reshape(-1)[0]), zy.dtype)


def _is_2d(a, *rest, **attrs) -> bool:
    return a.shape is not None and len(a.shape) == 2


def _matmul_2d(a, sa, za, b, *rest, **attrs) -> bool:
    return (a.shape is not None and b.shape is not None and len(a.shape) == 2
            and len(b.shape) == 2)


def qlinear_conv_im2col(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                        y_zero_point, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None):
    """2-D QLinearConv as im2col windows times the weights on float BLAS (exact)."""
    what = "QLinearConv"
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(f"{what}: this variant runs 2-D convolutions, got {x.shape}, {w.shape}")
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
    ft = exact_float(cg * kh * kw)
    xz = np.asarray(x_zero_point).reshape(-1)[0] if x_zero_point is not None else 0
    xc = x.astype(ft) - ft(int(xz))
    xp = np.pad(xc, [(0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])])
    ext = [d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1]
    if xp.shape[2] < ext[0] or xp.shape[3] < ext[1]:
        raise KernelError(f"{what}: dilated kernel {ext} exceeds the padded input {xp.shape[2:]}")
    win = sliding_window_view(xp, ext, axis=(2, 3))[:, :, ::s[0], ::s[1], ::d[0], ::d[1]]
    oh, ow = win.shape[2:4]
    wc = w.astype(ft)
    if w_zero_point is not None:
        wz = np.asarray(w_zero_point)
        wc -= wz.astype(ft).reshape(-1, 1, 1, 1) if wz.size > 1 else ft(int(wz.reshape(-1)[0]))
    mg = m // group
    acc = np.empty((n, oh, ow, m), np.int64)
    for g in range(group):
        cols = win[:, g * cg:(g + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, -1)
        wg = wc[g * mg:(g + 1) * mg].reshape(mg, -1)
        acc[..., g * mg:(g + 1) * mg] = _int_acc(cols, wg.T).reshape(n, oh, ow, mg)
    acc = acc.transpose(0, 3, 1, 2)
    if B is not None:
        bias = np.asarray(B)
        if bias.shape != (m,):
            raise KernelError(f"{what}: bias B must have shape ({m},), got {bias.shape}")
        acc = acc + bias.astype(np.int64).reshape(m, 1, 1)
    sx = np.asarray(x_scale, np.float32).reshape(())
    sw = np.asarray(w_scale, np.float32)
    sw = sw.reshape(-1, 1, 1) if sw.size > 1 else sw.reshape(())
    sy = np.asarray(y_scale, np.float32).reshape(())
    zy = np.asarray(y_zero_point)
    with np.errstate(all="ignore"):
        y = np.rint(acc.astype(np.float32) * ((sx * sw) / sy)).astype(np.float64)
    return _saturate(y + float(zy.reshape(-1)[0]), zy.dtype)


def _conv_2d(x, *rest, **attrs) -> bool:
    w = rest[2] if len(rest) > 2 else None
    return (x.shape is not None and len(x.shape) == 4 and w is not None
            and w.shape is not None and len(w.shape) == 4)


def _im2col_workspace(x_shape, xs=None, xz=None, w_shape=None, *rest, **attrs) -> int:
    """The float64 padded input and windows, the float64 weights, the int64 accumulator
    (twice: computed, then biased) per output element (upper bound: stride 1)."""
    if x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return 0
    n, c, h, w = x_shape
    m, cg, kh, kw = w_shape
    pad_h, pad_w = h + 2 * kh, w + 2 * kw
    cols = n * pad_h * pad_w * cg * kh * kw
    return 8 * (n * c * pad_h * pad_w + cols + m * cg * kh * kw + 3 * n * m * pad_h * pad_w)


def register() -> None:
    """Register the BLAS variants of QGemm, QLinearMatMul and QLinearConv."""
    REGISTRY.latest("QGemm", "com.microsoft").kernel(
        "cpu", priority=10, name="qgemm.cpu.blas", when=_is_2d)(qgemm_blas)
    for opdef in REGISTRY.versions("QLinearMatMul"):
        opdef.kernel("cpu", priority=10, name="qlinearmatmul.cpu.blas",
                     when=_matmul_2d)(qlinear_matmul_blas)
    for opdef in REGISTRY.versions("QLinearConv"):
        opdef.kernel("cpu", priority=10, name="qlinearconv.cpu.im2col", when=_conv_2d,
                     workspace_bytes=_im2col_workspace)(qlinear_conv_im2col)
