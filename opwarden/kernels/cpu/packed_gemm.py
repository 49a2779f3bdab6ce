"""The compiled float32 GEMM against a weight packed once (native/sgemm.c, AVX-512F): the
weight in 32-column panels, cached with the constant it comes from; C = A B (+ a bias row),
A's rows C-contiguous. Used by the packed MatMul / FusedMatMul variants (matmul_packed) and
the NHWC pointwise convolution (conv_gemm). Sums run over k in ascending order in float32
FMAs: the results differ from OpenBLAS's in the last bits only (another order)."""

from __future__ import annotations

import numpy as np

from opwarden import native
from opwarden.blas import compute_threads
from opwarden.kernels.cpu import blas_split
from opwarden.kernels.cpu.util import packed
from opwarden.memory.constants import is_constant

F32 = np.float32
NR = 32  # columns per panel (SG_NR in sgemm.c)


def available() -> bool:
    """The packed GEMM runs here (native.sgemm_packed: extension, AVX-512F, not turned off by
    OPWARDEN_PACKED_GEMM=0)."""
    return native.sgemm_packed() == "avx512f"


def pack_panels(b: np.ndarray) -> np.ndarray:
    """B [K, N] float32 as panels of NR columns: panel p is B[:, NR p: NR (p + 1)] row-major
    (zero past N), one flat float32 array."""
    k, n = b.shape
    np_ = -(-n // NR) * NR
    w = np.zeros((k, np_), F32)
    w[:, :n] = b
    return np.ascontiguousarray(w.reshape(k, np_ // NR, NR).transpose(1, 0, 2)).reshape(-1)


def takes(A, B, owner=None, constant: bool = True) -> bool:
    """A float32 A with C-contiguous rows times a B that `weight_takes`."""
    return (isinstance(A, np.ndarray) and A.ndim >= 2 and A.dtype == F32
            and A.flags.c_contiguous and isinstance(B, np.ndarray) and B.ndim == 2
            and A.shape[-1] == B.shape[0] and weight_takes(B, owner, constant))


def weight_takes(B, owner=None, constant: bool = True) -> bool:
    """A 2-D float32 B that is a constant, or is all of the constant `owner` (B = owner[0] of
    a one-group packing); not while products are shared out by blas_split
    (OPWARDEN_BLAS_SPLIT=1), which then runs them. `constant=False` takes any B (packed on
    every call unless constant: a copy of B's size that no workspace declares)."""
    return (not blas_split.SPLIT and available() and isinstance(B, np.ndarray)
            and B.ndim == 2 and B.dtype == F32
            and (not constant or is_constant(B if owner is None else owner))
            and (owner is None or owner.size == B.size))


def panels(B: np.ndarray, owner=None) -> np.ndarray:
    """B's panels, packed once and cached with `owner` (B itself by default)."""
    return packed(B if owner is None else owner, ("sgemm-packed", NR, B.shape, B.strides),
                  lambda _: pack_panels(B))


def matmul_into(A: np.ndarray, B: np.ndarray, y: np.ndarray, bias: np.ndarray | None = None,
                owner=None) -> np.ndarray:
    """y = A @ B (+ bias row) for `takes(A, B, owner)`; y C-contiguous of the result's shape."""
    k, n = B.shape
    m = int(np.prod(A.shape[:-1]))
    b = np.ascontiguousarray(bias, F32) if bias is not None else y.reshape(-1)[:0]
    native._LIB.sgemm_packed(A.reshape(-1), k, _ONE_TAP, m, k, panels(B, owner), n, b,
                             bias is not None, y.reshape(-1), n, False, compute_threads())
    return y


_ONE_TAP = np.zeros(1, np.int64)


def taps_into(a: np.ndarray, lda: int, offs: np.ndarray, m: int, B: np.ndarray,
              y: np.ndarray, owner, accumulate: bool = False) -> np.ndarray:
    """y [m, N] (+)= sum over taps t of A_t @ B[t k:(t + 1) k], A_t the m rows of the flat
    float32 `a` at offs[t] (int64 element offsets), row stride lda, k = B's rows / taps: a
    k x k convolution as shifted row ranges of one padded image. B: the taps' weights stacked
    [taps k, N], all of the constant `owner`; `accumulate`: onto what y holds."""
    taps = len(offs)
    k, n = B.shape[0] // taps, B.shape[1]
    native._LIB.sgemm_packed(a, lda, offs, m, k, panels(B, owner), n, y.reshape(-1)[:0],
                             False, y.reshape(-1), n, bool(accumulate), compute_threads())
    return y
