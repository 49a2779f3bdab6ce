"""NumPy <-> torch for the torch kernels: tensors over the kernels' arrays, results back as
arrays, channels-last views, and the reference fallback.

On the CPU `torch.from_numpy` and `.numpy()` share memory, so crossing between this device and
`cpu` costs nothing; on CUDA every kernel uploads its inputs and downloads its result, and
constants (memory.constants) are uploaded once and cached (`_CONSTS`, which also holds what
kernels derive from constant weights: packed or regrouped weights, branch plans).

NHWC variants take an (N, *spatial, C) array: `_nchw_view` makes it a logical NCHW tensor that is
channels-last in memory (oneDNN convolves that layout fastest), `_to_nhwc` turns a logical NCHW
result back into a contiguous NHWC array. `_call_ref` runs the operator's reference kernel on
(possibly NHWC) data for anything a kernel cannot express in torch.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from opwarden.kernels.torch.runtime import _CUDA, _TARGET
from opwarden.memory.constants import is_constant


class _ConstCache:
    """Tensors made from constant arrays (initializers, memory.constants), keyed by the array,
    freed with it."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, str], tuple[weakref.ref, Any]] = {}

    def get(self, arr: np.ndarray, kind: str, make: Callable[[np.ndarray], Any]) -> Any:
        key = (id(arr), kind)
        hit = self._items.get(key)
        if hit is not None and hit[0]() is arr:
            return hit[1]
        value = make(arr)
        items = self._items
        try:
            ref = weakref.ref(arr, lambda _r, key=key: items.pop(key, None))
        except TypeError:  # pragma: no cover - ndarrays support weak references
            return value
        items[key] = (ref, value)
        return value

    def clear(self) -> None:
        self._items.clear()


_CONSTS = _ConstCache()


_READONLY_WARNED = False


def _readonly_tensor(x: np.ndarray) -> torch.Tensor:
    """from_numpy of a read-only array (our kernels never write into inputs).

    torch warns about read-only arrays once per process; that first time is silenced here, and
    afterwards torch stays quiet, so later calls pay nothing for it.
    """
    global _READONLY_WARNED
    if _READONLY_WARNED:
        return _host_tensor(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = _host_tensor(x)
    _READONLY_WARNED = True
    return t


def _host_tensor(x: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing x's memory (a copy only for layouts torch cannot view)."""
    try:
        return torch.from_numpy(x)
    except (TypeError, ValueError, RuntimeError):
        # Negative strides or a non-native byte order: torch needs a plain copy.
        y = np.ascontiguousarray(x)
        if not y.dtype.isnative:
            y = y.astype(y.dtype.newbyteorder("="))
        return torch.from_numpy(y)


def _upload(x: np.ndarray) -> torch.Tensor:
    return _readonly_tensor(x).to(_TARGET)


def _t(x: Any) -> torch.Tensor:
    """The tensor for a kernel input (None stays None)."""
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if _CUDA and is_constant(x):
        # Initializers (memory.constants) are uploaded once.
        return _CONSTS.get(x, "t", _upload)
    t = _host_tensor(x) if x.flags.writeable else _readonly_tensor(x)
    return t.to(_TARGET) if _CUDA else t


def _opt(x: Any) -> torch.Tensor | None:
    return None if x is None else _t(x)


def _np(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous host array for a result tensor."""
    if _CUDA:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def _ret(y: torch.Tensor, out: np.ndarray | None) -> np.ndarray:
    """y as an array, written into the planned buffer `out` when there is one."""
    if out is None:
        return _np(y)
    torch.from_numpy(out).copy_(y)
    return out


def _out_t(out: np.ndarray | None) -> torch.Tensor | None:
    """A tensor over the planned buffer that torch ops may write with out= (CPU only)."""
    if out is None or _CUDA:
        return None
    return torch.from_numpy(out)


def _nchw_view(x: np.ndarray) -> torch.Tensor:
    """An NHWC (N, *spatial, C) array as a logical NCHW tensor (channels-last in memory)."""
    t = _t(x)
    if t.ndim < 3:
        return t
    return t.permute(0, t.ndim - 1, *range(1, t.ndim - 1))


def _to_nhwc(t: torch.Tensor) -> np.ndarray:
    """A logical NCHW result as a contiguous NHWC array."""
    if t.ndim < 3:
        return _np(t)
    return _np(t.permute(0, *range(2, t.ndim), 1))


def _nchw_of(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def _nhwc_of(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if y.ndim >= 3 else y


def _call_ref(ref: Callable[..., Any], args: tuple, kw: dict, nhwc: bool, noutputs=None):
    """The reference kernel on (possibly NHWC) data; only output 0 changes layout."""
    if noutputs is not None and _wants(ref, "noutputs"):
        kw = dict(kw, noutputs=noutputs)
    if not nhwc:
        return ref(*args, **kw)
    args = (_nchw_of(np.asarray(args[0])),) + tuple(args[1:])
    res = ref(*args, **kw)
    if isinstance(res, tuple):
        return (_nhwc_of(np.asarray(res[0])),) + res[1:]
    return _nhwc_of(np.asarray(res))


def _wants(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _pad_arg(begin, end) -> list[int]:
    """F.pad's argument (last axis first) for spatial pads."""
    flat: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        flat += [b, e]
    return flat


def _tup(v) -> tuple:
    return tuple(v) if v else ()

