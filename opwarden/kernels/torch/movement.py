"""Data movement on the torch device: Concat, Transpose, ChannelShuffle, and the view ops.

Transposes that only reorder a small trailing block of axes (a channel shuffle spelt as
Reshape -> Transpose -> Reshape) gather the block through a cached index; others are torch's
permuted copy. ChannelShuffle (the passes' fused op) is one torch copy of the transposed view into
the planned buffer when it is large, else the host kernel (kernels.cpu.shuffle). Reshape, Flatten,
Squeeze, Unsqueeze, Identity, Dropout and Split run their NumPy reference kernels, which already
return views, on either side of a device boundary.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from opwarden.errors import KernelError
from opwarden.kernels.cpu.shuffle import DTYPES as _SHUFFLE_DTYPES
from opwarden.kernels.cpu.shuffle import channel_shuffle
from opwarden.kernels.torch.runtime import (
    _CUDA,
    _SERIAL_ELEMENTS,
    NUMERIC,
    _add,
    _add_simple,
    _each,
    _Mode,
    _small,
)
from opwarden.kernels.torch.tensors import _host_tensor, _np, _out_t, _ret, _t

# Channel shuffles of at least this many elements run as one torch copy (its threads); smaller
# ones as the host kernel, whose call costs less.
_SHUFFLE_TORCH_MIN = 1 << 14
SHUFFLE_IN_TORCH = True


def _channel_shuffle(X, *, group=1, out=None):
    """ChannelShuffle (Y[..., j*g + i] = X[..., i*(C/g) + j]) as a torch copy of the
    transposed (rows, g, C/g) view into `out` when it is large; else the host kernel."""
    x = np.asarray(X)
    g = int(group)
    c = x.shape[-1] if x.ndim else 0
    if (not SHUFFLE_IN_TORCH or _CUDA or x.size < _SHUFFLE_TORCH_MIN or g < 2 or c % g
            or x.dtype != np.float32 or not x.flags.c_contiguous):
        return channel_shuffle(x, group=g, out=out)
    src = _host_tensor(x).view(-1, g, c // g).transpose(1, 2)
    with _Mode():
        if out is not None and out.shape == x.shape and out.dtype == x.dtype \
                and out.flags.c_contiguous and not np.may_share_memory(out, x):
            torch.from_numpy(out).view(-1, c // g, g).copy_(src)
            return out
        return src.contiguous().view(x.shape).numpy()


def _concat(*inputs, axis=None, out=None):
    if axis is None:
        raise KernelError("Concat needs the attribute axis")
    with _Mode(sum(np.size(x) for x in inputs) < _SERIAL_ELEMENTS):
        ts = [_t(x) for x in inputs]
        o = _out_t(out)
        if o is not None:
            torch.cat(ts, dim=int(axis), out=o)
            return out
        return _ret(torch.cat(ts, dim=int(axis)), out)


_GATHERS: dict[tuple, torch.Tensor] = {}
_GATHER_MAX = 4096


def _inner_gather(shape: tuple, p: list[int]) -> torch.Tensor | None:
    """For a perm that only reorders a small trailing block of axes, the flat source index of
    each element of the transposed block (None for other perms).

    A channel shuffle (..., g, c) -> (..., c, g) is such a perm; gathering the block through a
    cached index (index_select) is faster than torch's strided copy and NumPy's.
    """
    k = 0
    while k < len(p) and p[k] == k:
        k += 1
    inner = shape[k:]
    n = math.prod(inner)
    if k == 0 or n > _GATHER_MAX or math.prod(shape[:k]) < 16:
        return None
    key = (inner, tuple(p[k:]))
    idx = _GATHERS.get(key)
    if idx is None:
        if len(_GATHERS) > 256:
            _GATHERS.clear()
        local = [a - k for a in p[k:]]
        idx = _GATHERS[key] = torch.arange(n).reshape(inner).permute(*local).reshape(-1)
    return idx


def _transpose(data, *, perm=None):
    x = np.asarray(data)
    p = list(perm) if perm else list(range(x.ndim))[::-1]
    if p == list(range(x.ndim)):
        return x.copy()
    with _Mode(_small(x)):
        t = _t(x)
        idx = None if _CUDA else _inner_gather(x.shape, p)
        if idx is not None:
            n = idx.numel()
            y = t.reshape(-1, n).index_select(1, idx)
            return y.numpy().reshape([x.shape[a] for a in p])
        # torch's permuted copy beats NumPy's; a perm that only moves unit axes is already
        # contiguous, and must still not share the input.
        y = t.permute(*p).contiguous()
        if y.data_ptr() == t.data_ptr():
            y = y.clone()
        return _np(y)


def register() -> None:
    """Add the data-movement variants to the torch device."""
    _add_simple({
        "Concat": (_concat, NUMERIC, True),
        "Transpose": (_transpose, NUMERIC, False),
    })
    # Pure data movement: the NumPy kernel already returns views, on either side of a boundary.
    for op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Split"):
        for o in _each(op_type):
            _add(o, o.reference, f"{op_type.lower()}.torch", dtypes=None)
    if not _CUDA:
        # A channel shuffle is one copy into the planned buffer (_channel_shuffle), not
        # Reshape -> Transpose -> Reshape.
        for o in _each("ChannelShuffle", "opwarden"):
            _add(o, _channel_shuffle, "channelshuffle.torch", dtypes=_SHUFFLE_DTYPES,
                 accepts_out=True)
