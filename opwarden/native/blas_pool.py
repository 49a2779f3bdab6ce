"""NumPy's OpenBLAS running its parallel jobs on the extension's OpenMP threads.

Two thread pools on the same cores get in each other's way: after each GEMM OpenBLAS's worker
busy-waits on the core that the OpenMP worker of the next compiled pass (an epilogue, a
depthwise conv, a LayerNorm) needs, and that pass waits for it. OpenBLAS >= 0.3.27 (pthreads
build) takes a threading callback; native/blas_pool.c's runs each call's jobs on an OpenMP team,
so one set of workers serves both. Installed when the extension loads; `OPWARDEN_BLAS_POOL=
openblas` keeps OpenBLAS's own threads. Figures: benchmarks/NOTES.md, session #10.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from opwarden.blas import openblas_symbol

_SETTER = ("scipy_openblas_set_threads_callback_function64_",
           "openblas_set_threads_callback_function64_", "openblas_set_threads_callback_function")
_PARALLEL = ("scipy_openblas_get_parallel64_", "openblas_get_parallel64_",
             "openblas_get_parallel")

# [pool, reason]: pool "openmp" (the extension's threads) or "openblas" (its own).
_STATE: list[str] = ["openblas", "compiled extension not loaded"]


def _setter() -> tuple[int | None, str]:
    """(address of OpenBLAS's callback setter, "") or (None, why not)."""
    fn = openblas_symbol(*_SETTER)
    if fn is None:
        return None, "NumPy's OpenBLAS takes no threading callback (before 0.3.27, or another BLAS)"
    par = openblas_symbol(*_PARALLEL)
    if par is None or int(par()) != 1:
        return None, "NumPy's OpenBLAS is not its pthreads build"
    return ctypes.cast(fn, ctypes.c_void_p).value, ""


def set_pool(lib: Any, on: bool) -> bool:
    """OpenBLAS's parallel jobs on the extension's OpenMP threads (on) or OpenBLAS's own (off);
    False (nothing changed) where it cannot be done. Waits for a BLAS call in flight."""
    if lib is None:
        return False
    if on and not lib.openmp():
        _STATE[:] = ["openblas", "the extension was built without OpenMP"]
        return False
    addr, why = _setter()
    if addr is None:
        _STATE[:] = ["openblas", why]
        return False
    if not lib.blas_pool_set(addr, on):
        return False
    _STATE[:] = (["openmp", "OpenBLAS's jobs run on the extension's OpenMP threads"] if on
                 else ["openblas", "OpenBLAS's own threads (set_blas_pool(False))"])
    return True


def _forked() -> None:
    if _STATE[0] == "openmp":  # (blas_pool.c's fork handler gave the child OpenBLAS's threads)
        _STATE[:] = ["openblas", "OpenBLAS's own threads (a forked child)"]


def _opted_out() -> bool:
    return os.environ.get("OPWARDEN_BLAS_POOL", "openmp").strip().lower() == "openblas"


def wanted() -> bool:
    """Whether install() will try the shared pool (asked before the extension loads)."""
    return not _opted_out() and _setter()[0] is not None


def install(lib: Any) -> None:
    """At load: the shared pool unless OPWARDEN_BLAS_POOL=openblas."""
    if lib is None:
        return
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked)
    if _opted_out():
        _STATE[:] = ["openblas", "OpenBLAS's own threads (OPWARDEN_BLAS_POOL=openblas)"]
        return
    set_pool(lib, True)


def state() -> tuple[str, str]:
    """(pool, reason): pool "openmp" or "openblas"."""
    return _STATE[0], _STATE[1]
