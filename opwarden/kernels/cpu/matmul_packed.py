"""MatMul and FusedMatMul by a constant 2-D weight on the compiled packed-weight GEMM
(packed_gemm, AVX-512F): A's rows (any leading axes, C-contiguous) run as one GEMM, a bias row
is added as each panel is finished, the activation after (the compiled passes the BLAS
variant uses). A weight that is not a constant (attention's products), batched or strided
operands run the BLAS variant's path; CPUs without AVX-512F register only that variant."""

from __future__ import annotations

import numpy as np

from opwarden.kernels.cpu import packed_gemm
from opwarden.kernels.cpu.fused import fused_matmul_kernel
from opwarden.kernels.cpu.linalg import _bias_row, _matmul_ok, fused_matmul_workspace, matmul
from opwarden.kernels.cpu.util import apply_activation, output
from opwarden.ops.base import REGISTRY
from opwarden.ops.fused import DOMAIN


def packed_matmul(A: np.ndarray, B: np.ndarray, bias: np.ndarray | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
    """A @ B (+ bias row) for `packed_gemm.takes(A, B)`, into `out` where it fits."""
    y = output(out, (*A.shape[:-1], B.shape[1]))
    return packed_gemm.matmul_into(A, B, y, bias)


def matmul_packed(A, B, *, out=None):
    """MatMul: the packed GEMM for a constant weight, else the BLAS variant's path."""
    if packed_gemm.takes(A, B):
        return packed_matmul(A, B, None, out)
    return matmul(A, B, out=out)


def fused_matmul_packed(A, B, C=None, *, activation="", activation_params=None, out=None):
    """act(MatMul(A, B) + C): the packed GEMM (with C as its bias row) for a constant weight,
    else the BLAS variant."""
    bias = None if C is None else _bias_row(C, B.shape[1] if getattr(B, "ndim", 0) == 2 else -1)
    if packed_gemm.takes(A, B) and (C is None or bias is not None):
        y = packed_matmul(A, B, bias, out)
        if activation:
            apply_activation(y, activation, activation_params or ())
        return y
    return fused_matmul_kernel(A, B, C, activation=activation,
                               activation_params=activation_params, out=out)


def register() -> None:
    """Register the packed variants above the BLAS ones where the kernel runs."""
    if not packed_gemm.available():
        return
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 12, "accepts_out": True}
    for opdef in REGISTRY.versions("MatMul"):
        opdef.kernel(when=_matmul_ok, name="matmul.cpu.packed", **kw)(matmul_packed)
    for opdef in REGISTRY.versions("FusedMatMul", DOMAIN):
        opdef.kernel(when=_matmul_ok, name="fusedmatmul.cpu.packed",
                     workspace_bytes=fused_matmul_workspace, **kw)(fused_matmul_packed)
