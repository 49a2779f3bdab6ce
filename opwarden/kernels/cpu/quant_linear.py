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


def exact_matmul(a: np.ndarray, b: np.ndarray, bound_a: int, bound_b: int) -> np.ndarray:
    """a @ b of float32 arrays holding integers with |a| <= bound_a, |b| <= bound_b, exactly:
    float32 when one float32 GEMM is exact, else float64 summed over exact float32 chunks."""
    k = a.shape[-1]
    chunk = max(1, EXACT // max(1, bound_a * bound_b))
    if k <= chunk:
        return np.matmul(a, b)
    acc = np.matmul(a[..., :chunk], b[..., :chunk, :]).astype(np.float64)
    for s in range(chunk, k, chunk):
        acc += np.matmul(a[..., s:s + chunk], b[..., s:s + chunk, :])
    return acc


def _saturate_f32(y: np.ndarray, dtype) -> np.ndarray:
    lo, hi = int_range(dtype)
    np.fmax(y, F32(lo), out=y)
    np.fmin(y, F32(hi), out=y)
    return y


def _into(y: np.ndarray, dtype, out) -> np.ndarray:
    if out is not None and out.shape == y.shape and out.dtype == dtype:
        np.copyto(out, y, casting="unsafe")
        return out
    return y.astype(dtype)


def requantize_into(acc: np.ndarray, mult: np.ndarray, zy: np.ndarray, out=None) -> np.ndarray:
    """saturate(rint(float32(acc) * mult) + zy) as zy's type, the reference's float32
    requantization (acc: exact integers, float32 or float64)."""
    y = acc.astype(F32) if acc.dtype != F32 else acc
    with np.errstate(all="ignore"):
        np.multiply(y, mult, out=y)
        np.rint(y, out=y)
        z = int(zy)
        if z:
            y += F32(z)
    return _into(_saturate_f32(y, zy.dtype), zy.dtype, out)


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
        np.rint(y, out=y)
        if y_zero_point is not None:
            y += _param(y_zero_point, x, axis, what).astype(F32)
    return _into(_saturate_f32(y, dt), dt, out)


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
        np.rint(y, out=y)
        y += F32(int(zp))
    return _into(_saturate_f32(y, np.uint8), np.uint8, None), np.asarray(scale, F32), \
        np.asarray(zp, np.uint8)


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
        "cpu", priority=10, name="matmulinteger.cpu.blas", when=_mmi_ok)(matmul_integer_blas)
