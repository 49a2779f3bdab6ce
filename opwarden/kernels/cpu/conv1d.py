"""1-D convolutions (audio front ends, temporal convolutions) on the 2-D NCHW kernel:
conv1d.cpu.nchw and fusedconv1d.cpu.nchw.

X (N, C, L) is viewed as (N, C, 1, L) and W (M, C/g, k) as (M, C/g, 1, k); the attributes gain
a unit leading spatial axis (kernel 1, stride 1, dilation 1, no padding on it), so the 2-D
kernel computes exactly the 1-D convolution and writes into a view of the planned (N, M, L')
buffer. Without these variants a rank-3 Conv ran the reference kernel (wav2vec2-base's feature
extractor: 60% of its time).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.kernels.cpu.conv import conv_nchw, nchw_workspace
from opwarden.kernels.cpu.fused import fused_conv_nchw
from opwarden.ops.base import REGISTRY


def as_2d(attrs: dict[str, Any]) -> dict[str, Any]:
    """The 2-D attributes of a 1-D convolution's (the new leading axis is a unit one)."""
    a = dict(attrs)
    if a.get("kernel_shape"):
        a["kernel_shape"] = [1, *a["kernel_shape"]]
    for name in ("strides", "dilations"):
        if a.get(name):
            a[name] = [1, *a[name]]
    if a.get("pads"):
        p = list(a["pads"])
        a["pads"] = [0, p[0], 0, p[1]]
    return a


def _view4(x: Any) -> Any:
    return None if x is None else x[:, :, None, :]


def _run(conv, X, W, B, Z, out, attrs):
    out4 = None if out is None else out[:, :, None, :]
    y4 = conv(_view4(X), _view4(W), B, _view4(Z), out=out4, **as_2d(attrs))
    if out is not None:
        if y4 is not out4 and not np.may_share_memory(y4, out):
            np.copyto(out4, y4)
        return out
    return y4[:, :, 0, :]


def conv1d_nchw(X, W, B=None, *, out=None, **attrs):
    """Conv of rank-3 float32 X and W on the 2-D NCHW kernel (module docstring)."""
    return _run(conv_nchw, X, W, B, None, out, attrs)


def fused_conv1d_nchw(X, W, B=None, Z=None, *, out=None, **attrs):
    """act(Conv(shuffle(X), W, B) + Z) of rank-3 float32 tensors on the 2-D NCHW kernel."""
    return _run(fused_conv_nchw, X, W, B, Z, out, attrs)


def _rank3_ok(x, w, *rest, **attrs: Any) -> bool:
    if x.shape is None or w.shape is None or len(x.shape) != 3 or len(w.shape) != 3:
        return False
    if attrs.get("branches"):
        return False  # merged sibling convolutions carry 2-D geometry
    return all(f is None or f.dtype in (None, "float32") for f in (x, w, *rest))


def _shape4(s: Any) -> Any:
    return None if s is None or len(s) != 3 else (s[0], s[1], 1, s[2])


def _workspace(x, w, b=None, z=None, **attrs) -> int:
    x4, w4 = _shape4(x), _shape4(w)
    if x4 is None or w4 is None or not all(isinstance(v, int) for v in (*x4, *w4)):
        return 0
    extra = 0
    if int(attrs.get("input_shuffle") or 0) > 1:
        extra = 4 * int(np.prod(x4))  # fused_conv_nchw's shuffled copy of X
    attrs = {k: v for k, v in attrs.items() if k not in ("input_shuffle", "branches")}
    return extra + nchw_workspace(x4, w4, b, _shape4(z) if z else None, **as_2d(attrs))


def register() -> None:
    kw = {"device": "cpu", "dtypes": ["float32"], "accepts_out": True, "layout": "NCHW",
          "priority": 10, "when": _rank3_ok, "workspace_bytes": _workspace}
    for opdef in REGISTRY.versions("Conv"):
        opdef.kernel(name="conv1d.cpu.nchw", **kw)(conv1d_nchw)
    for opdef in REGISTRY.versions("FusedConv", "opwarden"):
        opdef.kernel(name="fusedconv1d.cpu.nchw", **kw)(fused_conv1d_nchw)
