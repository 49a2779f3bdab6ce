"""Small helpers the ops files share: compute dtypes, integer lists, axes, permutations.

Reference kernels compute narrow floats in a wider type and round once at the end. Families
differ in which types they widen, and each keeps its own numerics, so each rule has its own
name here:

- `wide`: every float narrower than 32 bits (float16, bfloat16, float8, float4) -> float32
  (elementwise math and activations, `apply_wide`);
- `wide_half`: only float16 and bfloat16 -> float32, others as they are (linear algebra and
  normalization, whose type constraints hold no narrower float);
- `work_float`: float64 stays, every other type -> float32 (recurrences, signal transforms,
  losses, the com.microsoft ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.errors import KernelError

try:  # ml_dtypes registers bfloat16 with NumPy (imported via opwarden.dtypes)
    import ml_dtypes

    HALF_FLOATS = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
except ImportError:  # pragma: no cover
    HALF_FLOATS = frozenset({np.dtype(np.float16)})


# How generated code calls a ufunc fastest (the lean loop's direct steps, FusedElementwise's
# program). Ufuncs whose out must go by keyword: NumPy 2.4 deprecates a third positional
# argument for these, which people passed hoping for a three-way extremum. Operands are made
# of the output's shape up to SHAPED_MAX elements: NumPy runs a tiny call between same-shaped
# contiguous operands on its trivial loop and builds a broadcasting iterator for any other.
KEYWORD_OUT = frozenset({np.maximum, np.minimum})
SHAPED_MAX = 256


def is_float_dtype(dt: np.dtype) -> bool:
    """True for IEEE floats and ml_dtypes floats (bfloat16, float8, float4: kind 'V')."""
    return dt.kind == "f" or dt.name.startswith(("bfloat", "float"))


def wide(x: np.ndarray) -> np.ndarray:
    """Floats narrower than 32 bits are computed in float32 (one rounding back at the end)."""
    if is_float_dtype(x.dtype) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def wide_half(x: np.ndarray) -> np.ndarray:
    """float16/bfloat16 computed in float32 (rounded once at the end); others as they are."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype in HALF_FLOATS else x


def work_float(dt: np.dtype) -> np.dtype:
    """The float type to compute in: float64 for float64, float32 for every other type."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def apply_wide(fn: Callable[..., Any], *xs: np.ndarray, dtype: Any = None) -> np.ndarray:
    """fn on the inputs (narrow floats widened), without floating-point warnings, cast to
    `dtype` (default: input 0's dtype)."""
    out = xs[0].dtype if dtype is None else np.dtype(dtype)
    with np.errstate(all="ignore"):
        r = fn(*(wide(x) for x in xs))
        return np.asarray(r).astype(out, copy=False)


def ints(x: Any, what: str) -> list[int]:
    """A 1-D integer input or attribute (tensor, list or None) as a list of Python ints."""
    if x is None:
        return []
    arr = np.asarray(x)
    if arr.ndim > 1:
        raise KernelError(f"{what} must be a 1-D tensor, got shape {arr.shape}")
    return [int(v) for v in arr.reshape(-1)]


def axis_index(axis: Any, rank: int, what: str = "axis", *, scalar_ok: bool = False) -> int:
    """A possibly negative axis normalized into [0, rank). ``scalar_ok``: a rank-0 tensor
    takes axis 0 too (ops that treat a scalar as one element)."""
    a = int(axis)
    if not -rank <= a < (max(rank, 1) if scalar_ok else rank):
        raise KernelError(f"{what} {a} is out of range for a tensor of rank {rank}")
    return a + rank if a < 0 else a


def one_value(x: Any, what: str) -> Any:
    """The single value of a scalar (or one-element) input."""
    arr = np.asarray(x)
    if arr.size != 1:
        raise KernelError(f"{what} must hold exactly one value, got shape {arr.shape}")
    return arr.reshape(-1)[0]


def axes_indices(axes: Any, rank: int, what: str = "axes") -> list[int]:
    """A list of axes normalized (see `axis_index`); duplicates are an error."""
    out = [axis_index(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise KernelError(f"{what} {list(axes)} contains duplicates")
    return out


def interp_float(dt: np.dtype) -> np.dtype:
    """The float type to resample in: float64 for float64 and integer or bool inputs (exact
    coordinates for every integer value), float32 for the other floats."""
    if dt == np.float64 or dt.kind in "iub":
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def normal(rng: np.random.Generator, dtype: Any = np.float32) -> Callable[..., np.ndarray]:
    """shape -> standard normal samples in `dtype` (how the ops' samples make float inputs)."""
    return lambda *shape: rng.standard_normal(shape).astype(dtype)


def broadcast_shapes(*shapes: Any) -> tuple | None:
    """Multidirectional broadcast of fact shapes (dims may be symbolic; None where unknown)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) == 1:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            named = {d for d in dims if d != 1}
            out.append(named.pop() if len(named) == 1 else None)
    return tuple(out)


def transpose_perm(perm, rank: int) -> list[int] | None:
    """Transpose's permutation (the reversal when absent), None if not one of `rank` dims."""
    p = list(range(rank))[::-1] if perm is None else [int(x) for x in perm]
    return p if sorted(p) == list(range(rank)) else None


def transpose_keeps_order(attrs, shape) -> bool:
    """Whether Transpose(perm) of a C-contiguous array of `shape` is C-contiguous: the
    non-1 dims keep their order (moving size-1 dims is a reshape)."""
    p = transpose_perm(attrs.get("perm"), len(shape))
    moved = [a for a in p or () if shape[a] != 1]
    return p is not None and moved == sorted(moved)
