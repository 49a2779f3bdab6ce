"""Cast between float32 and float16 on the compiled conversion (native/cast.c): cast.cpu.native.

float16 models run as float32 islands between Casts (passes/fp16_islands), so a converted BERT
makes ~200 of them a run, each 10^5..10^6 elements; NumPy's astype converts float16 in
software (2..5 ns an element), the compiled loop with F16C / AVX512F (~0.1 ns). The results
are NumPy's bit for bit (NaN payloads too), so the variant is the reference's result on
every input it takes. Every other cast (other types, a `to` that is neither FLOAT16 from
float32 nor FLOAT from float16) is not given to it (`when`), and one that reaches it anyway
(a dtype placement did not know) runs the reference's conversion, cast_array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opwarden import native
from opwarden.kernels.cpu.blas_split import share
from opwarden.ops.base import REGISTRY
from opwarden.ops.cast import cast_array, to_target_dtype

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
PAIRS = frozenset({(F32, F16), (F16, F32)})
# Below this many elements NumPy's astype (~3 us at 1024) is as fast as the variant's call
# into the extension (~2 us of argument checks and buffer parsing).
SMALL = 1024
# OpenMP threads (the session's) only from this many elements: a conversion is ~0.1 ns an
# element in cache, and on 2 threads a region cost ~60 us more up to 1M elements here.
THREADS_MIN = 1 << 21
BLOCK = 1 << 14  # elements per block shared out by blas_split.share


def _lib():
    return getattr(native, "_LIB", None)


def _target(to: Any) -> np.dtype | None:
    try:
        return to_target_dtype(to)
    except Exception:  # noqa: BLE001 - a `to` that cannot be read is the reference's to reject
        return None


def cast_when(x, *_: Any, to=None, **__: Any) -> bool:
    """float32 to FLOAT16 or float16 to FLOAT, extension built."""
    dt = _target(to)
    return (native.available() and x.dtype is not None and dt is not None
            and (np.dtype(x.dtype), dt) in PAIRS)


def convert(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y = x.astype(y.dtype) on the compiled loop, float32 <-> float16: both C-contiguous, of
    one size, apart in memory (the extension loaded); large arrays shared out over the
    session's threads as the other compiled kernels (blas_split.share). Returns y."""
    lib, n, to_half = _lib(), x.size, y.dtype == F16
    if n < THREADS_MIN:
        lib.cast_f16(x, y, 0, n, to_half, -1, 1)
        return y

    def run(span: tuple[int, int], threads: int) -> None:
        lib.cast_f16(x, y, span[0], span[1] - span[0], to_half, -1, threads)

    share(n, BLOCK, n, run)
    return y


def _convert(x: np.ndarray, dt: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """x (float32 or float16, the other one than dt) as dt, into `out` where it fits."""
    y = None
    if (out is not None and out.dtype == dt and out.shape == x.shape
            and out.flags.c_contiguous and out.flags.writeable):
        y = out
    if x.size < SMALL:
        if y is None:
            return x.astype(dt)
        np.copyto(y, x, casting="unsafe")  # (the same conversion loop as astype)
        return y
    if y is None or np.may_share_memory(x, y):  # (a plan never puts a Cast over its input)
        y = np.empty(x.shape, dt)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # (a copy in x's own type is exact and still cheaper)
    return convert(x, y)


def _fallback(x, dt: np.dtype | None, to, saturate, round_mode) -> np.ndarray:
    if dt is None:
        dt = to_target_dtype(to)  # raises the reference's error
    return cast_array(x, dt, bool(saturate), round_mode)


def cast_native(input, *, to=None, saturate=1, round_mode="up", out=None):
    """Cast float32 <-> float16 on the compiled loop (NumPy's bits); any other cast runs
    the reference's conversion."""
    dt = _target(to)
    x = input
    if (dt is None or not isinstance(x, np.ndarray) or (x.dtype, dt) not in PAIRS
            or _lib() is None):
        return _fallback(x, dt, to, saturate, round_mode)
    return _convert(x, dt, out)


def _specialize(kwargs: Mapping[str, Any]) -> Callable[..., Any]:
    """cast_native with `to` read once for the node."""
    dt = _target(kwargs.get("to"))

    def bound(input, *, to=None, saturate=1, round_mode="up", out=None):
        if (dt is None or not isinstance(input, np.ndarray) or (input.dtype, dt) not in PAIRS
                or _lib() is None):
            return _fallback(input, _target(to), to, saturate, round_mode)
        return _convert(input, dt, out)

    return bound


def register() -> None:
    """cast.cpu.native on every Cast version, where the extension is in use."""
    if not native.available():
        return
    for opdef in REGISTRY.versions("Cast"):
        opdef.kernel("cpu", dtypes=["float32", "float16"], priority=10, when=cast_when,
                     accepts_out=True, name="cast.cpu.native",
                     specialize=_specialize)(cast_native)
