"""Fast float32 BatchNormalization (inference) and LRN for the CPU, NHWC and NCHW."""

from __future__ import annotations

import numpy as np

from ..errors import KernelError
from ..ops.base import REGISTRY
from ._util import F32, output, scratch


def _affine(scale, B, mean, var, epsilon, c: int):
    """Per-channel (a, b) with BN(x) = x * a + b, computed in float32 as the reference does."""
    ps = []
    for name, p in (("scale", scale), ("B", B), ("mean", mean), ("var", var)):
        p = np.asarray(p, dtype=F32)
        if p.shape != (c,):
            raise KernelError(f"BatchNormalization: {name} has shape {p.shape}, expected ({c},)")
        ps.append(p)
    s, b, m, v = ps
    a = s / np.sqrt(v + np.float32(epsilon))
    return a, b - m * a


def _bn(X, scale, B, mean, var, epsilon, axis_last: bool, out):
    x = np.asarray(X)
    if x.ndim < 2:
        raise KernelError(f"BatchNormalization needs X of rank >= 2, got shape {x.shape}")
    c = x.shape[-1] if axis_last else x.shape[1]
    a, b = _affine(scale, B, mean, var, epsilon, c)
    if not axis_last:
        tail = (1,) * (x.ndim - 2)
        a, b = a.reshape((c,) + tail), b.reshape((c,) + tail)
    y = output(out, x.shape)
    np.multiply(x, a, out=y)
    y += b
    return y


def _training(kw, noutputs) -> bool:
    return bool(kw.get("training_mode", 0)) or (noutputs > 1 and not kw.get("is_test", 0))


def batchnorm_nchw(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, out=None, **kw):
    """BatchNormalization (inference) on NCHW-style activations (channels on axis 1)."""
    if _training(kw, noutputs):
        return _reference(X, scale, B, mean, var, epsilon=epsilon, noutputs=noutputs, **kw)
    return _bn(X, scale, B, mean, var, epsilon, False, out)


def batchnorm_nhwc(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, out=None, **kw):
    """BatchNormalization (inference) on channels-last activations."""
    if _training(kw, noutputs):
        res = _reference(np.moveaxis(X, -1, 1), scale, B, mean, var, epsilon=epsilon,
                         noutputs=noutputs, **kw)
        res = res if isinstance(res, tuple) else (res,)
        return (np.ascontiguousarray(np.moveaxis(res[0], 1, -1)),) + tuple(res[1:])
    return _bn(X, scale, B, mean, var, epsilon, True, out)


def _reference(X, *params, noutputs=1, **kw):
    """Training mode: the reference kernel of the right version (rare at inference)."""
    versions = REGISTRY.versions("BatchNormalization")
    if "training_mode" in kw:
        fn = versions[-1].reference
        return fn(X, *params, **kw)
    if "is_test" in kw or "consumed_inputs" in kw:
        fn = versions[0].reference
    else:
        fn = [v for v in versions if v.since == 7][0].reference
    return fn(X, *params, noutputs=noutputs, **kw)


def lrn(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, axis_last=False, out=None):
    """LRN across channels (axis 1, or the last axis for NHWC) with shifted-slice window sums."""
    if size is None:
        raise KernelError("LRN needs the attribute size")
    x = np.ascontiguousarray(X, dtype=F32)
    ax = x.ndim - 1 if axis_last else 1
    c = x.shape[ax]
    lo, hi = (int(size) - 1) // 2, int(size) // 2

    def sl(a, b):
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(a, b)
        return tuple(idx)

    sq = np.multiply(x, x, out=scratch("lrn.sq", x.shape))
    ss = scratch("lrn.ss", x.shape)
    np.copyto(ss, sq)
    for k in range(1, lo + 1):
        if k < c:
            ss[sl(k, None)] += sq[sl(None, c - k)]
    for k in range(1, hi + 1):
        if k < c:
            ss[sl(None, c - k)] += sq[sl(k, None)]
    ss *= np.float32(alpha) / np.float32(size)
    ss += np.float32(bias)
    np.power(ss, np.float32(-beta), out=ss)
    y = output(out, x.shape)
    np.multiply(x, ss, out=y)
    return y


def lrn_nhwc(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, out=None):
    """LRN on channels-last activations."""
    return lrn(X, alpha=alpha, beta=beta, bias=bias, size=size, axis_last=True, out=out)


def lrn_nchw(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, out=None):
    """LRN on channels-first activations."""
    return lrn(X, alpha=alpha, beta=beta, bias=bias, size=size, axis_last=False, out=out)


def _bn_ok(x, *params, **attrs) -> bool:
    if x.shape is None or len(x.shape) < 2:
        return False
    if attrs.get("spatial", 1) == 0:
        return False  # per-position parameters: the reference handles them
    return all(p is None or p.dtype in (None, "float32") for p in params)


def _bn_nhwc_ok(x, *params, **attrs) -> bool:
    return _bn_ok(x, *params, **attrs) and len(x.shape) == 4


def _lrn_ok(x, **attrs) -> bool:
    return x.shape is not None and len(x.shape) >= 3


def _lrn_nhwc_ok(x, **attrs) -> bool:
    return x.shape is not None and len(x.shape) == 4


def register() -> None:
    """Register BatchNormalization and LRN variants on every version."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in REGISTRY.versions("BatchNormalization"):
        opdef.kernel(layout="NHWC", when=_bn_nhwc_ok, name="batchnormalization.cpu.nhwc",
                     **kw)(batchnorm_nhwc)
        opdef.kernel(layout="NCHW", when=_bn_ok, name="batchnormalization.cpu.nchw",
                     **kw)(batchnorm_nchw)
    for opdef in REGISTRY.versions("LRN"):
        opdef.kernel(layout="NHWC", when=_lrn_nhwc_ok, name="lrn.cpu.nhwc", **kw)(lrn_nhwc)
        opdef.kernel(layout="NCHW", when=_lrn_ok, name="lrn.cpu.nchw", **kw)(lrn_nchw)
