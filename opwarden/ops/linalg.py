"""Operators: linalg family (MatMul, Gemm, Einsum, Det, Softmax/LogSoftmax/Hardmax), with the
cost (FLOPs) rules of MatMul and Gemm."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op, shape_size
from opwarden.ops.common import axis_index, wide_half
from opwarden.ops.grad import away_from_zero, differentiable, fit, reduce_to, unbroadcast


def _out(y, dtype) -> np.ndarray:
    return np.asarray(np.asarray(y).astype(dtype, copy=False))


# ---------------------------------------------------------------- MatMul

MATMUL = Contract(nan="propagate", overflow="wrap", broadcast="multidirectional")


@op("MatMul", since=1, contract=MATMUL)
def MatMul(A, B):
    """Matrix product with NumPy matmul semantics, 1-D operands included (ONNX MatMul-1/9/13)."""
    if A.dtype != B.dtype:
        raise KernelError(f"MatMul operands differ in type: {A.dtype} and {B.dtype}")
    if A.ndim == 0 or B.ndim == 0:
        raise KernelError("MatMul operands must have rank >= 1")
    try:
        y = np.matmul(wide_half(A), wide_half(B))
    except ValueError as e:
        raise KernelError(f"MatMul shapes {A.shape} and {B.shape} do not match: {e}") from None
    return _out(y, A.dtype)


@MatMul.flops
def _matmul_flops(ins, outs):
    """Two per product: each output element sums K = A's last dim products."""
    return 2.0 * shape_size(outs[0]) * int(ins[0][-1]) if len(ins) >= 2 and outs else None


# ---------------------------------------------------------------- Gemm

GEMM_1 = Contract(
    nan="propagate",
    overflow="wrap",
    broadcast="unidirectional",
    allowed={"transA": one_of(0, 1), "transB": one_of(0, 1), "broadcast": one_of(0, 1)},
)
GEMM = Contract(
    nan="propagate",
    overflow="wrap",
    broadcast="unidirectional",
    allowed={"transA": one_of(0, 1), "transB": one_of(0, 1)},
)


def _scale(y: np.ndarray, factor: float) -> np.ndarray:
    """factor * y without promoting y's type (integer types keep integer arithmetic if exact)."""
    if factor == 1:
        return y
    if y.dtype.kind in "iu":
        if float(factor).is_integer():
            return y * y.dtype.type(int(factor))
        return y.astype(np.float64) * factor
    return y * y.dtype.type(factor)


def _gemm(A, B, C, alpha, beta, transA, transB, broadcast_c: bool) -> np.ndarray:
    if A.ndim != 2 or B.ndim != 2:
        raise KernelError(f"Gemm needs 2-D A and B, got shapes {A.shape} and {B.shape}")
    a = wide_half(A.T if transA else A)
    b = wide_half(B.T if transB else B)
    if a.shape[1] != b.shape[0]:
        raise KernelError(
            f"Gemm inner dimensions differ: A' is {a.shape}, B' is {b.shape} "
            f"(transA={transA}, transB={transB})"
        )
    y = _scale(a @ b, alpha)
    if C is not None and beta != 0:
        c = wide_half(np.asarray(C))
        mn = y.shape
        if not broadcast_c and c.shape != mn:
            raise KernelError(f"Gemm: C has shape {c.shape}, expected {mn} (broadcast=0)")
        try:
            np.broadcast_shapes(c.shape, mn)
            c = np.broadcast_to(c, mn)
        except ValueError:
            raise KernelError(f"Gemm: C of shape {c.shape} cannot broadcast to {mn}") from None
        cs = _scale(c, beta)
        y = y + cs.astype(y.dtype, copy=False) if y.dtype.kind == "f" else y + cs
    return _out(y, A.dtype)


@op("Gemm", since=1, contract=GEMM_1)
def Gemm_1(A, B, C, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    """alpha*A'B' + beta*C, C broadcast only when `broadcast` is set (ONNX Gemm-1/6)."""
    return _gemm(A, B, C, alpha, beta, transA, transB, bool(broadcast))


@op("Gemm", since=7, contract=GEMM)
def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """alpha*A'B' + beta*C, C unidirectionally broadcast and optional from 11 (ONNX Gemm-7..13)."""
    return _gemm(A, B, C, alpha, beta, transA, transB, True)


@Gemm.flops
def _gemm_flops(ins, outs):
    """Two per product: each element of the (M, N) output sums K = |B| / N products (B is
    (K, N) or, transposed, (N, K)); 0 for an empty output."""
    if len(ins) < 2 or not outs or len(outs[0]) != 2:
        return None
    n = outs[0][1]
    return 2.0 * shape_size(outs[0]) * (shape_size(ins[1]) / n) if n else 0.0


Gemm_1.flops(_gemm_flops)


# ---------------------------------------------------------------- Einsum

# numpy.einsum returns a view for pure axis permutations of one operand.
EINSUM = Contract(nan="propagate", overflow="wrap", may_alias=((0, 0),))


@op("Einsum", since=12, contract=EINSUM)
def Einsum(*Inputs, equation=None):
    """Einstein summation given by `equation` (ONNX Einsum-12/28)."""
    if equation is None:
        raise KernelError("Einsum needs the attribute equation")
    if not Inputs:
        raise KernelError("Einsum needs at least one input")
    eq = equation.replace(" ", "")
    dt = Inputs[0].dtype
    if any(x.dtype != dt for x in Inputs):
        raise KernelError(f"Einsum inputs differ in type: {[str(x.dtype) for x in Inputs]}")
    try:
        y = np.einsum(eq, *[wide_half(x) for x in Inputs], optimize=len(Inputs) > 2)
    except ValueError as e:
        shapes = [x.shape for x in Inputs]
        raise KernelError(f"Einsum {equation!r} does not fit shapes {shapes}: {e}") from None
    return _out(y, dt)


# ---------------------------------------------------------------- Det

DET = Contract(nan="propagate")


@op("Det", since=11, contract=DET)
def Det(X):
    """Determinant of each square matrix in the last two axes (ONNX Det-11/22)."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise KernelError(f"Det needs [*, M, M] input, got shape {X.shape}")
    return _out(np.linalg.det(wide_half(X)), X.dtype)


# ---------------------------------------------------------------- Softmax family


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - m)  # shifted by the max: no overflow for large inputs
        return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        d = x - m
        return d - np.log(np.sum(np.exp(d), axis=axis, keepdims=True))


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    # 1 at the first maximum along axis; NaN counts as the maximum (argmax's rule).
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


def _along_axis(fn, x: np.ndarray, axis: int) -> np.ndarray:
    """Opset-13 semantics: apply `fn` along the single axis `axis`."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise KernelError("input must have rank >= 1")
    ax = axis_index(axis, x.ndim, scalar_ok=True)
    if x.shape[ax] == 0:
        return x.copy()
    return _out(fn(wide_half(x), ax), x.dtype)


def _coerced_2d(fn, x: np.ndarray, axis: int) -> np.ndarray:
    """Opset-1/11 semantics: view the input as [prod(shape[:axis]), prod(shape[axis:])]
    and apply `fn` to each row."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise KernelError("input must have rank >= 1")
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax <= x.ndim:
        raise KernelError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
    rows = int(np.prod(x.shape[:ax], dtype=np.int64))
    cols = int(np.prod(x.shape[ax:], dtype=np.int64))
    if rows * cols == 0:
        return x.copy()
    y = fn(wide_half(x).reshape(rows, cols), 1)
    return _out(y.reshape(x.shape), x.dtype)


SOFTMAX = Contract(nan="propagate")


@op("Softmax", since=1, contract=SOFTMAX)
def Softmax_1(input, *, axis=1):
    """Softmax of each row of the input coerced to 2-D at `axis` (ONNX Softmax-1/11)."""
    return _coerced_2d(_softmax, input, axis)


@op("Softmax", since=13, contract=SOFTMAX)
def Softmax(input, *, axis=-1):
    """Softmax along `axis` (ONNX Softmax-13)."""
    return _along_axis(_softmax, input, axis)


@op("LogSoftmax", since=1, contract=SOFTMAX)
def LogSoftmax_1(input, *, axis=1):
    """Log of softmax of each row of the input coerced to 2-D at `axis` (ONNX LogSoftmax-1/11)."""
    return _coerced_2d(_log_softmax, input, axis)


@op("LogSoftmax", since=13, contract=SOFTMAX)
def LogSoftmax(input, *, axis=-1):
    """Log of softmax along `axis` (ONNX LogSoftmax-13)."""
    return _along_axis(_log_softmax, input, axis)


HARDMAX = Contract(nan="suppress")


@op("Hardmax", since=1, contract=HARDMAX)
def Hardmax_1(input, *, axis=1):
    """One-hot of the first maximum of each row of the 2-D-coerced input (ONNX Hardmax-1/11)."""
    return _coerced_2d(_hardmax, input, axis)


@op("Hardmax", since=13, contract=HARDMAX)
def Hardmax(input, *, axis=-1):
    """One-hot of the first maximum along `axis` (ONNX Hardmax-13)."""
    return _along_axis(_hardmax, input, axis)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _matmul_grad_cases(op_type: str, since: int) -> list[Sample]:
    r = away_from_zero
    return [Sample([r(2, 3, 4), r(4, 2, seed=2)]), Sample([r(3), r(2, 3, 4, seed=2)]),
            Sample([r(2, 1, 2, 3), r(3, 3, 2, seed=4)], label="batch broadcast")]


@differentiable("MatMul", cases=_matmul_grad_cases)
def _matmul_grad(ctx, dY, **attrs):
    A, B = (np.asarray(x) for x in ctx.inputs)
    a = A[None, :] if A.ndim == 1 else A
    b = B[:, None] if B.ndim == 1 else B
    y_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    g = np.asarray(dY).reshape(y_shape)
    da = g @ np.swapaxes(b, -1, -2)
    db = np.swapaxes(a, -1, -2) @ g
    return fit(ctx, unbroadcast(da, a.shape), unbroadcast(db, b.shape))


def _gemm_grad_cases(op_type: str, since: int) -> list[Sample]:
    r = away_from_zero
    c = r(3, 4, seed=3) if since < 7 else r(4, seed=3)
    attrs = {"broadcast": 1} if since < 7 else {}
    return [Sample([r(2, 3), r(3, 4, seed=2), c[:2] if since < 7 else c],
                   {"alpha": 0.5, "beta": 2.0, **attrs}),
            Sample([r(3, 2), r(4, 3, seed=2), r(2, 4, seed=3)], {"transA": 1, "transB": 1})]


@differentiable("Gemm", cases=_gemm_grad_cases)
def _gemm_grad(ctx, dY, **attrs):
    A, B = (np.asarray(x) for x in ctx.inputs[:2])
    C = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    a = A.T if ta else A
    b = B.T if tb else B
    da = alpha * dY @ b.T
    db = alpha * a.T @ dY
    dc = None if C is None else reduce_to(beta * dY, C)
    return fit(ctx, da.T if ta else da, db.T if tb else db, dc)


def _softmax_axis(ctx, attrs):
    """(axis, Y, coerced): opset < 13 works on the input coerced to 2-D at `axis`."""
    Y = np.asarray(ctx.outputs[0])
    axis = attrs.get("axis", 1 if ctx.op is not None and ctx.op.since < 13 else -1)
    ax = axis + Y.ndim if axis < 0 else axis
    return ax, Y, ctx.op is not None and ctx.op.since < 13


def _softmax_like_grad(log: bool):
    def rule(ctx, dY, **attrs):
        ax, Y, coerced = _softmax_axis(ctx, attrs)
        shape = Y.shape
        if coerced:
            rows = math.prod(shape[:ax])
            Y, dy, red = Y.reshape(rows, -1), dY.reshape(rows, -1), 1
        else:
            dy, red = dY, ax
        if log:
            dx = dy - np.exp(Y) * dy.sum(axis=red, keepdims=True)
        else:
            dx = Y * (dy - (dy * Y).sum(axis=red, keepdims=True))
        return fit(ctx, dx.reshape(shape))

    return rule


def _softmax_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = away_from_zero(2, 3, 4)
    return [Sample([x]), Sample([x], {"axis": 1}), Sample([x], {"axis": 0})]


differentiable("Softmax", cases=_softmax_grad_cases)(_softmax_like_grad(False))
differentiable("LogSoftmax", cases=_softmax_grad_cases)(_softmax_like_grad(True))
