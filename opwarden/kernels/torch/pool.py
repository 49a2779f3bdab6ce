"""Pools on the torch device: MaxPool, AveragePool (NCHW and NHWC), GlobalAveragePool and
GlobalMaxPool.

The geometry is the operator's (ops.pool.pool_geometry), worked out once per input shape and
attributes (`_pool_plan`, cached). Symmetric pads up to half the window are torch's `padding`;
max pools padded only at the end (TF's SAME) take torch's padding plus `ceil_mode` where the
windows are the same (`POOL_END_BY_CEIL`); other pads a -inf padded copy of exactly what the
windows read (max), or window sums over a zero-padded copy divided by a pooled mask of what the
ONNX divisor counts (average). NHWC 2-D max pools run separably on the host pool's plan
(kernels.cpu.pool, in one band of all output rows; `_SEPARABLE_MAXPOOL`): whole rows folded along
H into a W-padded band, then its columns along W, each tap one torch.maximum over strided views,
rows a tap would read from the padding left out (no padded copy). Dilated average pools,
MaxPool's Indices and integer inputs run the reference kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from opwarden.errors import KernelError
from opwarden.kernels.cpu.pool import COPY as _POOL_COPY
from opwarden.kernels.cpu.pool import UFUNC as _POOL_UFUNC
from opwarden.kernels.cpu.pool import _plan as _host_pool_plan
from opwarden.kernels.torch.runtime import _add, _each, _Mode, _small
from opwarden.kernels.torch.tensors import (
    _call_ref,
    _nchw_view,
    _np,
    _pad_arg,
    _t,
    _to_nhwc,
    _tup,
)
from opwarden.ops.pool import pool_geometry as _pool_setup


def _pool_geometry(shape, attrs: dict):
    return _pool_setup(
        tuple(shape), attrs.get("kernel_shape"), attrs.get("strides"), attrs.get("dilations"),
        attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0),
    )


_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


POOL_END_BY_CEIL = True


def _simple_pads(kernel, d, begin, end) -> bool:
    """Symmetric pads torch can take as `padding`: at most half the kernel size (torch checks
    the undilated size: a dilated 3-tap window with pads 2 is refused)."""
    return begin == end and all(0 <= b <= k // 2 for b, k in zip(begin, kernel))


def _torch_pool_out(n: int, k: int, s: int, d: int, p: int, ceil: bool) -> int:
    """torch's pooled size of an axis of n (symmetric padding p): with ceil_mode the last
    window must still start inside the input or its left padding."""
    span = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    o = span // s + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def _end_pads_by_ceil(xs, kernel, s, d, begin, end, out) -> bool:
    """Whether torch's max pool with `padding=begin` and ceil_mode gives exactly the windows of
    pads (begin, end), end >= begin: windows start at the same places and both ignore what lies
    outside the input, so equal output sizes mean equal results, with no padded copy. (The SAME
    pads of TF exports, [0, 0, 1, 1] for a 3x3 stride-2 pool, are this case.)"""
    return all(
        e >= b and 0 <= b <= k // 2 and _torch_pool_out(n, k, st, di, b, True) == o
        for n, k, st, di, b, e, o in zip(xs, kernel, s, d, begin, end, out)
    )


def _maxpool_t(x: torch.Tensor, geom) -> torch.Tensor:
    kernel, s, d, begin, end, out, extra, simple = geom[:8]
    pool = _MAXPOOL[len(kernel)]
    ceil = any(extra)
    if simple:
        y = pool(x, kernel, s, begin, d, ceil_mode=ceil or simple == "ceil")
    else:
        # Padded with -inf to exactly the extent the `out` windows read (torch's own ceil rule
        # keeps a last window that starts in the end padding, which ONNX drops): floor mode.
        fit = [(o - 1) * st + (k - 1) * di + 1 - n - b
               for n, k, st, di, b, o in zip(x.shape[2:], kernel, s, d, begin, out)]
        xp = F.pad(x, _pad_arg(begin, fit), value=-math.inf)
        y = pool(xp, kernel, s, 0, d)
    if y.shape[2:] != out:  # pragma: no cover - geometry rules agree
        raise KernelError(f"MaxPool: torch produced spatial {list(y.shape[2:])}, expected {out}")
    return y


# NHWC 2-D max pools run separably (module docstring): torch's own channels-last max pool also
# tracks the argmax indices, which costs it more than the separate taps.
_SEPARABLE_MAXPOOL = True


def _maxpool_sep_plan(xs: tuple, geom) -> tuple:
    """(host plan steps, whether the band is x itself, band shape, y shape) of a separable
    NHWC 2-D max pool: buffers 0 = x, 1 = the band, 2 = y."""
    kernel, s, d, begin, _end, out = geom[:6]
    steps, direct, band_shape = _host_pool_plan(xs, kernel, s, d, begin, out, None,
                                                band_bytes=1 << 62)
    return steps, direct, band_shape, (xs[0], *out, xs[3])


def _maxpool_sep(x: torch.Tensor, plan: tuple) -> torch.Tensor:
    """Run a separable max pool plan on an NHWC tensor: the NHWC result."""
    steps, direct, band_shape, y_shape = plan
    bufs = (x, x if direct else x.new_empty(band_shape), x.new_empty(y_shape))
    maximum = torch.maximum
    for code, dst, di, a, ai, b, bi in steps:
        if code == _POOL_UFUNC:
            maximum(bufs[a][ai], bufs[b][bi], out=bufs[dst][di])
        elif code == _POOL_COPY:
            bufs[dst][di].copy_(bufs[a][ai])
        else:  # FILL (max pools have no SCALE steps)
            bufs[dst][di].fill_(-math.inf)
    return bufs[2]


def _avgpool_t(x: torch.Tensor, geom, cip: bool) -> torch.Tensor:
    kernel, s, d, begin, end, out, extra, simple = geom[:8]
    pool = _AVGPOOL[len(kernel)]
    if simple:
        y = pool(x, kernel, s, begin, ceil_mode=any(extra), count_include_pad=cip)
    else:
        # Window means over the explicitly padded input, divided by the mean of a mask of the
        # elements the ONNX divisor counts: those in the input, or with count_include_pad those
        # in the padded input but not in the ceil_mode extension.
        full = [e + t for e, t in zip(end, extra)]
        total = pool(F.pad(x, _pad_arg(begin, full)), kernel, s, 0)
        ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
        if cip:
            mask = F.pad(F.pad(ones, _pad_arg(begin, end), value=1.0),
                         _pad_arg([0] * len(extra), extra))
        else:
            mask = F.pad(ones, _pad_arg(begin, full))
        y = total.div_(pool(mask, kernel, s, 0))
    if y.shape[2:] != out:  # pragma: no cover - geometry rules agree
        raise KernelError(f"AveragePool: torch produced spatial {list(y.shape[2:])}, want {out}")
    return y


_POOL_PLANS: dict[tuple, Any] = {}


def _pool_plan(x: np.ndarray, attrs: dict, nhwc: bool, kind: str):
    """Pool geometry for this input shape and these attributes, or None (reference kernel)."""
    xs = x.shape
    key = (
        xs, x.dtype, nhwc, kind, _tup(attrs.get("kernel_shape")), _tup(attrs.get("strides")),
        _tup(attrs.get("pads")), _tup(attrs.get("dilations")), attrs.get("auto_pad", "NOTSET"),
        attrs.get("ceil_mode", 0),
    )
    try:
        return _POOL_PLANS[key]
    except KeyError:
        pass
    geom = None
    dil = attrs.get("dilations")
    ok = 3 <= len(xs) <= 5 and x.dtype.kind == "f" and x.size > 0
    if kind == "avg":  # torch's average pools have no dilation
        ok = ok and not (dil and any(int(v) != 1 for v in dil))
    if ok:
        logical = (xs[0], xs[-1], *xs[1:-1]) if nhwc else xs
        try:
            kernel, st, d, begin, end, out, extra = _pool_geometry(logical, attrs)
            simple = _simple_pads(kernel, d, begin, end)
            if kind == "avg" and any(p >= k for p, k in zip(begin + end, kernel + kernel)):
                # A window wholly in the padding averages nothing: the reference's NaN (ORT
                # refuses such pads), where torch's mask division gave numbers.
                raise KernelError("pads not smaller than the window")
            if (not simple and kind == "max" and POOL_END_BY_CEIL
                    and _end_pads_by_ceil(logical[2:], kernel, st, d, begin, end, out)):
                simple = "ceil"
            geom = (kernel, st, d, begin, end, tuple(out), extra, simple)
            if kind == "max" and nhwc and len(kernel) == 2:
                geom += (_maxpool_sep_plan(xs, geom),)
        except KernelError:
            geom = None
    if len(_POOL_PLANS) > 4096:
        _POOL_PLANS.clear()
    _POOL_PLANS[key] = geom
    return geom


def _pool_kernel(ref: Callable[..., Any], nhwc: bool, kind: str, has_indices: bool = False):
    """MaxPool/AveragePool; dilated average pools, Indices and integer inputs use the reference."""

    def kernel(X, *, noutputs=1, **attrs):
        x = X if isinstance(X, np.ndarray) else np.asarray(X)
        geom = None if (has_indices and noutputs > 1) else _pool_plan(x, attrs, nhwc, kind)
        if geom is None:
            return _call_ref(ref, (X,), attrs, nhwc, noutputs if has_indices else None)
        with _Mode(_small(x)):
            if len(geom) > 8 and _SEPARABLE_MAXPOOL:  # an NHWC 2-D max pool
                return _np(_maxpool_sep(_t(x), geom[8]))
            t = _nchw_view(x) if nhwc else _t(x)
            if kind == "max":
                y = _maxpool_t(t, geom)
            else:
                y = _avgpool_t(t, geom, bool(attrs.get("count_include_pad", 0)))
            return _to_nhwc(y) if nhwc else _np(y)

    if has_indices:
        return kernel

    def kernel1(X, **attrs):
        return kernel(X, **attrs)

    return kernel1


def _global_kernel(ref: Callable[..., Any], nhwc: bool, reduce: str):
    def kernel(X):
        x = np.asarray(X)
        if x.ndim < 3 or x.size == 0:
            return _call_ref(ref, (X,), {}, nhwc)
        with _Mode(_small(x)):
            t = _t(x)
            dims = tuple(range(1, x.ndim - 1)) if nhwc else tuple(range(2, x.ndim))
            y = t.mean(dim=dims, keepdim=True) if reduce == "mean" else t.amax(dims, keepdim=True)
            return _np(y)

    return kernel


def register() -> None:
    """Add the pool variants (both layouts) to the torch device."""
    for layout in ("NCHW", "NHWC"):
        nhwc = layout == "NHWC"
        suffix = layout.lower()
        for o in _each("MaxPool"):
            fn = _pool_kernel(o.reference, nhwc, "max", has_indices=o.since >= 8)
            _add(o, fn, f"maxpool.torch.{suffix}", layout=layout)
        for o in _each("AveragePool"):
            fn = _pool_kernel(o.reference, nhwc, "avg")
            _add(o, fn, f"averagepool.torch.{suffix}", layout=layout)
        for o in _each("GlobalAveragePool"):
            _add(o, _global_kernel(o.reference, nhwc, "mean"), f"globalaveragepool.torch.{suffix}",
                 layout=layout)
        for o in _each("GlobalMaxPool"):
            _add(o, _global_kernel(o.reference, nhwc, "max"), f"globalmaxpool.torch.{suffix}",
                 layout=layout)
