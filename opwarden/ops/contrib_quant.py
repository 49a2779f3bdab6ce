"""Operators: quantized com.microsoft operators (the QOperator format of ORT's quantizer).

QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearConcat,
QLinearAveragePool, QLinearGlobalAveragePool, QGemm, QLinearConv (channels_last) and the
com.microsoft QuantizeLinear / DequantizeLinear, as ONNX Runtime documents them
(ContribOperators.md) and computes them on x86 CPUs.

Each reference kernel follows the arithmetic of ORT's CPU kernel so that results agree bit for
bit, not just within a quantization step:

- QLinearAdd runs in float32 with fused multiply-adds: with rX = sX / sC and the first operand
  X (A, or B when A is the broadcast scalar of the innermost span), y = rint(fma(x, rX,
  fma(y, rY, zC - fma(rX, zX, rY * zY)))). FMAs are evaluated in float64 and rounded once to
  float32; that equals a true FMA unless an addend is 2^21 times smaller than the other.
- QLinearMul: the exact integer product (a - zA)(b - zB) times float32(sA * sB / sC), plus zC.
- QLinearSigmoid / QLinearLeakyRelu: a 256-entry lookup table built from the dequantized input
  values; Sigmoid uses MLAS's rational logistic approximation (Eigen's coefficients), whose
  polynomial FMAs are emulated as above, so a table entry can differ by one step only when a
  value lies within one float32 ulp of a rounding boundary.
- QLinearSoftmax: ORT's float32 exp table and its quirks (y_scale used as floor(1 / y_scale),
  x_zero_point ignored, a sequential float32 row sum, the ratio in float64, a NaN ratio -> 0).
- QLinearAveragePool: dequantized float32 windows summed in row-major kernel order, divided by
  the count, y = rint(avg / y_scale + y_zero_point); a window covering the whole unpadded image
  takes the integer global-average path, as in ORT.
- QLinearGlobalAveragePool: an exact int32 sum, times float32 x_scale / (y_scale * size).
- QGemm: exact int32 accumulation (+ C), times float32 alpha * a_scale * b_scale [/ y_scale].

Rounding is round-half-to-even throughout; results saturate to the output type's range.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from opwarden.contract import Contract, TensorFact
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.cast import int_range
from opwarden.ops.common import broadcast_shapes

MS = "com.microsoft"
Q8 = ["uint8", "int8"]
F32 = np.float32
_F = ["tensor(float)"]


# ---------------------------------------------------------------------------------------------
# Shared arithmetic
# ---------------------------------------------------------------------------------------------


def fma32(x, y, z) -> np.ndarray:
    """float32 x * y + z rounded once (through float64; exact for the operands used here)."""
    r = np.asarray(x, np.float64) * np.asarray(y, np.float64) + np.asarray(z, np.float64)
    return r.astype(F32)


def scalar_param(p, what: str, name: str, dtype=None):
    """A per-tensor scale or zero point as a NumPy scalar (0 of `dtype` when omitted)."""
    if p is None:
        if dtype is None:
            raise KernelError(f"{what}: input {name} is required")
        return np.dtype(dtype).type(0)
    p = np.asarray(p)
    if p.size != 1 or p.ndim > 1:
        raise KernelError(f"{what}: {name} must be a scalar or a 1-element 1-D tensor, "
                          f"got shape {p.shape}")
    if dtype is not None and p.dtype != np.dtype(dtype):
        raise KernelError(f"{what}: {name} has type {p.dtype}, expected {np.dtype(dtype)}")
    return p.reshape(())[()]


def saturate(v: np.ndarray, dtype) -> np.ndarray:
    """Integral float values clipped to `dtype`'s range and converted."""
    lo, hi = int_range(dtype)
    v = np.clip(np.nan_to_num(np.asarray(v, np.float64), nan=float(lo)), lo, hi)
    return v.astype(np.int64).astype(dtype)


def _same_dtype(x: np.ndarray, dtype, what: str, name: str) -> None:
    if x.dtype != dtype:
        raise KernelError(f"{what}: {name} has type {x.dtype}, expected {np.dtype(dtype)} "
                          "(the type of the first quantized input)")


def _quantize_table(values: np.ndarray, y_scale, y_zp, dtype) -> np.ndarray:
    """MLAS's QuantizeLinear of float32 values: rint(v / scale) + zero point, saturated."""
    with np.errstate(all="ignore"):
        q = np.rint(values.astype(F32) / F32(y_scale)).astype(np.float64) + float(y_zp)
    return saturate(q, dtype)


def _all_values(dtype) -> np.ndarray:
    """The 256 values of an 8-bit type, indexed by their bit pattern."""
    return np.arange(256, dtype=np.uint8).view(dtype)


def _lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[x.view(np.uint8)]


def _broadcast_out(a: np.ndarray, b: np.ndarray, what: str) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise KernelError(f"{what}: shapes {a.shape} and {b.shape} do not broadcast") from None


def first_is_scalar_span(a_shape, b_shape) -> bool:
    """Whether ORT's broadcaster treats A as the scalar of each innermost span (it then runs
    the kernel with B as the first operand)."""
    if math.prod(a_shape) == 1:
        return True
    if math.prod(b_shape) == 1:
        return False
    out = np.broadcast_shapes(a_shape, b_shape)
    a = (1,) * (len(out) - len(a_shape)) + tuple(a_shape)
    b = (1,) * (len(out) - len(b_shape)) + tuple(b_shape)
    for da, db, do in zip(reversed(a), reversed(b), reversed(out)):
        if do == 1:
            continue
        return da == 1 and db != 1
    return False


# ---------------------------------------------------------------------------------------------
# Elementwise binary: QLinearAdd, QLinearMul
# ---------------------------------------------------------------------------------------------

_BINARY_IO = dict(
    inputs=["A: T", "A_scale: tensor(float)", "A_zero_point?: T", "B: T",
            "B_scale: tensor(float)", "B_zero_point?: T", "C_scale: tensor(float)",
            "C_zero_point?: T"],
    outputs=["C: T"], types={"T": Q8})
_BINARY = Contract(nan="none", overflow="saturate", broadcast="multidirectional")


def binary_params(A, B, sa, za, sb, zb, sc, zc, what):
    _same_dtype(B, A.dtype, what, "B")
    dt = A.dtype
    return (F32(scalar_param(sa, what, "A_scale")), int(scalar_param(za, what, "A_zero_point", dt)),
            F32(scalar_param(sb, what, "B_scale")), int(scalar_param(zb, what, "B_zero_point", dt)),
            F32(scalar_param(sc, what, "C_scale")), int(scalar_param(zc, what, "C_zero_point", dt)))


def qlinear_add_terms(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
                      C_zero_point):
    """(x, rx, y, ry, fixed) with QLinearAdd = saturate(rint(fma(x, rx, fma(y, ry, fixed)))):
    the operands in ORT's order (a scalar-span first operand swapped to second) and the
    float32 ratios and offset it computes them with (the reference and compiled kernels share
    them, so they stay bit-identical)."""
    sa, za, sb, zb, sc, zc = binary_params(A, B, A_scale, A_zero_point, B_scale, B_zero_point,
                                            C_scale, C_zero_point, "QLinearAdd")
    _broadcast_out(A, B, "QLinearAdd")
    with np.errstate(all="ignore"):
        ra, rb = F32(sa / sc), F32(sb / sc)
        x, rx, zx, y, ry, zy = A, ra, za, B, rb, zb
        if first_is_scalar_span(A.shape, B.shape):
            x, rx, zx, y, ry, zy = B, rb, zb, A, ra, za
        fixed = F32(F32(zc) - fma32(rx, F32(zx), F32(ry * F32(zy))))
    return x, rx, y, ry, fixed


@op("QLinearAdd", domain=MS, since=1, contract=_BINARY, **_BINARY_IO)
def QLinearAdd(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """Quantized A + B with multidirectional broadcasting (com.microsoft QLinearAdd-1);
    bit-exact with ORT's AVX2 kernel (see the module docstring)."""
    x, rx, y, ry, fixed = qlinear_add_terms(A, A_scale, A_zero_point, B, B_scale,
                                            B_zero_point, C_scale, C_zero_point)
    with np.errstate(all="ignore"):
        r = fma32(x.astype(F32), rx, fma32(y.astype(F32), ry, fixed))
        return saturate(np.rint(r), A.dtype)


@op("QLinearMul", domain=MS, since=1, contract=_BINARY, **_BINARY_IO)
def QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """Quantized A * B with multidirectional broadcasting (com.microsoft QLinearMul-1):
    rint(float32((a - zA)(b - zB)) * float32(sA * sB / sC) + zC), bit-exact with ORT."""
    what = "QLinearMul"
    sa, za, sb, zb, sc, zc = binary_params(A, B, A_scale, A_zero_point, B_scale, B_zero_point,
                                            C_scale, C_zero_point, what)
    _broadcast_out(A, B, what)
    with np.errstate(all="ignore"):
        ratio = F32(F32(sa * sb) / sc)
        prod = (A.astype(np.int32) - za) * (B.astype(np.int32) - zb)
        r = (prod.astype(F32) * ratio) + F32(zc)
        return saturate(np.rint(r), A.dtype)


def _binary_infer(a, sa, za, b, *rest, **_):
    return TensorFact(a.dtype, broadcast_shapes(a.shape, b.shape))


QLinearAdd.infer(_binary_infer)
QLinearMul.infer(_binary_infer)


def _q8(rng, dtype, shape) -> np.ndarray:
    lo, hi = int_range(dtype)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def _qparams(rng, dtype, scale=None) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = int_range(dtype)
    s = F32(scale if scale is not None else rng.uniform(0.005, 0.1))
    return np.asarray(s, F32), np.asarray(rng.integers(lo, hi + 1), dtype)


def _binary_samples(rng):
    for dt in (np.uint8, np.int8):
        for sa_shape, sb_shape, label in (((2, 3, 4), (2, 3, 4), "same shape"),
                                          ((3, 1), (1, 4), "[3,1]x[1,4]"),
                                          ((2, 3, 4), (4,), "row broadcast"),
                                          ((2, 3, 4), (), "scalar B"), ((), (5,), "scalar A"),
                                          ((2, 0, 4), (4,), "empty"),
                                          ((40, 33), (40, 33), "large")):
            a, b = _q8(rng, dt, sa_shape), _q8(rng, dt, sb_shape)
            yield Sample([a, *_qparams(rng, dt), b, *_qparams(rng, dt), *_qparams(rng, dt)],
                         label=f"{np.dtype(dt).name} {label}")
        # Saturation: a large sum / product in a small output scale.
        a, b = _q8(rng, dt, (64,)), _q8(rng, dt, (64,))
        yield Sample([a, *_qparams(rng, dt, 0.5), b, *_qparams(rng, dt, 0.5),
                      *_qparams(rng, dt, 0.01)], label=f"{np.dtype(dt).name} saturating")
        yield Sample([a, np.asarray(0.05, F32), None, b, np.asarray(0.02, F32), None,
                      np.asarray(0.04, F32), None], label=f"{np.dtype(dt).name} no zero points")


QLinearAdd.samples(_binary_samples)
QLinearMul.samples(_binary_samples)


# ---------------------------------------------------------------------------------------------
# Lookup-table unary ops: QLinearSigmoid, QLinearLeakyRelu
# ---------------------------------------------------------------------------------------------

# MLAS's logistic: Eigen's rational approximation on [-18, 18] (ORT's logistic.cpp constants).
_LOGISTIC_ALPHA = [F32(v) for v in (4.37031012579801e-11, 1.15627324459942e-07,
                                    6.08574864600143e-05, 8.51377133304701e-03,
                                    2.48287947061529e-01)]
_LOGISTIC_BETA = [F32(v) for v in (6.10247389755681e-13, 5.76102136993427e-09,
                                   6.29106785017040e-06, 1.70198817374094e-03,
                                   1.16817656904453e-01, 9.93151921023180e-01)]


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) as MLAS's FMA kernel computes it, float32 (NaN stays NaN)."""
    v = np.clip(x.astype(F32), F32(-18.0), F32(18.0))
    v2 = (v * v).astype(F32)
    p = fma32(v2, _LOGISTIC_ALPHA[0], _LOGISTIC_ALPHA[1])
    for c in _LOGISTIC_ALPHA[2:]:
        p = fma32(p, v2, c)
    p = (p * v).astype(F32)
    q = fma32(v2, _LOGISTIC_BETA[0], _LOGISTIC_BETA[1])
    for c in _LOGISTIC_BETA[2:]:
        q = fma32(q, v2, c)
    with np.errstate(all="ignore"):
        return np.clip((p / q).astype(F32) + F32(0.5), F32(0.0), F32(1.0))


def _table(X, X_scale, X_zero_point, Y_scale, Y_zero_point, fn, what) -> np.ndarray:
    dt = X.dtype
    sx = F32(scalar_param(X_scale, what, "X_scale"))
    zx = int(scalar_param(X_zero_point, what, "X_zero_point", dt))
    sy = F32(scalar_param(Y_scale, what, "Y_scale"))
    zy = int(scalar_param(Y_zero_point, what, "Y_zero_point", dt))
    with np.errstate(all="ignore"):
        deq = (sx * (_all_values(dt).astype(np.int32) - zx).astype(F32)).astype(F32)
        return _quantize_table(fn(deq), sy, zy, dt)


_UNARY_IO = dict(
    inputs=["X: T", "X_scale: tensor(float)", "X_zero_point?: T", "Y_scale: tensor(float)",
            "Y_zero_point?: T"],
    outputs=["Y: T"], types={"T": Q8})
_UNARY = Contract(nan="none", overflow="saturate")


@op("QLinearSigmoid", domain=MS, since=1, contract=_UNARY, **_UNARY_IO)
def QLinearSigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None):
    """Quantized sigmoid through ORT's 256-entry table (com.microsoft QLinearSigmoid-1)."""
    table = _table(X, X_scale, X_zero_point, Y_scale, Y_zero_point, mlas_logistic,
                   "QLinearSigmoid")
    return _lookup(X, table)


@op("QLinearLeakyRelu", domain=MS, since=1, attrs={"alpha": 0.01}, contract=_UNARY,
    **_UNARY_IO)
def QLinearLeakyRelu(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, *, alpha=0.01):
    """Quantized LeakyRelu through ORT's 256-entry table, bit-exact
    (com.microsoft QLinearLeakyRelu-1)."""
    a = F32(alpha)

    def leaky(v):
        return np.where(v >= 0, v, (v * a).astype(F32)).astype(F32)

    table = _table(X, X_scale, X_zero_point, Y_scale, Y_zero_point, leaky, "QLinearLeakyRelu")
    return _lookup(X, table)


def _same_infer(x, *rest, **_):
    return TensorFact(x.dtype, x.shape)


QLinearSigmoid.infer(_same_infer)
QLinearLeakyRelu.infer(_same_infer)


def _unary_samples(rng):
    for dt in (np.uint8, np.int8):
        full = _all_values(dt).reshape(4, 64)
        yield Sample([full, *_qparams(rng, dt, 0.06), *_qparams(rng, dt, 1 / 256)],
                     label=f"{np.dtype(dt).name} every value")
        yield Sample([_q8(rng, dt, (2, 3, 5)), *_qparams(rng, dt), *_qparams(rng, dt)],
                     label=f"{np.dtype(dt).name} 3-D")
        yield Sample([_q8(rng, dt, (0, 3)), *_qparams(rng, dt), *_qparams(rng, dt)],
                     label=f"{np.dtype(dt).name} empty")
        yield Sample([_q8(rng, dt, ()), np.asarray([0.1], F32), None, np.asarray(0.003, F32),
                      None], label=f"{np.dtype(dt).name} scalar, no zero points")


QLinearSigmoid.samples(_unary_samples)


@QLinearLeakyRelu.samples
def _leaky_samples(rng):
    yield from _unary_samples(rng)
    yield Sample([_all_values(np.int8), *_qparams(rng, np.int8, 0.05),
                  *_qparams(rng, np.int8, 0.05)], {"alpha": 0.3}, label="alpha 0.3")


# ---------------------------------------------------------------------------------------------
# QLinearSoftmax
# ---------------------------------------------------------------------------------------------


def _softmax_exp_table(x_scale: F32, reduce_len: int) -> np.ndarray:
    """ORT's exp table: entry i (0..255) = exp((i - 255 + shift) * x_scale) in float32, the
    shift keeping a sum of `reduce_len` entries below float32's maximum."""
    shift = math.log(float(np.finfo(F32).max) / reduce_len)
    shift = max(0.0, shift - 5.0) / float(x_scale)
    i = np.arange(256, dtype=np.float64)
    with np.errstate(all="ignore"):
        return np.exp((i - 255.0 + shift) * float(x_scale)).astype(F32)


def _softmax_rows(x: np.ndarray, table: np.ndarray, y_inv: float, y_zp: int) -> np.ndarray:
    """Softmax of each row of a 2-D (rows, D) array as ORT's QlinearSoftmaxCPU."""
    dt = x.dtype
    xi = x.astype(np.int64)
    # Index 255 is the row maximum: e = table[x - max + 255].
    e = table[xi - xi.max(axis=1, keepdims=True) + 255]
    total = np.add.accumulate(e, axis=1, dtype=F32)[:, -1:]  # sequential float32 sum
    # The ratio is taken in float64 (e * y_inv overflows float32 for a row of one element).
    with np.errstate(all="ignore"):
        q = np.rint(e.astype(np.float64) * y_inv / total.astype(np.float64)) + y_zp
    # A NaN ratio (x_scale = inf, or 0 * inf) writes 0, not the zero point; inf saturates.
    return saturate(np.where(np.isnan(q), 0.0, q), dt)


def _softmax_y_inv(y_scale) -> float:
    """ORT's multiplier floor(1 / y_scale): the reciprocal is rounded to float32 (1 / f32(1/3)
    gives 3, not 2), except where that overflows: then the float64 reciprocal is kept."""
    ys = F32(y_scale)
    with np.errstate(all="ignore"):
        inv32 = F32(1.0) / ys
        inv = float(inv32) if math.isfinite(inv32) else float(np.float64(1.0) / np.float64(ys))
    return math.floor(inv) if math.isfinite(inv) else inv


@op("QLinearSoftmax", domain=MS, since=1,
    inputs=["X: T", "X_scale: tensor(float)", "x_zero_point?: T", "y_scale: tensor(float)",
            "y_zero_point: T"],
    outputs=["Y: T"], types={"T": Q8}, attrs={"axis": -1, "opset": "INT"},
    contract=Contract(nan="none", overflow="saturate"))
def QLinearSoftmax(X, X_scale, x_zero_point, y_scale, y_zero_point, *, axis=-1, opset=None):
    """Quantized softmax (com.microsoft QLinearSoftmax-1): rows over [axis:] (opset < 13) or
    over `axis` (opset >= 13), with ORT's exp table and integer-ratio requantization.

    x_zero_point does not change a softmax and is ignored, as in ORT. y_scale enters as
    floor(1 / y_scale) (256 for the quantizer's 1/256); results saturate.
    """
    what = "QLinearSoftmax"
    if opset is None:
        raise KernelError(f"{what}: the opset attribute is required")
    dt = X.dtype
    sx = F32(scalar_param(X_scale, what, "X_scale"))
    if not sx > 0:
        raise KernelError(f"{what}: X_scale must be positive, got {sx}")
    ys = _softmax_y_inv(scalar_param(y_scale, what, "y_scale"))
    zy = int(scalar_param(y_zero_point, what, "y_zero_point", dt))
    if X.ndim == 0:
        raise KernelError(f"{what}: input must have rank >= 1")
    ax = int(axis)
    if not -X.ndim <= ax < X.ndim:
        raise KernelError(f"{what}: axis {axis} out of range for rank {X.ndim}")
    ax %= X.ndim
    if X.size == 0:
        return np.zeros(X.shape, dt)
    if opset < 13:
        d = math.prod(X.shape[ax:])
        table = _softmax_exp_table(sx, d)
        return _softmax_rows(X.reshape(-1, d), table, ys, zy).reshape(X.shape)
    xt = np.moveaxis(X, ax, -1)
    d = xt.shape[-1]
    table = _softmax_exp_table(sx, d)
    y = _softmax_rows(np.ascontiguousarray(xt).reshape(-1, d), table, ys, zy)
    return np.moveaxis(y.reshape(xt.shape), -1, ax)


QLinearSoftmax.infer(_same_infer)


@QLinearSoftmax.samples
def _softmax_samples(rng):
    for dt, zp in ((np.uint8, 0), (np.int8, -128)):
        ys, yz = np.asarray(1 / 256, F32), np.asarray(zp, dt)
        for shape, attrs, label in (((3, 7), {"opset": 13}, "2-D"),
                                    ((2, 3, 5), {"opset": 13, "axis": 1}, "axis 1"),
                                    ((2, 3, 4), {"opset": 12, "axis": 1}, "opset 12 flattens"),
                                    ((2, 0, 3), {"opset": 13}, "empty"),
                                    ((4, 300), {"opset": 13}, "long rows")):
            yield Sample([_q8(rng, dt, shape), *_qparams(rng, dt), ys, yz], attrs,
                         label=f"{np.dtype(dt).name} {label}")
        peaked = np.full((2, 6), int_range(dt)[0], dt)
        peaked[:, 2] = int_range(dt)[1]
        yield Sample([peaked, np.asarray(0.5, F32), None, ys, yz], {"opset": 13},
                     label=f"{np.dtype(dt).name} one dominant value")
        yield from _softmax_edge_samples(rng, dt, ys, yz)


def _softmax_edge_samples(rng, dt, ys, yz):
    """Row lengths around the table's limits, saturation, x_scale = inf (a quantizer's scale for
    a masked -inf input), and reciprocals that round in float32."""
    name, (lo, hi) = np.dtype(dt).name, int_range(dt)
    for d in (1, 2, 3, 255, 256, 257):
        yield Sample([_q8(rng, dt, (2, d)), np.asarray(0.07, F32), None, ys, yz], {"opset": 13},
                     label=f"{name} rows of {d}")
    x = _q8(rng, dt, (1, 4, 1, 1))
    for zp in (lo, 0, hi):
        yield Sample([x, np.asarray(0.1, F32), None, ys, np.asarray(zp, dt)], {"opset": 13},
                     label=f"{name} one-element rows, zero point {zp}")
        yield Sample([x, np.asarray(np.inf, F32), None, ys, np.asarray(zp, dt)], {"opset": 13},
                     label=f"{name} x_scale inf, zero point {zp}")
    yield Sample([_q8(rng, dt, (3, 5)), np.asarray(0.3, F32), None, np.asarray(0.1, F32),
                  np.asarray(hi - 7, dt)], {"opset": 13}, label=f"{name} saturates high")
    for ys_odd in (F32(1 / 3), F32(1 / 13), np.nextafter(F32(1 / 255), F32(0))):
        yield Sample([_q8(rng, dt, (2, 3)), np.asarray(0.2, F32), None, np.asarray(ys_odd),
                      yz], {"opset": 13}, label=f"{name} y_scale {float(ys_odd):.9g}")
    for ys_edge in (0.0, 1e-39, np.nan):
        yield Sample([np.asarray([[lo, 0, hi], [5, 5, 5]], dt), np.asarray(1.0, F32), None,
                      np.asarray(ys_edge, F32), np.asarray(3, dt)], {"opset": 13},
                     label=f"{name} y_scale {ys_edge}")


# ---------------------------------------------------------------------------------------------
# QLinearConcat
# ---------------------------------------------------------------------------------------------


@op("QLinearConcat", domain=MS, since=1,
    inputs=["Y_scale: TF", "Y_zero_point: T8", "*inputs: TV"], outputs=["Y: T8"],
    types={"T8": Q8, "TF": ["float32"], "TV": ["uint8", "int8", "float32"]},
    attrs={"axis": "INT"}, contract=Contract(nan="none", overflow="saturate"))
def QLinearConcat(Y_scale, Y_zero_point, *inputs, axis=None):
    """Concatenation of quantized tensors, each requantized to (Y_scale, Y_zero_point)
    (com.microsoft QLinearConcat-1). Inputs come as triples (tensor, scale, zero point); a
    tensor whose scale and zero point are the output's is copied, others go through ORT's
    256-entry requantization table (bit-exact)."""
    what = "QLinearConcat"
    if axis is None:
        raise KernelError(f"{what}: the axis attribute is required")
    if not inputs or len(inputs) % 3:
        raise KernelError(f"{what}: inputs must be (tensor, scale, zero point) triples after "
                          f"Y_scale and Y_zero_point, got {len(inputs)} inputs")
    zy_arr = np.asarray(Y_zero_point)
    dt = zy_arr.dtype
    sy = F32(scalar_param(Y_scale, what, "Y_scale"))
    zy = int(scalar_param(Y_zero_point, what, "Y_zero_point", dt))
    parts = []
    for k in range(0, len(inputs), 3):
        x, sx, zx = inputs[k:k + 3]
        x = np.asarray(x)
        _same_dtype(x, dt, what, f"input {k // 3}")
        sxv = F32(scalar_param(sx, what, f"scale of input {k // 3}"))
        zxv = int(scalar_param(zx, what, f"zero point of input {k // 3}", dt))
        if sxv == sy and zxv == zy:
            parts.append(x)
            continue
        table = _table(x, sxv, np.asarray(zxv, dt), sy, np.asarray(zy, dt), lambda v: v, what)
        parts.append(_lookup(x, table))
    rank = parts[0].ndim
    if not -rank <= int(axis) < max(rank, 1):
        raise KernelError(f"{what}: axis {axis} out of range for rank {rank}")
    try:
        return np.concatenate(parts, axis=int(axis))
    except ValueError as e:
        raise KernelError(f"{what}: inputs do not concatenate on axis {axis}: "
                          f"{[p.shape for p in parts]}") from e


# Its variadic input mixes tensors, float scales and zero points: heterogeneous, as in ORT.
QLinearConcat.custom_schema = dataclasses.replace(QLinearConcat.custom_schema, inputs=tuple(
    dataclasses.replace(p, homogeneous=False) if p.option == "variadic" else p
    for p in QLinearConcat.custom_schema.inputs))


@QLinearConcat.infer
def _concat_infer(ys, yz, *inputs, axis=0, **_):
    shapes = [inputs[k].shape for k in range(0, len(inputs), 3)]
    if any(s is None for s in shapes) or not shapes:
        return TensorFact(yz.dtype, None)
    ax = int(axis) % max(len(shapes[0]), 1)
    dims = [s[ax] for s in shapes]
    total = sum(dims) if all(isinstance(d, int) for d in dims) else None
    return TensorFact(yz.dtype, tuple(total if i == ax else d for i, d in enumerate(shapes[0])))


@QLinearConcat.samples
def _concat_samples(rng):
    for dt in (np.uint8, np.int8):
        ys, yz = _qparams(rng, dt, 0.05)
        a, b, c = _q8(rng, dt, (2, 3, 4)), _q8(rng, dt, (2, 5, 4)), _q8(rng, dt, (2, 1, 4))
        yield Sample([ys, yz, a, *_qparams(rng, dt), b, ys, yz, c, *_qparams(rng, dt, 0.2)],
                     {"axis": 1}, label=f"{np.dtype(dt).name} axis 1, one input unchanged")
        yield Sample([ys, yz, a, *_qparams(rng, dt), _q8(rng, dt, (2, 3, 0)), *_qparams(rng, dt)],
                     {"axis": -1}, label=f"{np.dtype(dt).name} empty part")
