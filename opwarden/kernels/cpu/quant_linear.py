"""Fast QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and MatMulInteger, and the
exact integer GEMM on float32 BLAS the quantized kernels share.

Each computes what its reference (ops.quant) computes, in float32 where the reference's
float64 or int64 steps hold values float32 holds exactly: 8-bit values less a zero point are
integers below 2**9; x / scale is the reference's own float32 division; saturation is
fmax/fmin, which send NaN to the type's minimum as the reference's nan_to_num does.

`exact_matmul` multiplies float32 arrays holding integers with known bounds: a float32 GEMM
is exact while each partial sum stays below 2**24, so the inner dimension is cut into chunks
within that bound and the chunk products summed in float64 (see kernels.cpu.quant).
"""

from __future__ import annotations

import math

import numpy as np

from opwarden import native
from opwarden.blas import compute_threads
from opwarden.errors import KernelError
from opwarden.kernels.cpu.util import packed
from opwarden.ops.base import REGISTRY
from opwarden.ops.cast import int_range

F32 = np.float32
EXACT = 1 << 24  # float32 holds every integer up to this
_INT8 = ("uint8", "int8")
_TYPE_OF = {2: np.dtype(np.uint8), 3: np.dtype(np.int8)}  # TensorProto enum -> dtype


def latest(op_type: str, domain: str = ""):
    """The latest OpDef of a built-in operator (always registered before the kernels)."""
    opdef = REGISTRY.latest(op_type, domain)
    if opdef is None:
        raise KernelError(f"operator {domain}::{op_type} is not registered")
    return opdef


def is_int8(*dtypes) -> bool:
    """Every one of `dtypes` (names, None when unknown) is int8 or uint8."""
    return all(d in (None, *_INT8) for d in dtypes)


def span(dtype, zp) -> int:
    """The largest |v - zp| over values v of an integer `dtype` and the zero point(s) `zp`."""
    lo, hi = int_range(np.dtype(dtype))
    if zp is None:
        return int(max(-lo, hi))
    z = np.asarray(zp).astype(np.int64)
    if z.size == 0:
        return int(max(-lo, hi))
    return int(max(hi - int(z.min()), int(z.max()) - lo, 1))


def centered_f32(v: np.ndarray, zp) -> np.ndarray:
    """v - zp as a new float32 array (exact: 8-bit values and zero points)."""
    c = np.asarray(v).astype(F32)
    if zp is not None:
        z = np.asarray(zp)
        if z.size == 1:
            if int(z.reshape(-1)[0]):
                c -= F32(int(z.reshape(-1)[0]))
        else:
            c -= z.astype(F32)
    return c


def exact_matmul(a: np.ndarray, b: np.ndarray, bound_a: int, bound_b: int,
                 splits: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b of float32 arrays holding integers with |a| <= bound_a, |b| <= bound_b, exactly:
    float32 when one float32 GEMM is exact, else float64 summed over exact float32 chunks of
    the inner dimension (`splits`: chunk boundaries known exact for a weight operand, see
    `weight_splits`; else chunks of EXACT / (bound_a * bound_b)). `out`: where to write it,
    of the result's shape and dtype (float32 for one chunk, float64 for several)."""
    k = a.shape[-1]
    if splits is None:
        chunk = max(1, EXACT // max(1, bound_a * bound_b))
        splits = np.array([0, k]) if k <= chunk else \
            np.arange(0, k + chunk, chunk).clip(max=k)
    if len(splits) <= 2:
        return np.matmul(a, b, out=out)
    s, e = int(splits[0]), int(splits[1])
    first = np.matmul(a[..., s:e], b[..., s:e, :])
    if out is None:
        acc = first.astype(np.float64)
    else:
        acc = out
        acc[...] = first
    for s, e in zip(splits[1:-1], splits[2:]):
        acc += np.matmul(a[..., int(s):int(e)], b[..., int(s):int(e), :])
    return acc


def weight_splits(w: np.ndarray, k_axis: int) -> np.ndarray:
    """Boundaries of chunks along a weight's inner axis within which a float32 GEMM with any
    8-bit activation is exact: every partial sum is at most 255 * sum |w| over the chunk
    (for the worst output), kept <= 2**24. Real weights sum to far less than K * 127, so the
    chunks are 3-4x longer than the type bound's and most GEMMs run in one call."""
    aw = np.abs(np.moveaxis(w, k_axis, -1)).reshape(-1, w.shape[k_axis]).astype(np.float64)
    k = aw.shape[1]
    cs = np.zeros((aw.shape[0], k + 1))
    np.cumsum(aw, axis=1, out=cs[:, 1:])
    limit = EXACT / 255
    bounds, s = [0], 0
    while s < k:
        reach = (cs[:, s + 1:] - cs[:, s:s + 1]).max(axis=0) if cs.shape[0] else np.zeros(k - s)
        e = s + max(1, int(np.searchsorted(reach, limit, side="right")))
        bounds.append(min(e, k))
        s = bounds[-1]
    return np.asarray(bounds, np.int64)


def _finish(y: np.ndarray, z, dtype, out=None, may_nan: bool = True) -> np.ndarray:
    """saturate(rint(y) + z) as `dtype`, in four passes: y clamped to the type's range less
    the zero point (the same as clamping after rounding: the bounds are integers), rounded,
    then the zero point added straight into the integer output. With `may_nan`, NaN goes to
    the type's minimum (fmax), as the reference's nan_to_num sends it."""
    lo, hi = int_range(dtype)
    zf = F32(0) if z is None else z
    lo_b, hi_b = F32(lo) - zf, F32(hi) - zf
    if may_nan:
        np.fmax(y, lo_b, out=y)
        np.minimum(y, hi_b, out=y)
    else:
        np.clip(y, lo_b, hi_b, out=y)
    np.rint(y, out=y)
    ok = out is not None and out.shape == y.shape and out.dtype == dtype
    res = out if ok else np.empty(y.shape, dtype)
    np.add(y, zf, out=res, casting="unsafe")
    return res


def requantize_into(acc: np.ndarray, mult: np.ndarray, zy: np.ndarray, out=None,
                    bias: np.ndarray | None = None) -> np.ndarray:
    """saturate(rint(float32(acc + bias) * mult) + zy) as zy's type, the reference's float32
    requantization (acc: exact integers, float32 or float64; mult broadcasting to acc with
    at most one axis of channels; bias: integers of mult's shape, or None; the sum is exact
    in float64, |acc + bias| < 2**53). One compiled pass where the extension loaded, else
    five NumPy ones, bit for bit the same."""
    dtype = zy.dtype
    ok = out is not None and out.shape == acc.shape and out.dtype == dtype \
        and out.flags.c_contiguous and out.flags.writeable
    res = out if ok else np.empty(acc.shape, dtype)
    axis = _channel_axis(acc, mult, bias)
    if axis != -1 and native.available() and acc.flags.c_contiguous \
            and acc.dtype in (np.float32, np.float64) and dtype in (np.int8, np.uint8):
        m = np.asarray(mult, F32).reshape(-1)
        if bias is not None and m.size == 1 and axis is not None:
            m = np.repeat(m, acc.shape[axis])
        b = None if bias is None else np.asarray(bias).reshape(-1)
        return native.requantize(acc, m, b, int(zy), res, axis, compute_threads())
    if bias is not None:
        acc = acc.astype(np.float64) + np.asarray(bias).astype(np.float64)
    y = acc.astype(F32) if acc.dtype != F32 else acc
    with np.errstate(all="ignore"):
        np.multiply(y, mult, out=y)
        # a finite multiplier times finite integers is never NaN: one clip pass suffices
        return _finish(y, F32(int(zy)), dtype, res, not bool(np.isfinite(mult).all()))


def _channel_axis(acc: np.ndarray, mult: np.ndarray, bias) -> int | None:
    """The one axis of acc along which mult and bias vary (None: neither varies), -1 where
    they vary along more than one or do not broadcast (the NumPy path then)."""
    axes: set[int] = set()
    for p in (mult, bias):
        if p is None:
            continue
        p = np.asarray(p)
        if p.ndim > acc.ndim:
            return -1
        for i, d in enumerate(p.shape):
            ax = acc.ndim - p.ndim + i
            if d != 1:
                if d != acc.shape[ax]:
                    return -1
                axes.add(ax)
    if len(axes) > 1:
        return -1
    return axes.pop() if axes else None


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear


def _param(p: np.ndarray, x: np.ndarray, axis: int, what: str) -> np.ndarray:
    """A per-tensor or per-axis scale / zero point, broadcastable to x."""
    p = np.asarray(p)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    if p.ndim != 1 or x.ndim == 0:
        raise KernelError(f"{what}: scale/zero point of shape {p.shape} is neither per tensor "
                          f"nor per axis")
    ax = axis % x.ndim if -x.ndim <= axis < x.ndim else None
    if ax is None or p.shape[0] != x.shape[ax]:
        raise KernelError(f"{what}: per-axis scale/zero point of length {p.shape[0]} does not "
                          f"match axis {axis} of the {x.shape} input")
    return p.reshape([-1 if i == ax else 1 for i in range(x.ndim)])


def quantize_fast(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                  output_dtype=0, precision=0, out=None):
    """QuantizeLinear to 8 bits in float32: saturate(rint(x / scale) + zero point)."""
    what = "QuantizeLinear"
    dt = np.asarray(y_zero_point).dtype if y_zero_point is not None else _TYPE_OF.get(
        int(output_dtype or 2))
    if (dt is None or dt.name not in _INT8 or x.dtype != F32 or np.asarray(y_scale).dtype != F32
            or int(block_size or 0) or int(precision or 0) not in (0, 1)):
        # A case placement could not see (a type unknown then): the reference computes it.
        return latest(what).reference(
            x, y_scale, y_zero_point, axis=axis, saturate=saturate, block_size=block_size,
            output_dtype=output_dtype, precision=precision)
    s = _param(y_scale, x, axis, what).astype(F32)
    with np.errstate(all="ignore"):
        y = np.divide(x, s, out=np.empty(np.broadcast_shapes(x.shape, s.shape), F32))
        z = None if y_zero_point is None else _param(y_zero_point, x, axis, what).astype(F32)
        return _finish(y, z, dt, out)


def dequantize_fast(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                    out=None):
    """DequantizeLinear of 8-bit values to float32: (x - zero point) * scale."""
    what = "DequantizeLinear"
    if (x.dtype.name not in _INT8 or np.asarray(x_scale).dtype != F32 or int(block_size or 0)
            or int(output_dtype or 1) != 1):
        return latest(what).reference(x, x_scale, x_zero_point, axis=axis,
                                               block_size=block_size, output_dtype=output_dtype)
    s = _param(x_scale, x, axis, what).astype(F32)
    ok = out is not None and out.shape == x.shape and out.dtype == F32
    y = out if ok else np.empty(x.shape, F32)
    if x_zero_point is not None:
        np.subtract(x, _param(x_zero_point, x, axis, what).astype(F32), out=y, dtype=F32)
    else:
        np.copyto(y, x, casting="unsafe")
    with np.errstate(all="ignore"):
        np.multiply(y, s, out=y)
    return y


def dynamic_quantize_fast(x):
    """DynamicQuantizeLinear: the reference's scale and zero point, the quantization in
    float32."""
    x = np.asarray(x, dtype=F32)
    lo = min(F32(0), x.min()) if x.size else F32(0)
    hi = max(F32(0), x.max()) if x.size else F32(0)
    scale = F32((hi - lo) / F32(255))
    with np.errstate(all="ignore"):
        if scale == 0:  # x is all zeros (or holds NaN): the reference maps everything to 0
            return np.zeros(x.shape, np.uint8), np.asarray(scale, F32), np.asarray(0, np.uint8)
        zf = np.rint(F32(0) - lo / scale)
        zp = np.uint8(min(max(float(zf), 0.0), 255.0)) if zf == zf else np.uint8(0)
        y = np.divide(x, scale, out=np.empty(x.shape, F32))
        q = _finish(y, F32(int(zp)), np.dtype(np.uint8))
    return q, np.asarray(scale, F32), np.asarray(zp, np.uint8)


# ---------------------------------------------------------------------------------------------
# MatMulInteger


def matmul_integer_blas(A, B, a_zero_point=None, b_zero_point=None):
    """MatMulInteger on float32 BLAS: the exact int32 product of the centered operands (a
    constant B is converted once)."""
    what = "MatMulInteger"
    if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
        raise KernelError(f"{what}: this variant multiplies matrices with matching inner "
                          f"dimensions, got {A.shape} @ {B.shape}")
    za = None if a_zero_point is None else np.asarray(a_zero_point)
    if za is not None and za.size > 1:
        if za.ndim != 1 or za.shape[0] != A.shape[-2]:
            raise KernelError(f"{what}: per-row a_zero_point of shape {za.shape} does not "
                              f"match the {A.shape} input's rows")
        za = za.reshape(-1, 1)
    zb = None if b_zero_point is None else np.asarray(b_zero_point)
    if zb is not None and zb.size > 1 and (zb.ndim != 1 or zb.shape[0] != B.shape[-1]):
        raise KernelError(f"{what}: per-column b_zero_point of shape {zb.shape} does not "
                          f"match the {B.shape} input's columns")
    deps = (b_zero_point,) if isinstance(b_zero_point, np.ndarray) else ()
    if b_zero_point is None or deps:
        bf = packed(B, ("quant", "mmi"), lambda b: centered_f32(b, zb), deps)
    else:
        bf = centered_f32(B, zb)
    bound_a, bound_b = span(A.dtype, za), span(B.dtype, zb)
    acc = exact_matmul(centered_f32(A, za), bf, bound_a, bound_b)
    if A.shape[-1] * bound_a * bound_b < 1 << 31:
        return acc.astype(np.int32)
    return acc.astype(np.int64).astype(np.int32)  # wraps like 32-bit accumulation


def _mmi_ok(a, b, *zps, **attrs) -> bool:
    return (a.shape is not None and b.shape is not None and len(a.shape) >= 2
            and len(b.shape) >= 2 and is_int8(a.dtype, b.dtype))


def _q_ok(x, s, z=None, *, block_size=0, output_dtype=0, precision=0, **attrs) -> bool:
    if int(block_size or 0) or int(precision or 0) not in (0, 1):
        return False
    if z is not None and z.dtype is not None:
        out_ok = z.dtype in _INT8 and (not output_dtype or _TYPE_OF.get(int(output_dtype))
                                        == np.dtype(z.dtype))
    else:
        out_ok = int(output_dtype or 2) in _TYPE_OF
    return out_ok and x.dtype in (None, "float32") and s.dtype in (None, "float32")


def _dq_ok(x, s, z=None, *, block_size=0, output_dtype=0, **attrs) -> bool:
    return (not int(block_size or 0) and int(output_dtype or 1) == 1 and x.dtype in _INT8
            and s.dtype == "float32")


def _mmi_workspace(a_shape, b_shape=None, *rest, **attrs) -> int:
    """The float32 centered A and B, B's chunk analysis (two float64 tables), the float64
    accumulator."""
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return 0
    out = math.prod(a_shape[:-1]) * b_shape[-1]
    return 4 * math.prod(a_shape) + 20 * math.prod(b_shape) + 8 * out


def _f32_temp(x_shape, *rest, **attrs) -> int:
    """One float32 temporary of x's size."""
    return 4 * math.prod(x_shape) if x_shape is not None else 0


def register() -> None:
    """Register the float32 variants of QuantizeLinear, DequantizeLinear,
    DynamicQuantizeLinear and MatMulInteger."""
    for opdef in REGISTRY.versions("QuantizeLinear"):
        opdef.kernel("cpu", priority=10, name="quantizelinear.cpu.f32", when=_q_ok,
                     accepts_out=True, workspace_bytes=_f32_temp)(quantize_fast)
    for opdef in REGISTRY.versions("DequantizeLinear"):
        opdef.kernel("cpu", priority=10, name="dequantizelinear.cpu.f32", when=_dq_ok,
                     accepts_out=True)(dequantize_fast)
    latest("DynamicQuantizeLinear").kernel(
        "cpu", priority=10, name="dynamicquantizelinear.cpu.f32",
        workspace_bytes=_f32_temp)(dynamic_quantize_fast)
    latest("MatMulInteger").kernel(
        "cpu", priority=10, name="matmulinteger.cpu.blas", when=_mmi_ok,
        workspace_bytes=_mmi_workspace)(matmul_integer_blas)
