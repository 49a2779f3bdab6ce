"""Fast float32 Gemm/MatMul (straight to BLAS into the planned buffer) and Softmax/LogSoftmax."""

from __future__ import annotations

import math

import numpy as np

from opwarden.errors import KernelError
from opwarden.kernels.cpu.blas_split import split_batched, split_gemm
from opwarden.kernels.cpu.util import (
    EW_CHUNK,
    activation_workspace,
    apply_activation,
    ones_row,
    output,
    scratch,
)
from opwarden.ops.base import REGISTRY


def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=1,
         activation="", activation_params=(), out=None):
    """act(alpha * A' @ B' + beta * C) for 2-D float32 operands, into `out`."""
    if A.ndim != 2 or B.ndim != 2:
        raise KernelError(f"Gemm needs 2-D A and B, got shapes {A.shape} and {B.shape}")
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise KernelError(
            f"Gemm inner dimensions differ: A' is {a.shape}, B' is {b.shape} "
            f"(transA={transA}, transB={transB})"
        )
    y = output(out, (a.shape[0], b.shape[1]))
    if not split_gemm(a, b, y):
        np.matmul(a, b, out=y)
    if alpha != 1.0:
        y *= np.float32(alpha)
    if C is not None and beta != 0.0:
        c = np.asarray(C)
        if not broadcast and c.shape != y.shape:
            raise KernelError(f"Gemm: C has shape {c.shape}, expected {y.shape} (broadcast=0)")
        try:
            if beta == 1.0:
                y += c
            else:
                y += c * np.float32(beta)
        except ValueError:
            raise KernelError(f"Gemm: C of shape {c.shape} cannot broadcast to {y.shape}") from None
    if activation:
        apply_activation(y, activation, activation_params)
    return y


def _gemm_kernel(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=1,
                 out=None):
    """Gemm into the planned buffer."""
    return gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                broadcast=broadcast, out=out)


def _bias_row(C, n: int) -> np.ndarray | None:
    """C as an (n,) float32 row when it broadcasts as one over the product's rows, else None."""
    if C is None:
        return None
    c = np.asarray(C)
    if c.dtype != np.float32 or c.size != n or (c.ndim and c.shape[-1] != n):
        return None
    return c.reshape(n)


def _split_matmul(A, B, out, bias: np.ndarray | None = None) -> np.ndarray | None:
    """MatMul by blas_split (the product shared out in chunks, `bias` added to each column
    block of a 2-D-weight product as it is done) into the planned buffer, or None (nothing
    written) where it does not apply: not float32 arrays of rank >= 2, shapes that do not
    match, a small product."""
    if (not isinstance(A, np.ndarray) or not isinstance(B, np.ndarray) or A.ndim < 2
            or B.ndim < 2 or A.dtype != np.float32 or B.dtype != np.float32
            or A.shape[-1] != B.shape[-2]):
        return None
    k, n = B.shape[-2:]
    if B.ndim == 2 and (A.ndim == 2 or A.flags.c_contiguous):
        y = output(out, (*A.shape[:-1], n))
        y2 = y.reshape(-1, n)
        a2 = A.reshape(-1, k)

        def add_bias(r0: int, r1: int, c0: int, c1: int) -> None:
            np.add(y2[r0:r1, c0:c1], bias[c0:c1], out=y2[r0:r1, c0:c1])

        return y if split_gemm(a2, B, y2, None if bias is None else add_bias) else None
    if bias is not None:
        return None
    try:
        batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except ValueError:
        return None
    y = output(out, (*batch, A.shape[-2], n))
    return y if split_batched(A, B, y, batch) else None


def _flat_matmul(A, B, out) -> np.ndarray | None:
    """A stacked A times a 2-D B as one GEMM over all of A's rows (NumPy's matmul calls BLAS
    once per stacked matrix: ConvNeXt's (1, 56, 56, 96) @ (96, 384) is 56 small GEMMs), or
    None where A's rows are not one contiguous block or `out` is not C-contiguous."""
    if (not isinstance(A, np.ndarray) or not isinstance(B, np.ndarray) or A.ndim < 3
            or B.ndim != 2 or not A.flags.c_contiguous or A.shape[-1] != B.shape[0]
            or A.dtype != B.dtype):
        return None
    n = B.shape[1]
    shape = (*A.shape[:-1], n)
    if out is not None and (out.shape != shape or not out.flags.c_contiguous
                            or out.dtype != A.dtype):
        return None
    y = np.empty(shape, A.dtype) if out is None else out
    np.matmul(A.reshape(-1, A.shape[-1]), B, out=y.reshape(-1, n))
    return y


def matmul(A, B, *, out=None):
    """MatMul (NumPy semantics) into the planned buffer; large float32 products shared out
    by blas_split."""
    try:
        y = _split_matmul(A, B, out)
        if y is not None:
            return y
        y = _flat_matmul(A, B, out)
        if y is not None:
            return y
        if out is not None:
            return np.matmul(A, B, out=out)
        return np.asarray(np.matmul(A, B))
    except ValueError as e:
        raise KernelError(f"MatMul shapes {A.shape} and {B.shape} do not match: {e}") from None


def fused_matmul(A, B, C=None, *, activation="", activation_params=(), out=None):
    """act(MatMul(A, B) + C) into the planned buffer; a bias row is added by blas_split's
    chunks as each column block of the product is done."""
    y = None
    if C is not None and isinstance(B, np.ndarray) and B.ndim == 2:
        bias = _bias_row(C, B.shape[1])
        if bias is not None:
            y = _split_matmul(A, B, out, bias)
            C = None if y is not None else C
    if y is None:
        try:
            y = matmul(A, B, out=out)
        except KernelError:
            y = matmul(A, B)  # `out` has the larger shape C broadcasts the product to
    if C is not None:
        try:
            np.add(y, C, out=y)
        except ValueError:
            y = np.add(y, C, out=out if out is not None and out is not y else None)
    if activation:
        apply_activation(y, activation, activation_params)
    return y


def _softmax_rows(x: np.ndarray, axis: int, y: np.ndarray, log: bool) -> np.ndarray:
    if axis == x.ndim - 1 and x.flags.c_contiguous and y.flags.c_contiguous and x.size:
        cols = x.shape[-1]
        _softmax_last(x.reshape(-1, cols), y.reshape(-1, cols), log)
        return y
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        np.subtract(x, m, out=y)
        if log:
            # exp into y for the sum, then y = (x - m) - log(sum) afresh: no temporary of x's
            # size. (x - m first: m + log(sum) would round to m's precision.)
            np.exp(y, out=y)
            s = np.log(np.sum(y, axis=axis, keepdims=True))
            np.subtract(x, m, out=y)
            y -= s
        else:
            np.exp(y, out=y)
            y /= np.sum(y, axis=axis, keepdims=True)
    return y


def _softmax_last(x: np.ndarray, y: np.ndarray, log: bool) -> np.ndarray:
    """(Log)Softmax over the rows of a C-contiguous 2-D x, in row blocks of about EW_CHUNK
    floats that stay in cache: the row sums are a matrix-vector product with ones (BLAS,
    ~4x faster than np.sum on these rows), the division one multiplication by the row
    reciprocals. LogSoftmax exponentiates into a block of scratch."""
    rows, cols = x.shape
    step = max(1, EW_CHUNK // cols)
    ones = ones_row(cols)
    m = scratch("softmax.m", (min(rows, step),))
    t = scratch("softmax.t", (min(rows, step), cols)) if log else None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for a in range(0, rows, step):
            b = min(rows, a + step)
            xc, yc, mc = x[a:b], y[a:b], m[:b - a]
            # fmax skips NaN where maximum returns it (30% faster on 128-float rows): a NaN row
            # still comes out all NaN, through its sum. (An infinite max gives inf - inf = NaN
            # either way.)
            np.fmax.reduce(xc, axis=1, out=mc)
            np.subtract(xc, mc[:, None], out=yc)
            e = t[:b - a] if log else yc
            np.exp(yc, out=e)
            np.matmul(e, ones, out=mc)
            if log:
                np.log(mc, out=mc)
                yc -= mc[:, None]
            else:
                np.reciprocal(mc, out=mc)
                yc *= mc[:, None]
    return y


def _softmax13(x, axis, out, log):
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise KernelError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
    y = output(out, x.shape)
    if x.shape[ax] == 0:
        return y
    return _softmax_rows(x, ax, y, log)


def _softmax1(x, axis, out, log):
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax <= x.ndim:
        raise KernelError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
    y = output(out, x.shape)
    rows = math.prod(x.shape[:ax])  # (np.prod: ~8 us a call)
    if y.size == 0:
        return y
    _softmax_rows(np.ascontiguousarray(x).reshape(rows, -1), 1, y.reshape(rows, -1), log)
    return y


def softmax_13(input, *, axis=-1, out=None):
    """Softmax along one axis (opset 13)."""
    return _softmax13(input, axis, out, False)


def log_softmax_13(input, *, axis=-1, out=None):
    """LogSoftmax along one axis (opset 13)."""
    return _softmax13(input, axis, out, True)


def softmax_1(input, *, axis=1, out=None):
    """Softmax over the input coerced to 2-D at `axis` (opset 1/11)."""
    return _softmax1(input, axis, out, False)


def log_softmax_1(input, *, axis=1, out=None):
    """LogSoftmax over the input coerced to 2-D at `axis` (opset 1/11)."""
    return _softmax1(input, axis, out, True)


def _reduced(x, ax: int, coerced: bool) -> int:
    """Elements of a softmax's per-row reductions (max, sum) for input shape x."""
    if not all(isinstance(d, int) for d in x) or not x:
        return 0
    ax = ax + len(x) if ax < 0 else ax
    if coerced:  # opset 1/11: rows are the axes before `axis`
        return int(np.prod(x[:ax], dtype=np.int64))
    if not 0 <= ax < len(x) or x[ax] == 0:
        return 0
    return int(np.prod(x, dtype=np.int64)) // x[ax]


def _softmax_workspace(coerced: bool, default_axis: int):
    """Softmax/LogSoftmax's workspace: its row maxima and sums (and the log of the sums), one
    float per row each; a strided input's contiguous copy for the coerced (opset 1/11) form;
    over the last axis a row of ones and (LogSoftmax) a block of exponentials."""

    def workspace(x, *, axis=default_axis, **_) -> int:
        rows = _reduced(x, int(axis), coerced)
        copy = int(np.prod(x, dtype=np.int64)) if coerced and x else 0
        n = int(np.prod(x, dtype=np.int64)) if rows else 0
        cols = n // rows if rows else 0
        block = min(rows, max(1, EW_CHUNK // max(cols, 1))) * cols + cols if rows else 0
        return 4 * (3 * rows + copy + block)

    return workspace


def gemm_workspace(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0,
                   activation="", activation_params=None, **_) -> int:
    """gemm's workspace: beta * C when beta is neither 0 nor 1, the activation's temporaries."""
    if len(a) != 2 or len(b) != 2 or not all(isinstance(d, int) for d in (*a, *b)):
        return 0
    rows, cols = a[1] if transA else a[0], b[0] if transB else b[1]
    ws = activation_workspace(activation, activation_params, rows * cols)
    if c is not None and float(beta) not in (0.0, 1.0) and all(isinstance(d, int) for d in c):
        ws += 4 * int(np.prod(c, dtype=np.int64))
    return ws


def fused_matmul_workspace(a, b, c=None, *, activation="", activation_params=None, **_) -> int:
    """fused_matmul's workspace: the activation's temporaries over the product."""
    try:
        shape = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])) + (
            (a[-2],) if len(a) > 1 else ()) + ((b[-1],) if len(b) > 1 else ())
        n = int(np.prod(shape, dtype=np.int64))
    except (ValueError, TypeError, IndexError):
        return 0
    return activation_workspace(activation, activation_params, n)


def _ranked(x, *rest, **attrs) -> bool:
    return x.shape is not None and len(x.shape) >= 1


def _gemm_ok(a, b, *rest, **attrs) -> bool:
    return (a.shape is not None and b.shape is not None and len(a.shape) == 2
            and len(b.shape) == 2 and all(f is None or f.dtype in (None, "float32") for f in rest))


def _matmul_ok(a, b, *rest, **attrs) -> bool:
    return a.shape is not None and b.shape is not None and len(a.shape) >= 1 and len(b.shape) >= 1


def register() -> None:
    """Register Gemm, MatMul and Softmax-family variants on every version."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in REGISTRY.versions("Gemm"):
        opdef.kernel(when=_gemm_ok, name="gemm.cpu.blas", workspace_bytes=gemm_workspace,
                     **kw)(_gemm_kernel)
    for opdef in REGISTRY.versions("MatMul"):
        opdef.kernel(when=_matmul_ok, name="matmul.cpu.blas", **kw)(matmul)
    for op_type, v13, v1 in (("Softmax", softmax_13, softmax_1),
                             ("LogSoftmax", log_softmax_13, log_softmax_1)):
        for opdef in REGISTRY.versions(op_type):
            fn = v13 if opdef.since >= 13 else v1
            ws = _softmax_workspace(opdef.since < 13, -1 if opdef.since >= 13 else 1)
            opdef.kernel(when=_ranked, name=f"{op_type.lower()}.cpu.fast", workspace_bytes=ws,
                         **kw)(fn)
