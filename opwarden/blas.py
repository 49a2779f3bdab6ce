"""NumPy's bundled OpenBLAS, reached through ctypes: its thread count and its worker restart.

The bottom layer: the session, the executor, the isolation worker and the kernels all set or read
the BLAS thread count, so it lives below every one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def openblas_symbol(*names: str) -> Any:
    """The first of `names` exported by NumPy's bundled OpenBLAS (ctypes function) or None."""
    import ctypes
    import glob
    import os

    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "lib*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
    return None


def restart_blas_threads() -> bool:
    """Make NumPy's bundled OpenBLAS re-read its environment (OPENBLAS_THREAD_TIMEOUT) and stop
    its worker threads; its next threaded call starts them again (as it does after a fork),
    now spinning for the timeout just read. Meant for import time, with no BLAS call running on
    another thread. False (nothing done) where those entry points are not exported (another
    BLAS, another OpenBLAS build)."""
    read = openblas_symbol("openblas_read_env")
    stop = openblas_symbol("blas_thread_shutdown_")
    if read is None or stop is None:
        return False
    read()
    stop()
    return True


_BLAS_SET: list = []
_BLAS_GET: list = []


def set_blas_threads(n: int) -> bool:
    """Set the thread count of NumPy's bundled OpenBLAS; False when it cannot be found."""
    import ctypes

    if not _BLAS_SET:
        _BLAS_SET.append(openblas_symbol(
            "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
            "openblas_set_num_threads"))
    fn = _BLAS_SET[0]
    if fn is None:
        return False
    fn(ctypes.c_int(int(n)))
    return True


def blas_thread_count() -> int:
    """NumPy's OpenBLAS thread count (the core count when it cannot be asked)."""
    import os

    if not _BLAS_GET:
        _BLAS_GET.append(openblas_symbol(
            "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
            "openblas_get_num_threads"))
    fn = _BLAS_GET[0]
    return int(fn()) if fn is not None else (os.cpu_count() or 1)


# Set by kernels.cpu.blas_split.configure: its own threads then run the large products while
# OpenBLAS stays on one thread.
_SPLIT_THREADS = [0]


def set_split_threads(n: int) -> None:
    """Record the thread count the split products run on (0: none, OpenBLAS's own)."""
    _SPLIT_THREADS[0] = n


def compute_threads() -> int:
    """Threads the CPU kernels compute with now: the split count while it drives the products
    (OpenBLAS then on one thread), else OpenBLAS's own count."""
    n, blas = _SPLIT_THREADS[0], blas_thread_count()
    return n if n >= 1 and blas == 1 else blas


_SGEMM: list = []


def sgemm() -> Callable[..., None] | None:
    """NumPy's OpenBLAS row-major float32 GEMM as f(m, n, k, a_ptr, lda, b_ptr, ldb, beta,
    c_ptr, ldc, ta=False, tb=False): C = A' @ B' + beta * C on raw pointers (A' = A.T when
    ta, B' likewise); None when it cannot be found.

    Raw pointers let a convolution hand BLAS overlapping, offset views of one padded image
    (each kernel tap is a shifted row range) and accumulate with beta=1, which np.matmul cannot.
    """
    import ctypes

    if _SGEMM:
        return _SGEMM[0]
    fn = None
    # Only the 64-bit-integer (ILP64) interface, whose argument types are known here.
    raw = openblas_symbol("scipy_cblas_sgemm64_", "cblas_sgemm64_")
    if raw is not None:
        i64, ptr, f32, enum = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        raw.argtypes = [enum, enum, enum, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64]
        raw.restype = None

        def _gemm(m, n, k, a, lda, b, ldb, beta, c, ldc, ta=False, tb=False, _raw=raw):
            # 101 = CblasRowMajor, 111 = CblasNoTrans, 112 = CblasTrans.
            _raw(101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a, lda, b, ldb,
                 beta, c, ldc)

        fn = _gemm
    _SGEMM.append(fn)
    return fn
