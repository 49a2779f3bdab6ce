"""Normalization on the torch device: BatchNormalization (inference) and LRN, NCHW and NHWC.

Training-mode BatchNormalization, per-activation parameters and the extra outputs run the
reference kernel. LRN is an average pool of the squares along the channel axis (zero padded,
so the pool gives the window sum over `size` directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from opwarden.kernels.torch.runtime import _add, _each, _Mode, _small
from opwarden.kernels.torch.tensors import _call_ref, _nchw_view, _np, _t, _to_nhwc


def _bn_kernel(ref: Callable[..., Any], nhwc: bool, since: int):
    def kernel(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, **attrs):
        x = np.asarray(X)
        if since >= 14:
            training = bool(attrs.get("training_mode", 0))
        elif since >= 7:
            training = noutputs > 1
        else:
            training = noutputs > 1 and not attrs.get("is_test", 0)
        params = (scale, B, mean, var)
        c = x.shape[-1] if (nhwc and x.ndim >= 3) else (x.shape[1] if x.ndim >= 2 else -1)
        plain = all(np.ndim(p) == 1 and np.shape(p)[0] == c for p in params)
        if training or not plain or x.ndim < 2 or not int(attrs.get("spatial", 1)):
            return _call_ref(ref, (X, *params), dict(attrs, epsilon=epsilon), nhwc, noutputs)
        with _Mode(_small(x)):
            t = _nchw_view(x) if nhwc else _t(x)
            ps = [_t(p) for p in params]
            ps = [p if p.dtype == t.dtype else p.to(t.dtype) for p in ps]
            y = F.batch_norm(t, ps[2], ps[3], ps[0], ps[1], False, 0.0, float(epsilon))
            return _to_nhwc(y) if nhwc else _np(y)

    return kernel


def _lrn_t(x: torch.Tensor, size: int, alpha, beta, bias, channels_last: bool) -> torch.Tensor:
    """ONNX LRN: y = x / (bias + alpha/size * sum of squares over a channel window) ** beta.

    The window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; an average pool with zero
    padding (count_include_pad) gives sum/size directly.
    """
    lo, hi = (size - 1) // 2, size // 2
    sq = x * x
    if channels_last:
        # x is (N, *spatial, C) contiguous: pool along the last axis.
        c = sq.shape[-1]
        win = F.avg_pool1d(F.pad(sq.reshape(-1, 1, c), (lo, hi)), size, 1)
        win = win.reshape(sq.shape)
    else:
        n, c = sq.shape[0], sq.shape[1]
        s = sq.reshape(n, 1, c, -1)
        win = F.avg_pool2d(F.pad(s, (0, 0, lo, hi)), (size, 1), 1).reshape(sq.shape)
    return x / win.mul_(float(alpha)).add_(float(bias)).pow_(float(beta))


def _lrn_kernel(ref: Callable[..., Any], nhwc: bool):
    def kernel(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None):
        x = np.asarray(X)
        if size is None or int(size) < 1 or x.ndim < 2 or x.size == 0 or x.dtype.kind != "f":
            return _call_ref(
                ref, (X,), {"alpha": alpha, "beta": beta, "bias": bias, "size": size}, nhwc
            )
        with _Mode(_small(x)):
            t = _t(x)
            if nhwc and x.ndim >= 3:
                return _np(_lrn_t(t, int(size), alpha, beta, bias, True))
            return _np(_lrn_t(t, int(size), alpha, beta, bias, False))

    return kernel


def register() -> None:
    """Add the normalization variants (both layouts) to the torch device."""
    for layout in ("NCHW", "NHWC"):
        nhwc = layout == "NHWC"
        suffix = layout.lower()
        for o in _each("BatchNormalization"):
            _add(o, _bn_kernel(o.reference, nhwc, o.since), f"batchnormalization.torch.{suffix}",
                 layout=layout)
        for o in _each("LRN"):
            _add(o, _lrn_kernel(o.reference, nhwc), f"lrn.torch.{suffix}", layout=layout)
