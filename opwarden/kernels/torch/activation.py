"""Activations on the torch device: the standalone operators (Relu, Sigmoid, Tanh, LeakyRelu,
HardSwish, HardSigmoid, Elu, Gelu, Clip) and `_activate_`, the fused operators' epilogue (in place
on a fresh result).

Relu, Sigmoid, Tanh and Clip write a planned output buffer with torch's `out=`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from opwarden.errors import KernelError
from opwarden.kernels.torch.runtime import FLOATS, INTS, _add, _add_simple, _each, _Mode, _small
from opwarden.kernels.torch.tensors import _np, _out_t, _ret, _t
from opwarden.ops.fused import ACTIVATIONS

_MAX_F = 3.4028234663852886e38


def _activate_(y: torch.Tensor, activation: str, params) -> torch.Tensor:
    """Apply a fused activation to a fresh result, in place where torch can."""
    if not activation:
        return y
    p = [float(v) for v in (params or ())]
    if activation == "Relu":
        return y.relu_()
    if activation == "Clip":
        lo = p[0] if len(p) > 0 else -math.inf
        hi = p[1] if len(p) > 1 else math.inf
        return y.clamp_(lo, hi)
    if activation == "LeakyRelu":
        return F.leaky_relu_(y, p[0] if p else 0.01)
    if activation == "Sigmoid":
        return y.sigmoid_()
    if activation == "Tanh":
        return y.tanh_()
    if activation == "HardSwish":
        return F.hardswish(y, inplace=True)
    if activation == "Gelu":
        return F.gelu(y, approximate="tanh" if p and p[0] else "none")
    if activation == "Swish":  # x sigmoid(alpha x) (alpha 1: SiLU)
        alpha = p[0] if p else 1.0
        return y.mul_(torch.sigmoid(y * alpha if alpha != 1.0 else y))
    raise KernelError(
        f"activation {activation!r} is not one of {', '.join(map(repr, ACTIVATIONS))}"
    )


def _relu(X, *, out=None):
    with _Mode(_small(X)):
        o = _out_t(out)
        if o is not None:
            torch.clamp_min(_t(X), 0, out=o)
            return out
        return _ret(torch.relu(_t(X)), out)


def _unary_out(f: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    """The kernel of torch function f (which takes `out=`), writing the planned buffer when
    there is one (bound once: no extra call per node)."""

    def kernel(X, *, out=None):
        with _Mode(_small(X)):
            o = _out_t(out)
            if o is not None:
                f(_t(X), out=o)
                return out
            return _ret(f(_t(X)), out)

    return kernel


_sigmoid = _unary_out(torch.sigmoid)
_tanh = _unary_out(torch.tanh)


def _leaky_relu(X, *, alpha=0.01):
    with _Mode(_small(X)):
        return _np(F.leaky_relu(_t(X), float(alpha)))


def _hard_swish(X):
    with _Mode(_small(X)):
        return _np(F.hardswish(_t(X)))


def _hard_sigmoid(X, *, alpha=0.2, beta=0.5):
    with _Mode(_small(X)):
        return _np(_t(X).mul(float(alpha)).add_(float(beta)).clamp_(0.0, 1.0))


def _elu(X, *, alpha=1.0):
    with _Mode(_small(X)):
        return _np(F.elu(_t(X), float(alpha)))


def _gelu(X, *, approximate="none"):
    with _Mode(_small(X)):
        return _np(F.gelu(_t(X), approximate="tanh" if approximate == "tanh" else "none"))


def _clip_bounds(lo, hi, x: torch.Tensor):
    lo = None if lo is None else np.asarray(lo).item()
    hi = None if hi is None else np.asarray(hi).item()
    if x.dtype.is_floating_point:
        lo = None if lo is None else float(lo)
        hi = None if hi is None else float(hi)
    return lo, hi


def _clip_11(input, min=None, max=None, *, out=None):  # noqa: A002 - spec names
    with _Mode(_small(input)):
        x = _t(input)
        lo, hi = _clip_bounds(min, max, x)
        if lo is None and hi is None:
            return _ret(x.clone(), out)
        o = _out_t(out)
        if o is not None:
            torch.clamp(x, lo, hi, out=o)
            return out
        return _ret(torch.clamp(x, lo, hi), out)


def _clip_6(input, *, min=-_MAX_F, max=_MAX_F, out=None):  # noqa: A002 - spec names
    with _Mode(_small(input)):
        x = _t(input)
        o = _out_t(out)
        if o is not None:
            torch.clamp(x, float(min), float(max), out=o)
            return out
        return _ret(torch.clamp(x, float(min), float(max)), out)


def register() -> None:
    """Add the activation variants to the torch device."""
    _add_simple({
        "Relu": (_relu, FLOATS + INTS, True),
        "Sigmoid": (_sigmoid, FLOATS, True),
        "Tanh": (_tanh, FLOATS, True),
        "LeakyRelu": (_leaky_relu, FLOATS, False),
        "HardSwish": (_hard_swish, FLOATS, False),
        "HardSigmoid": (_hard_sigmoid, FLOATS, False),
        "Elu": (_elu, FLOATS, False),
        "Gelu": (_gelu, FLOATS, False),
    })
    for o in _each("Clip"):
        fn = _clip_6 if o.since < 11 else _clip_11
        _add(o, fn, "clip.torch", dtypes=FLOATS + INTS, accepts_out=True)
