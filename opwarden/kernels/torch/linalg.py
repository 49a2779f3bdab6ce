"""Linear algebra on the torch device: MatMul, Gemm, Softmax, and the fused FusedGemm and
FusedMatMul (bias and activation applied in place on the fresh product).

GEMMs under `_SERIAL_FLOPS` run on one thread (only under passive OpenMP waiting, see runtime).
Shapes the kernels do not take (Gemm operands that are not 2-D or do not match, a bias that does
not broadcast) go to the reference kernel, which names the problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from opwarden.kernels.torch.activation import _activate_
from opwarden.kernels.torch.runtime import (
    _CUDA,
    _SERIAL_FLOPS,
    FLOATS,
    _add,
    _add_simple,
    _each,
    _Mode,
    _small,
)
from opwarden.kernels.torch.tensors import _np, _opt, _out_t, _ret, _t


def _mm_flops(A, B) -> float:
    """Multiply-adds x 2 of matmul(A, B), near enough to pick a thread count."""
    a, b = np.shape(A), np.shape(B)
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    return 2.0 * max(math.prod(a) * n, math.prod(b) * m)


def _matmul(A, B, *, out=None):
    with _Mode(_mm_flops(A, B) < _SERIAL_FLOPS):
        a, b = _t(A), _t(B)
        o = _out_t(out)
        if o is not None and a.ndim >= 1 and b.ndim >= 1:
            torch.matmul(a, b, out=o)
            return out
        return _ret(torch.matmul(a, b), out)


def _gemm_t(a, b, c, alpha, beta, transA, transB, out=None) -> torch.Tensor:
    if transA:
        a = a.t()
    if transB:
        b = b.t()
    o = _out_t(out)
    if c is not None and beta != 0:
        if o is not None:
            return torch.addmm(c, a, b, beta=float(beta), alpha=float(alpha), out=o)
        return torch.addmm(c, a, b, beta=float(beta), alpha=float(alpha))
    y = torch.mm(a, b, out=o) if o is not None else torch.mm(a, b)
    if alpha != 1:
        y.mul_(float(alpha))
    return y


def _gemm_kernel(legacy: bool, ref: Callable[..., Any]):
    def kernel(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None, **attrs):
        A, B = np.asarray(A), np.asarray(B)
        bad = A.ndim != 2 or B.ndim != 2
        bad = bad or A.shape[0 if transA else 1] != B.shape[1 if transB else 0]
        if not bad and C is not None and beta != 0:
            m, n = A.shape[1 if transA else 0], B.shape[0 if transB else 1]
            cs = np.shape(C)
            if legacy and not attrs.get("broadcast") and tuple(cs) != (m, n):
                bad = True
            else:
                try:
                    bad = np.broadcast_shapes(cs, (m, n)) != (m, n)
                except ValueError:
                    bad = True
        if bad:
            # The reference kernel names the shape problem.
            return ref(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB, **attrs)
        with _Mode(2 * A.size * B.shape[0 if transB else 1] < _SERIAL_FLOPS):
            y = _gemm_t(_t(A), _t(B), _opt(C), alpha, beta, transA, transB, out)
            return out if (out is not None and not _CUDA) else _ret(y, out)

    return kernel


def _softmax_kernel(ref: Callable[..., Any], coerced: bool):
    """Softmax-13 along one axis, or Softmax-1/11 over the input coerced to 2-D at `axis`."""

    def kernel(input, *, axis=-1 if not coerced else 1):
        x = np.asarray(input)
        hi = x.ndim if coerced else x.ndim - 1
        if x.ndim == 0 or x.size == 0 or not -x.ndim <= axis <= hi:
            return ref(input, axis=axis)
        with _Mode(_small(x)):
            if not coerced:
                return _np(torch.softmax(_t(x), axis))
            ax = axis + x.ndim if axis < 0 else axis
            rows = math.prod(x.shape[:ax])
            return _np(torch.softmax(_t(x).reshape(rows, -1), 1).reshape(x.shape))

    return kernel


def _fused_gemm_kernel(ref: Callable[..., Any]):
    def kernel(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_params=(), **attrs):
        A, B = np.asarray(A), np.asarray(B)
        if A.ndim != 2 or B.ndim != 2:
            return ref(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                       activation=activation, activation_params=activation_params, **attrs)
        with _Mode(2 * A.size * B.shape[0 if transB else 1] < _SERIAL_FLOPS):
            y = _gemm_t(_t(A), _t(B), _opt(C), alpha, beta, transA, transB)
            return _np(_activate_(y, activation, activation_params))

    return kernel


def _fused_matmul(A, B, C=None, *, activation="", activation_params=(), **_attrs):
    with _Mode(_mm_flops(A, B) < _SERIAL_FLOPS):
        y = torch.matmul(_t(A), _t(B))
        if C is not None:
            c = _t(C)
            if torch.broadcast_shapes(y.shape, c.shape) == y.shape:
                y.add_(c)
            else:
                y = y + c
        return _np(_activate_(y, activation, activation_params))


def register() -> None:
    """Add the linear-algebra variants to the torch device."""
    _add_simple({"MatMul": (_matmul, FLOATS, True)})
    for o in _each("Gemm"):
        _add(o, _gemm_kernel(o.since < 7, o.reference), "gemm.torch", accepts_out=True)
    for o in _each("Softmax"):
        _add(o, _softmax_kernel(o.reference, coerced=o.since < 13), "softmax.torch")
    for o in _each("FusedGemm", "opwarden"):
        _add(o, _fused_gemm_kernel(o.reference), "fusedgemm.torch")
    for o in _each("FusedMatMul", "opwarden"):
        _add(o, _fused_matmul, "fusedmatmul.torch")
