"""Compiled integer GEMM variants (native/qgemm.c) of QLinearConv, QLinearMatMul, QGemm,
MatMulInteger and DynamicQuantizeMatMul.

The activation is a uint8 row operand (an int8 one is shifted by 128, its zero point with it),
the weight an int8 column operand packed once into the kernel's panels (a uint8 weight is
shifted by -128 likewise: (b - zb) = ((b - 128) - (zb - 128)), both within int8 / int9 of the
int32 arithmetic). The accumulator is the exact int32 sum of (a - za)(b - zb), formed with
the zero-point corrections in wrapping int32 as a 32-bit accumulator would (qgemm.c); every
float step after it (float32(acc), the float32 scale product, rint, saturation) is the one the
NumPy variants in `quant` / `quant_linear` take, so the outputs are theirs bit for bit. Each
variant falls back to its NumPy variant for a case the kernel does not take (a per-row
activation zero point, batched weights, grouped non-depthwise convolutions, non-finite
dynamic ranges, and on AVX2 a weight whose int8 form holds -128: qgemm_avx2.c's exact products
need its negation).
"""

from __future__ import annotations

import os

import numpy as np

from opwarden import native
from opwarden.blas import compute_threads
from opwarden.errors import KernelError
from opwarden.kernels.cpu import quant
from opwarden.kernels.cpu.quant_linear import (
    _TYPE_OF,
    F32,
    _dq_ok,
    _f32_temp,
    _mmi_workspace,
    _q_ok,
    dequantize_fast,
    is_int8,
    latest,
    matmul_integer_blas,
    quantize_fast,
)
from opwarden.kernels.cpu.util import memo, packed, scratch
from opwarden.memory.constants import is_constant
from opwarden.ops.base import REGISTRY
from opwarden.ops.contrib_quant import qlinear_add_terms
from opwarden.ops.contrib_quant_nn import qgemm_finish

NR = 64  # columns per packed panel (QG_NR in native.h)
I32, F32OUT, Q8 = 0, 1, 2  # the kernel's output modes


def _lib():
    return getattr(native, "_LIB", None)


FAST_ISAS = ("avx512-vnni", "avx2")


def isa() -> str:
    """Which instruction set the compiled integer GEMM uses here (native.qgemm_isa)."""
    return native.qgemm_isa()


def running_isa() -> str:
    """The instruction set calls take now: isa() unless tests capped it (_PORTABLE)."""
    if _PORTABLE[0] == 1:
        return "portable"
    if _PORTABLE[0] == 2 and isa() == "avx512-vnni":
        return "avx2"
    return isa()


def _holds_min(w: np.ndarray) -> np.ndarray:
    """[1] if the int8 operand the kernel gets from w (uint8 shifted by -128) holds -128."""
    low = 0 if w.dtype == np.uint8 else -128
    return np.array([bool(w.size) and int(w.min()) == low], np.int8)


def avx2_refuses(w: np.ndarray, tag: str) -> bool:
    """Whether the AVX2 kernel cannot take the 8-bit operand `w` exactly (its int8 form
    holds -128, which qgemm_avx2.c's sign trick cannot negate): the caller keeps float BLAS.
    Cached for a constant `w`."""
    if running_isa() != "avx2":
        return False
    return bool(packed(w, ("qgemm-native", "holds-min", tag), _holds_min)[0])


def pack_b(b: np.ndarray) -> np.ndarray:
    """B [K, N] (int8 or uint8, any strides) as the kernel's int8 panels (uint8 shifted by
    -128), followed by the int32 column sums of the shifted values: one int8 array."""
    k, n = b.shape
    if b.dtype == np.uint8:
        bs = (b.astype(np.int16) - 128).astype(np.int8)
    else:
        bs = np.asarray(b, np.int8)
    kp, np_ = -(-k // 4) * 4, -(-n // NR) * NR
    w = np.zeros((kp, np_), np.int8)
    w[:k, :n] = bs
    panels = w.reshape(kp // 4, 4, np_ // NR, NR).transpose(2, 0, 3, 1).reshape(-1)
    colsum = bs.sum(axis=0, dtype=np.int64).astype(np.int32)
    return np.concatenate([panels, colsum.view(np.int8)])


def _packed_b(b: np.ndarray, tag: str) -> np.ndarray:
    return packed(b, ("qgemm-native", tag), pack_b)


def _zb_shifted(zb, n: int, dtype) -> np.ndarray | None:
    """B's zero points in the shifted int8 domain, one per column; None when all zero."""
    z = np.zeros(n, np.int32) if zb is None else np.broadcast_to(
        np.asarray(zb).astype(np.int32).reshape(-1), (n,)).astype(np.int32)
    if np.dtype(dtype) == np.uint8:
        z = z - 128
    return z if z.any() else None


def _rows_u8(a: np.ndarray, za: int) -> tuple[np.ndarray, int]:
    """A 2-D activation as C-contiguous uint8 rows and its zero point in that domain."""
    if a.dtype == np.int8:
        return np.ascontiguousarray(a).view(np.uint8) ^ np.uint8(0x80), za + 128
    return np.ascontiguousarray(a, np.uint8), za


def _wrap32(v: np.ndarray) -> np.ndarray:
    """int64 values modulo 2**32 as int32 (the kernel's wrapping arithmetic)."""
    return v.astype(np.uint64).astype(np.uint32).view(np.int32)


ONE, PER_COL, PER_ROW = 0, 1, 2  # how the epilogue indexes scale and bias


# Positions in _kernel_args' list of what changes from call to call.
_ARG_PANELS, _ARG_V, _ARG_OUT, _ARG_PORTABLE, _ARG_THREADS = 1, 11, 24, 26, 27


def _kernel_args(rows: np.ndarray, panels, k: int, n: int, *, swap: bool = False,
                 colc=None, rowc=None, u=None, v=None, mode: int = I32, scale=None,
                 scale_idx: int = ONE, fbias=None, ibias=None, bias_idx: int = PER_COL,
                 zy: int = 0, out_dtype=np.int32, out=None,
                 sums: np.ndarray | None = None) -> list:
    """qgemm_8bit's arguments, in its order (see _run); portable and threads are left at 0 / 1
    for the caller to set (_ARG_PORTABLE, _ARG_THREADS)."""
    nil = np.zeros(1, np.int32)
    sc = np.ascontiguousarray(scale, F32).reshape(-1) if scale is not None else np.zeros(1, F32)
    return [rows, panels, rows.shape[1], rows.shape[0], n, k,
            nil if colc is None else colc, colc is not None,
            nil if rowc is None else rowc, rowc is not None,
            nil if u is None else u, nil if v is None else v, u is not None,
            bool(swap), mode, sc, scale_idx,
            sc if fbias is None else np.ascontiguousarray(fbias, F32), fbias is not None,
            nil if ibias is None else np.ascontiguousarray(ibias, np.int32),
            ibias is not None, bias_idx, int(zy), np.dtype(out_dtype) == np.int8, out, n,
            0, 1, nil if sums is None else sums, sums is not None]


def _run(rows: np.ndarray, panels: np.ndarray, k: int, n: int, *, out_dtype=np.int32,
         out: np.ndarray | None = None, **terms) -> np.ndarray:
    """The kernel on C-contiguous 8-bit rows [M, K] and packed panels (`swap`: int8 rows,
    uint8 panels), plus the zero-point terms (_kernel_args); returns out [M, N] of out_dtype.
    `sums`: the int8 operand's int32 sums over K (per column; per row with swap) for the AVX2
    kernel, given only when that operand is known to hold no -128 (else the kernel finds
    both)."""
    lib = _lib()
    if lib is None:
        raise KernelError("the compiled integer GEMM is not available")
    m = rows.shape[0]
    if out is None or out.shape != (m, n) or out.dtype != out_dtype or not out.flags.c_contiguous:
        out = np.empty((m, n), out_dtype)
    args = _kernel_args(rows, panels, k, n, out_dtype=out_dtype, out=out, **terms)
    args[_ARG_PORTABLE], args[_ARG_THREADS] = _PORTABLE[0], compute_threads()
    _LAST_ISA[0] = lib.qgemm_8bit(*args)
    return out


def gemm(a: np.ndarray, za: int, pb: np.ndarray, k: int, n: int, zb: np.ndarray | None,
         mode: int = I32, scale: np.ndarray | None = None, fbias: np.ndarray | None = None,
         ibias: np.ndarray | None = None, zy: int = 0, out_dtype=np.int32,
         out: np.ndarray | None = None, checked: bool = False) -> np.ndarray:
    """uint8 rows `a` [M, K] (zero point za) times packed int8 `pb` (pack_b; zero points `zb`
    from _zb_shifted): sum (a - za)(b - zb) = sum a b + (K za zb - za colsum b) - zb rowsum a.
    `checked`: avx2_refuses cleared pb's operand, so the AVX2 kernel takes its column sums."""
    colsum32 = pb[pb.size - 4 * n:].view(np.int32)
    colsum = colsum32.astype(np.int64)
    zb64 = np.zeros(n, np.int64) if zb is None else zb.astype(np.int64)
    colc = _wrap32(np.int64(k) * za * zb64 - np.int64(za) * colsum) if za or zb is not None \
        else None
    u = v = None
    if zb is not None:
        u = a.sum(axis=1, dtype=np.int64).astype(np.int32)
        v = _wrap32(-zb64)
    sidx = ONE if scale is None or np.size(scale) == 1 else PER_COL
    kp = -(-k // 4) * 4
    if kp != k:  # the kernel takes whole groups of 4: zero columns add nothing to sum a b
        padded = scratch("qgemm.kpad", (a.shape[0], kp), np.uint8)
        padded[:, :k] = a
        padded[:, k:] = 0
        a = padded
    return _run(a, pb, kp, n, colc=colc, u=u, v=v, mode=mode, scale=scale, scale_idx=sidx,
                fbias=fbias, ibias=ibias, zy=zy, out_dtype=out_dtype, out=out,
                sums=colsum32 if checked else None)


# Tests set _PORTABLE to 1 to run the portable loop, to 2 to run at most AVX2, with the
# variants registered as they are (native.QGEMM_CAP: OPWARDEN_QGEMM_ISA's cap, the default).
_CAP = native.QGEMM_CAP
_PORTABLE = [1 if os.environ.get("OPWARDEN_QGEMM_PORTABLE", "0") == "1" else _CAP]
_LAST_ISA = [-1]  # the instruction set the last call ran on (qgemm_isa's codes), for tests


def _scalar_int(z) -> int | None:
    if z is None:
        return 0
    z = np.asarray(z)
    return int(z.reshape(-1)[0]) if z.size == 1 else None


# ---------------------------------------------------------------------------------------------
# Operators


def matmul_integer_native(A, B, a_zero_point=None, b_zero_point=None):
    """MatMulInteger: int32 product, 2-D B (a batched A runs as rows)."""
    za = _scalar_int(a_zero_point)
    if za is None or B.ndim != 2 or A.ndim < 2 or A.shape[-1] != B.shape[0] or not is_int8(
            A.dtype.name, B.dtype.name):
        return matmul_integer_blas(A, B, a_zero_point, b_zero_point)
    k, n = B.shape
    zbv = None if b_zero_point is None else np.asarray(b_zero_point)
    if (zbv is not None and zbv.size not in (1, n)) or avx2_refuses(B, "mmi"):
        return matmul_integer_blas(A, B, a_zero_point, b_zero_point)
    pb = _packed_b(B, "mmi") if is_constant(B) else pack_b(B)
    rows, za2 = _rows_u8(A.reshape(-1, k), za)
    y = gemm(rows, za2, pb, k, n, _zb_shifted(zbv, n, B.dtype), checked=True)
    return y.reshape(*A.shape[:-1], n)


def qlinear_matmul_native(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                          y_zero_point, out=None):
    """QLinearMatMul with a 2-D b, per-tensor a: requantized in the kernel."""
    za = _scalar_int(a_zero_point)
    zy = np.asarray(y_zero_point)
    sa, sy = np.asarray(a_scale, F32), np.asarray(y_scale, F32)
    if (za is None or b.ndim != 2 or a.ndim < 2 or a.shape[-1] != b.shape[0] or sa.size != 1
            or sy.size != 1 or zy.size != 1 or zy.dtype not in (np.uint8, np.int8)):
        return quant.qlinear_matmul_blas(a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                                         y_scale, y_zero_point, out)
    k, n = b.shape
    zbv = np.asarray(b_zero_point)
    sb = np.asarray(b_scale, F32)
    if zbv.size not in (1, n) or sb.size not in (1, n) or avx2_refuses(b, "qlmm"):
        return quant.qlinear_matmul_blas(a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                                         y_scale, y_zero_point, out)
    with np.errstate(all="ignore"):
        mult = ((sa.reshape(()) * sb.reshape(-1)) / sy.reshape(())).astype(F32)
    pb = _packed_b(b, "qlmm") if is_constant(b) else pack_b(b)
    rows, za2 = _rows_u8(a.reshape(-1, k), za)
    dst = out.reshape(-1, n) if out is not None and out.shape == (*a.shape[:-1], n) \
        and out.flags.c_contiguous else None
    y = gemm(rows, za2, pb, k, n, _zb_shifted(zbv, n, b.dtype), Q8, mult,
             zy=int(zy.reshape(-1)[0]), out_dtype=zy.dtype, out=dst, checked=True)
    return y.reshape(*a.shape[:-1], n)


def qgemm_native(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
                 y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """QGemm: the int32 product in the kernel, then ORT's bias and scaling (qgemm_finish)."""
    za = _scalar_int(a_zero_point)
    if za is None or A.ndim != 2 or B.ndim != 2:
        return quant.qgemm_blas(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C, y_scale,
                                y_zero_point, alpha=alpha, transA=transA, transB=transB)
    a = A.T if transA else A
    bb = B.T if transB else B
    k, n = bb.shape
    zbv = np.asarray(b_zero_point)
    if a.shape[1] != k or zbv.size not in (1, n) or avx2_refuses(B, "qgemm"):
        return quant.qgemm_blas(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C, y_scale,
                                y_zero_point, alpha=alpha, transA=transA, transB=transB)
    pb = packed(B, ("qgemm-native", f"qgemm{transB}"), lambda w: pack_b(w.T if transB else w))
    rows, za2 = _rows_u8(a, za)
    acc = gemm(rows, za2, pb, k, n, _zb_shifted(zbv, n, B.dtype), checked=True)
    return qgemm_finish(acc.astype(np.int64), C, a_scale, b_scale, y_scale, y_zero_point,
                        alpha)


def dynamic_quantize_matmul_native(A, B, b_scale, b_zero_point=None, bias=None, out=None):
    """DynamicQuantizeMatMul: A quantized to uint8 as the NumPy variant does, the product and
    the float32 rescale and bias in the kernel (straight into `out`, the planned buffer: a
    fresh [M, N] float32 result is page-faulted in on every call)."""
    a = np.asarray(A, F32)
    n = B.shape[-1] if B.ndim else 1
    bs = np.asarray(b_scale, F32)
    zbv = None if b_zero_point is None else np.asarray(b_zero_point)
    fall = (a.ndim < 2 or B.ndim != 2 or a.shape[-1] != B.shape[0] or bs.size not in (1, n)
            or (zbv is not None and (zbv.ndim > 1 or zbv.size not in (1, n)))
            or (bias is not None and np.asarray(bias).shape != (n,)) or a.size == 0
            or avx2_refuses(B, "dqmm"))
    lo = min(F32(a.min()), F32(0)) if not fall else F32(0)
    hi = max(F32(a.max()), F32(0)) if not fall else F32(0)
    if fall or not (np.isfinite(lo) and np.isfinite(hi)):
        return quant.dynamic_quantize_matmul_blas(A, B, b_scale, b_zero_point, bias)
    k = B.shape[0]
    with np.errstate(all="ignore"):
        scale = F32(1) if hi == lo else F32(F32(hi - lo) / F32(255))
        zp = int(np.rint(min(max(F32(F32(0) - F32(lo / scale)), F32(0)), F32(255))))
        # saturate(rint(a / scale) + zp) in one pass: the NumPy variant's float steps
        ac = np.ascontiguousarray(a).reshape(-1)
        rows = scratch("qgemm.rows", (a.size // k, k), np.uint8)
        _lib().quantize_8bit(ac, rows.reshape(-1), 0, ac.size, scale, zp, False, True)
        mult = (F32(scale) * (bs.reshape(()) if bs.size == 1 else bs.reshape(-1))).astype(F32)
    pb = _packed_b(B, "dqmm") if is_constant(B) else pack_b(B)
    fb = None if bias is None else np.asarray(bias).astype(F32)
    shape = (*a.shape[:-1], n)
    dst = out.reshape(-1, n) if out is not None and out.shape == shape and out.dtype == F32 \
        and out.flags.c_contiguous else None
    y = gemm(rows, zp, pb, k, n, _zb_shifted(zbv, n, B.dtype), F32OUT, mult, fbias=fb,
             out_dtype=F32, out=dst, checked=True)
    return y.reshape(shape)


def qlinear_conv_native(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                        y_zero_point, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None, out=None):
    """2-D QLinearConv (group 1), per image: the weight's int8 rows (output channels) times
    the input's uint8 im2col columns (pixels; padded with the input's zero point, so padding
    reads as zero), packed in C, requantized in the kernel straight into NCHW. Everything but
    the image is worked out once per input kind and parameters (_QConvPlan, cached with a
    constant weight): per call only the padding, the packing and the GEMM run."""
    attrs = (auto_pad, _tup(dilations), group, _tup(kernel_shape), _tup(pads), _tup(strides))
    params = (x_scale, x_zero_point, w_scale, w_zero_point, y_scale, y_zero_point, B)
    deps = tuple(v for v in params if isinstance(v, np.ndarray))
    tag = ("qgemm-native", "qconv-plan", x.shape, x.dtype.str, running_isa(), attrs,
           *(None if isinstance(v, np.ndarray) else v for v in params))
    plan = memo(w, tag, lambda _: _QConvPlan.make(x, w, params, attrs), deps)
    if plan.fallback:
        return quant.qlinear_conv_im2col(
            x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B,
            auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
            pads=pads, strides=strides, out=out)
    return plan.run(x, out)


def _tup(v):
    return None if v is None else tuple(int(e) for e in v)


class _QConvPlan:
    """One QLinearConv's geometry, packed weight rows, zero-point terms and kernel arguments
    for one input kind; `fallback` where the compiled kernel does not take it."""

    fallback = False

    @classmethod
    def make(cls, x, w, params, attrs) -> _QConvPlan:
        x_scale, x_zero_point, w_scale, w_zero_point, y_scale, y_zero_point, B = params
        auto_pad, dilations, group, kernel_shape, pads, strides = attrs
        what = "QLinearConv"
        plan = cls()
        zy = np.asarray(y_zero_point)
        xz = _scalar_int(x_zero_point)
        if (x.ndim != 4 or w.ndim != 4 or group != 1 or xz is None or zy.size != 1
                or zy.dtype not in (np.uint8, np.int8) or np.asarray(x_scale).size != 1
                or np.asarray(y_scale).size != 1 or avx2_refuses(w, "qconv")):
            plan.fallback = True
            return plan
        m, cg, kh, kw = w.shape
        s, d, begin, end, _, oh, ow = quant._conv_geometry(
            x, w, auto_pad, dilations, kernel_shape, pads, strides, group, what)
        wz = None if w_zero_point is None else np.asarray(w_zero_point)
        sw = np.asarray(w_scale, F32)
        if (wz is not None and wz.size not in (1, m)) or sw.size not in (1, m):
            raise KernelError(f"{what}: w_zero_point / w_scale of shapes "
                              f"{None if wz is None else wz.shape} / {sw.shape} do not match "
                              f"{m} output channels")
        bias = None
        if B is not None:
            bias = np.asarray(B)
            if bias.shape != (m,):
                raise KernelError(f"{what}: bias B must have shape ({m},), got {bias.shape}")
            bias = np.ascontiguousarray(bias, np.int32)
        kk = cg * kh * kw
        plan.signed = x.dtype == np.int8
        if plan.signed:  # shifted to uint8 before padding so that the pad value shifts too
            xz += 128
        plan.xz, plan.begin, plan.end = xz, begin, end
        plan.padded = bool(any(begin) or any(end))
        wrows = packed(w, ("qgemm-native", "qconv-rows"), _conv_rows)
        kp = -(-kk // 4) * 4
        terms = _conv_terms(wrows, m, kk, kp, w.dtype, xz, wz, sw, x_scale, y_scale)
        has_rowc, plan.has_zw = bool(terms[0]), bool(terms[1])
        rowc, zw32 = terms[2:2 + m], terms[2 + m:2 + 2 * m]
        mult = np.ascontiguousarray(terms[2 + 2 * m:].view(F32))
        plan.pix = pix = oh * ow
        plan.shape = (x.shape[0], m, oh, ow)
        plan.dtype = zy.dtype
        plan.panel_bytes = -(-pix // NR) * (-(-kk // 4)) * NR * 4
        plan.pack = (cg, kh, kw, s[0], s[1], d[0], d[1], oh, ow)
        # (panels, v, out, portable and threads are set per call)
        plan.args = _kernel_args(
            wrows[:m * kp].reshape(m, kp), None, kp, pix, swap=True,
            rowc=rowc if has_rowc else None, u=zw32 if plan.has_zw else None, mode=Q8,
            scale=mult, scale_idx=PER_ROW, ibias=bias, bias_idx=PER_ROW,
            zy=int(zy.reshape(-1)[0]), out_dtype=zy.dtype,
            sums=wrows[m * kp:].view(np.int32))  # (avx2_refuses cleared w)
        return plan

    def run(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        xs = x.view(np.uint8) ^ np.uint8(0x80) if self.signed else x
        if self.padded:
            xs = _pad(xs, self.begin, self.end, self.xz)
        xs = np.ascontiguousarray(xs)
        ok = out is not None and out.shape == self.shape and out.dtype == self.dtype and \
            out.flags.c_contiguous
        y = out if ok else np.empty(self.shape, self.dtype)
        # (scratch: fresh buffers of this size are page-faulted in on every call)
        panels = scratch("qconv.panels", (self.panel_bytes,), np.uint8)
        colsum = scratch("qconv.colsum", (self.pix,), np.int32)
        lib = _lib()
        hp, wp = xs.shape[2:]
        threads = compute_threads()
        args = list(self.args)
        args[_ARG_PANELS], args[_ARG_PORTABLE], args[_ARG_THREADS] = \
            panels, _PORTABLE[0], threads
        m = self.shape[1]
        for b in range(self.shape[0]):
            lib.qg_pack_im2col(xs[b], self.pack[0], hp, wp, *self.pack[1:], panels, colsum,
                               self.has_zw, threads)
            if self.has_zw:
                args[_ARG_V] = _wrap32(-colsum.astype(np.int64))
            args[_ARG_OUT] = y[b].reshape(m, self.pix)
            _LAST_ISA[0] = lib.qgemm_8bit(*args)
        return y


def _pad(x: np.ndarray, begin, end, value: int) -> np.ndarray:
    """x [N, C, H, W] padded by `value` (np.pad's result, at a fraction of its call cost:
    this runs for every padded convolution), in this thread's scratch."""
    n, c, h, w = x.shape
    (t, l), (b, r) = begin, end
    y = scratch("qconv.pad", (n, c, h + t + b, w + l + r), x.dtype)
    y[:, :, :t] = value
    y[:, :, t + h:] = value
    y[:, :, t:t + h, :l] = value
    y[:, :, t:t + h, l + w:] = value
    y[:, :, t:t + h, l:l + w] = x
    return y


def _conv_terms(wrows, m, kk, kp, wdtype, xz, wz, sw, x_scale, y_scale) -> np.ndarray:
    """The per-output-channel terms of a convolution, computed once for constant parameters:
    int32 [has rowc, has zw, rowc (m), zw (m), the float32 multiplier's bits (m)], rowc =
    K zw xz - xz rowsum(w) in wrapping int32 (the expansion of sum (w - zw)(x - xz))."""
    rs = wrows[m * kp:].view(np.int32).astype(np.int64)
    zw = np.zeros(m, np.int64) if wz is None else np.broadcast_to(
        wz.astype(np.int64).reshape(-1), (m,)).astype(np.int64)
    if wdtype == np.uint8:
        zw = zw - 128
    rowc = _wrap32(np.int64(kk) * zw * xz - np.int64(xz) * rs)
    sx, sy = np.asarray(x_scale, F32).reshape(()), np.asarray(y_scale, F32).reshape(())
    with np.errstate(all="ignore"):
        mult = ((sx * (sw.reshape(-1) if sw.size > 1 else sw.reshape(()))) / sy).astype(F32)
    mult = np.broadcast_to(mult, (m,)).astype(F32)
    head = np.array([int(bool(xz) or bool(zw.any())), int(bool(zw.any()))], np.int32)
    return np.concatenate([head, rowc, _wrap32(zw), mult.view(np.int32)])


def _conv_rows(w: np.ndarray) -> np.ndarray:
    """A convolution weight [M, C, kh, kw] as int8 rows [M, C kh kw rounded up to 4] (uint8
    shifted by -128, zero-padded) followed by the int32 row sums: one int8 array."""
    r = w.reshape(w.shape[0], -1)
    r8 = (r.astype(np.int16) - 128).astype(np.int8) if w.dtype == np.uint8 else r.astype(np.int8)
    rs = r8.sum(axis=1, dtype=np.int64).astype(np.int32)
    kp = -(-r.shape[1] // 4) * 4  # rows zero-padded to whole groups of 4 taps
    rows = np.zeros((r.shape[0], kp), np.int8)
    rows[:, :r.shape[1]] = r8
    return np.concatenate([rows.reshape(-1), rs.view(np.int8)])


def _per_tensor(s, z) -> tuple[float, int] | None:
    """(scale, zero point) of a float32 per-tensor pair, None otherwise."""
    sa = np.asarray(s)
    if sa.dtype != F32 or sa.size != 1 or sa.ndim > 1:
        return None
    if z is None:
        return float(sa.reshape(-1)[0]), 0
    za = np.asarray(z)
    if za.size != 1 or za.ndim > 1:
        return None
    return float(sa.reshape(-1)[0]), int(za.reshape(-1)[0])


def quantize_native(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0, out=None):
    """Per-tensor QuantizeLinear of float32 to 8 bits in one compiled pass."""
    dt = np.asarray(y_zero_point).dtype if y_zero_point is not None else _TYPE_OF.get(
        int(output_dtype or 2))
    st = _per_tensor(y_scale, y_zero_point)
    if (st is None or dt is None or dt.name not in ("uint8", "int8") or x.dtype != F32
            or int(block_size or 0) or int(precision or 0) not in (0, 1)):
        return quantize_fast(x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                             block_size=block_size, output_dtype=output_dtype,
                             precision=precision, out=out)
    xc = np.ascontiguousarray(x)
    ok = out is not None and out.shape == x.shape and out.dtype == dt and out.flags.c_contiguous
    y = out if ok else np.empty(x.shape, dt)
    _lib().quantize_8bit(xc.reshape(-1), y.reshape(-1), 0, xc.size, F32(st[0]), st[1],
                         dt == np.int8, True)
    return y


def dequantize_native(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                      out=None):
    """Per-tensor DequantizeLinear of 8 bits to float32 in one compiled pass."""
    st = _per_tensor(x_scale, x_zero_point)
    if (st is None or x.dtype.name not in ("uint8", "int8") or int(block_size or 0)
            or int(output_dtype or 1) != 1):
        return dequantize_fast(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                               output_dtype=output_dtype, out=out)
    xc = np.ascontiguousarray(x)
    ok = out is not None and out.shape == x.shape and out.dtype == F32 and out.flags.c_contiguous
    y = out if ok else np.empty(x.shape, F32)
    _lib().quantize_8bit(xc.reshape(-1), y.reshape(-1), 0, xc.size, F32(st[0]), st[1],
                         x.dtype == np.int8, False)
    return y


def qlinear_add_native(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
                       C_zero_point=None, out=None):
    """com.microsoft QLinearAdd of same-shape operands in one compiled pass, the reference's
    float steps (ops.contrib_quant.QLinearAdd); other shapes and non-finite ratios run the
    reference."""
    ref = latest("QLinearAdd", "com.microsoft").reference
    if (A.shape != B.shape or A.dtype != B.dtype or A.dtype not in (np.uint8, np.int8)
            or A.size == 0):
        return ref(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
    x, rx, y, ry, fixed = qlinear_add_terms(A, A_scale, A_zero_point, B, B_scale,
                                            B_zero_point, C_scale, C_zero_point)
    if not (np.isfinite(rx) and np.isfinite(ry) and np.isfinite(fixed)):
        return ref(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
    xc, yc = np.ascontiguousarray(x), np.ascontiguousarray(y)
    # (the planned buffer: a fresh one is page-faulted in on every call; element i reads only
    # x[i] and y[i], so even a buffer shared with an operand is safe)
    ok = out is not None and out.shape == A.shape and out.dtype == A.dtype and \
        out.flags.c_contiguous
    y8 = out if ok else np.empty(A.shape, A.dtype)
    _lib().qlinear_add(xc.reshape(-1), yc.reshape(-1), y8.reshape(-1), y8.size, rx, ry,
                       fixed, A.dtype == np.int8)
    return y8


def _conv_ok(x, *rest, group=1, **attrs) -> bool:
    return quant._conv_ok(x, *rest, **attrs) and x.shape is not None and len(x.shape) == 4 \
        and int(group or 1) == 1


def register() -> None:
    """Register the compiled variants above their NumPy ones, where the extension loaded (the
    integer GEMM ones where it runs on AVX512-VNNI or AVX2)."""
    if not native.available() or _lib() is None or not hasattr(_lib(), "qgemm_8bit"):
        return
    for opdef in REGISTRY.versions("QuantizeLinear"):
        opdef.kernel("cpu", priority=20, name="quantizelinear.cpu.native", when=_q_ok,
                     accepts_out=True, workspace_bytes=_f32_temp)(quantize_native)
    for opdef in REGISTRY.versions("DequantizeLinear"):
        opdef.kernel("cpu", priority=20, name="dequantizelinear.cpu.native", when=_dq_ok,
                     accepts_out=True)(dequantize_native)
    latest("QLinearAdd", "com.microsoft").kernel(
        "cpu", priority=20, name="qlinearadd.cpu.native", accepts_out=True,
        when=lambda a, sa, za, b, *r, **k: a.shape is not None and a.shape == b.shape)(
        qlinear_add_native)
    if isa() not in FAST_ISAS:
        # The portable loop is the reference for the kernel's arithmetic, not a fast path:
        # 6-10x slower than the float-BLAS variants, which keep these operators here.
        return
    latest("MatMulInteger").kernel(
        "cpu", priority=20, name="matmulinteger.cpu.native_u8s8",
        when=lambda a, b, *r, **k: quant_linear_mmi_ok(a, b) and len(b.shape) == 2,
        workspace_bytes=_mmi_workspace)(matmul_integer_native)
    for opdef in REGISTRY.versions("QLinearMatMul"):
        opdef.kernel("cpu", priority=20, name="qlinearmatmul.cpu.native_u8s8",
                     when=lambda a, *r, **k: quant._matmul_ok(a, *r, **k) and len(r[2].shape)
                     == 2, accepts_out=True,
                     workspace_bytes=quant._gemm_workspace)(qlinear_matmul_native)
    for opdef in REGISTRY.versions("QLinearConv"):
        opdef.kernel("cpu", priority=20, name="qlinearconv.cpu.native_u8s8", when=_conv_ok,
                     workspace_bytes=quant._im2col_workspace,
                     accepts_out=True)(qlinear_conv_native)
    latest("QGemm", "com.microsoft").kernel(
        "cpu", priority=20, name="qgemm.cpu.native_u8s8", workspace_bytes=quant._gemm_workspace,
        when=lambda a, *r, **k: a.shape is not None and len(a.shape) == 2)(qgemm_native)
    latest("DynamicQuantizeMatMul", "com.microsoft").kernel(
        "cpu", priority=20, name="dynamicquantizematmul.cpu.native_u8s8",
        workspace_bytes=quant._gemm_workspace, accepts_out=True,
        when=lambda a, b, *r, **k: is_int8(b.dtype) and b.shape is not None
        and len(b.shape) == 2)(dynamic_quantize_matmul_native)


def quant_linear_mmi_ok(a, b) -> bool:
    return a.shape is not None and b.shape is not None and len(a.shape) >= 2 and is_int8(
        a.dtype, b.dtype)
