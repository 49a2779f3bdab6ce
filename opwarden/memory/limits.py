"""Memory limits: the default budget, and allocation checks for ops whose size comes from data.

Static shapes are checked when a plan is made. Some operators take their output size from input
*values* (ConstantOfShape, Expand, Tile, Range, ...), which no plan can know; their kernels are
wrapped so that the requested size is computed from the actual inputs and refused before any
allocation when it exceeds the limit.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import MemoryLimitError

DEFAULT_SHARE = 0.75  # of physical memory


def physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_limit() -> int:
    """The default memory limit: a safe share of this machine's physical memory."""
    return int(physical_memory() * DEFAULT_SHARE)


def describe_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _count(shape: Any) -> int:
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    if any(d < 0 for d in dims):
        return 0  # invalid shapes are the kernel's to report
    n = 1
    for d in dims:
        n *= d
    return n


def _itemsize(x: Any, default: int = 4) -> int:
    return x.dtype.itemsize if isinstance(x, np.ndarray) else default


def _constant_of_shape(shape, *, value=None, **_):
    return _count(shape) * (value.dtype.itemsize if isinstance(value, np.ndarray) else 4)


def _expand(x, shape, **_):
    want = [int(d) for d in np.asarray(shape).reshape(-1)]
    have = list(np.shape(x))
    n = max(len(want), len(have))
    want = [1] * (n - len(want)) + want
    have = [1] * (n - len(have)) + have
    return _count([max(a, b) for a, b in zip(want, have)]) * _itemsize(x)


def _tile(x, repeats, **_):
    reps = [int(r) for r in np.asarray(repeats).reshape(-1)]
    if len(reps) != np.ndim(x):
        return 0
    return _count([d * r for d, r in zip(np.shape(x), reps)]) * _itemsize(x)


def _range(start, limit, delta, **_):
    try:
        s, e, d = float(np.asarray(start)), float(np.asarray(limit)), float(np.asarray(delta))
    except (TypeError, ValueError):
        return 0
    if d == 0 or not np.isfinite([s, e, d]).all():
        return 0
    return max(int(np.ceil((e - s) / d)), 0) * _itemsize(start, 8)


# op_type -> f(*inputs, **attrs) -> output bytes (computed from the actual input values)
PREDICTORS: dict[str, Callable[..., int]] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
}


def guard_allocation(fn: Callable[..., Any], node: Any, limit: int) -> Callable[..., Any]:
    """Wrap a kernel whose output size comes from input values with a pre-allocation check."""
    predict = PREDICTORS.get(node.op_type) if node.domain == "" else None
    if predict is None:
        return fn

    @functools.wraps(fn)
    def checked(*args: Any, **kw: Any) -> Any:
        try:
            need = int(predict(*args, **kw))
        except Exception:  # noqa: BLE001 - malformed inputs are the kernel's to report
            need = 0
        if need > limit:
            raise MemoryLimitError(
                f"node {node.label} would allocate {describe_bytes(need)}, more than the memory "
                f"limit of {describe_bytes(limit)} (SessionOptions.memory_limit_bytes); refused "
                "before allocating"
            )
        return fn(*args, **kw)

    return checked
