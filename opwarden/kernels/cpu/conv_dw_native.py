"""Depthwise convolution on the compiled kernel (opwarden.native): conv.cpu.depthwise_native
and fusedconv.cpu.depthwise_native (NHWC), and their *_native_nchw twins for nodes the layout
pass keeps in NCHW (X and Y transposed through scratch around the same loop).

The C loop (native/depthwise.c) reads the taps of each output pixel straight from the
unpadded image (taps outside it are skipped, so no padded copy), keeps 4 pixels x 16 channels
of sums in registers across the taps, and applies bias, residual and activation while the
pixels are in L1. Output rows are shared out over the session's threads by
blas_split.over_rows (blocks claimed by whichever thread is free: a descheduled helper on a
busy machine holds up one block, where OpenMP's static split and spinning waits held up the
whole layer). It takes every node the NumPy depthwise variant (conv.cpu.depthwise, one einsum
over a window view) takes, at a higher priority, where the extension is built and the fused
activation is one its epilogue has (native.DW_ACTS). A strided X (an NHWC view of an NCHW
tensor) or one whose channels are to be shuffled first (a ChannelShuffle the layout pass
folded in) is copied once into scratch no larger than the NumPy variant's padded copy, whose
workspace rule is declared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden import native
from opwarden.blas import blas_thread_count
from opwarden.errors import KernelError
from opwarden.kernels.cpu.blas_split import SPLIT, over_rows, split_threads
from opwarden.kernels.cpu.conv import _conv_ok, nhwc_kernel, route_when, route_workspace
from opwarden.kernels.cpu.conv_common import _prologue, _static_geometry
from opwarden.kernels.cpu.conv_depthwise import _pack_depthwise
from opwarden.kernels.cpu.conv_prepared import prepare_nhwc
from opwarden.kernels.cpu.shuffle import channel_shuffle
from opwarden.kernels.cpu.util import F32, packed, scratch
from opwarden.native.bound import depthwise_nhwc_call

_numpy_depthwise = nhwc_kernel("depthwise")
_is_depthwise = route_when("depthwise")


def _act_name(activation: Any) -> str:
    return activation.decode() if isinstance(activation, bytes) else str(activation or "")


def dw_native_when(x, w, *rest, **attrs: Any) -> bool:
    """The NumPy depthwise variant's nodes (route_when("depthwise")), with the extension
    built and a fused activation native.DW_ACTS holds."""
    if not native.available():
        return False
    if native.dw_act_code(_act_name(attrs.get("activation", "")),
                          attrs.get("activation_params")) is None:
        return False
    return _conv_ok(x, w, *rest) and _is_depthwise(x, w, *rest, **attrs)


def depthwise_native(X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                     kernel_shape=None, pads=None, strides=None, activation="",
                     activation_params=(), input_shuffle=0, out=None, branches=None):
    """act(depthwise Conv(X, W, B) + Z) with X, Z, Y in NHWC on the compiled loop (module
    docstring); what it does not take runs on the NumPy depthwise variant."""
    x = np.asarray(X, dtype=F32)
    act = _act_name(activation)
    if (not native.available() or branches or x.ndim != 4 or np.ndim(W) != 4
            or native.dw_act_code(act, activation_params) is None):
        return _numpy_depthwise(X, W, B, Z, auto_pad=auto_pad, dilations=dilations,
                                group=group, kernel_shape=kernel_shape, pads=pads,
                                strides=strides, activation=activation,
                                activation_params=activation_params,
                                input_shuffle=input_shuffle, out=out, branches=branches)
    group = int(group)
    s, d, begin, _end, y, z, bias = _prologue(x, W, B, Z, group, kernel_shape, strides,
                                              dilations, pads, auto_pad, out, nhwc=True)
    if W.shape[1] != 1 or W.shape[0] != group:
        return _numpy_depthwise(X, W, B, Z, auto_pad=auto_pad, dilations=dilations,
                                group=group, kernel_shape=kernel_shape, pads=pads,
                                strides=strides, activation=activation,
                                activation_params=activation_params, out=out)
    if y.size == 0:
        return y
    _dw_run(x, W, B, s, d, begin, _end, y, bias, z, act, activation_params,
            int(input_shuffle or 0), None)
    return y


def _dw_run(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
            bplan) -> None:
    """depthwise_native after its prologue, as the NHWC algorithms run (conv.py's _RUN
    signature), for an activation native.DW_ACTS holds."""
    if shuffle > 1 or not x.flags.c_contiguous:
        x = _contiguous(x, shuffle)
    taps = packed(W, "dw_taps", _pack_depthwise)  # (kh, kw, C), shared with the NumPy variant
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=F32)
    if z is not None:
        z = np.ascontiguousarray(z)
    act = _act_name(activation)
    params = params or ()
    n, oh, ow, c = y.shape

    def run(r0: int, r1: int) -> None:
        native.depthwise_nhwc(x, taps, bias, z, y, s, d, begin, act, params, 1, (r0, r1))

    if split_threads() > 1:
        over_rows(n * oh, n * oh * ow * c * W.shape[2] * W.shape[3], run)
    else:  # (no session threads set: OpenMP on OpenBLAS's count)
        native.depthwise_nhwc(x, taps, bias, z, y, s, d, begin, act, params,
                              blas_thread_count())


def _dw_bind(x, W, B, s, d, begin, end, y, bias, activation, params):
    """_dw_run as one bound native call (native.bound) for a prepared step, where it is one
    call: no session threads sharing rows out (blas_split.SPLIT off)."""
    if SPLIT:
        return None
    act = _act_name(activation)
    params = params or ()
    taps = packed(W, "dw_taps", _pack_depthwise)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=F32)
    f = depthwise_nhwc_call(taps, b, y, s, d, begin, act, params)

    def call(x, z) -> None:
        if z is not None or not f(x):
            _dw_run(x, W, B, s, d, begin, end, y, bias, z, activation, params, 0, None)

    return call


def _dw_prepares(attrs, w) -> bool:
    """Whether a prepared step may run _dw_run: what depthwise_native checks before it."""
    group = int(attrs.get("group", 1) or 1)
    return (native.available() and w.shape[1] == 1 and w.shape[0] == group
            and native.dw_act_code(_act_name(attrs.get("activation", "")),
                                   attrs.get("activation_params")) is not None)


def _contiguous(x: np.ndarray, shuffle: int) -> np.ndarray:
    """A C-contiguous scratch copy of X, its channels shuffled with group `shuffle` (>= 2;
    ChannelShuffle folded into this node by the layout pass) or as they are."""
    buf = scratch("dw_native.x", x.shape)
    if shuffle > 1:
        if x.shape[3] % shuffle:
            raise KernelError(f"FusedConv: input_shuffle={shuffle} does not divide the "
                              f"{x.shape[3]} channels of X {x.shape}")
        channel_shuffle(x, group=shuffle, out=buf)
    else:
        np.copyto(buf, x)
    return buf


def dw_nchw_when(x, w, *rest, **attrs: Any) -> bool:
    """An NCHW depthwise convolution (no residual, no input shuffle: the layout pass folds
    neither into an NCHW node), extension built, activation one DW_ACTS holds."""
    if not native.available() or int(attrs.get("input_shuffle", 0) or 0) > 1 \
            or attrs.get("branches") or (len(rest) > 1 and rest[1] is not None):
        return False
    if native.dw_act_code(_act_name(attrs.get("activation", "")),
                          attrs.get("activation_params")) is None:
        return False
    if not _conv_ok(x, w, *rest) or len(w.shape) != 4 or not isinstance(w.shape[0], int):
        return False
    group = int(attrs.get("group", 1) or 1)
    return w.shape[1] == 1 and w.shape[0] == group and x.shape[1] == group


def dw_nchw_workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                      kernel_shape=None, pads=None, strides=None, **_) -> int:
    """X and Y in NHWC scratch: 4 bytes per element of each (0 for unknown shapes)."""
    geom = _static_geometry(x, w, x[2:4], strides, dilations, pads, auto_pad)
    if geom is None:
        return 0
    n, c, h, wd = x
    oh, ow = geom[4]
    return 4 * n * c * (h * wd + oh * ow)


def depthwise_native_nchw(X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None,
                          group=1, kernel_shape=None, pads=None, strides=None, activation="",
                          activation_params=(), input_shuffle=0, out=None, branches=None):
    """A depthwise convolution placed in NCHW (the layout pass kept its neighbours there,
    e.g. ConvNeXt's first stage between the model's own permutes) on the compiled NHWC loop:
    X transposed into scratch, the loop, Y transposed back; the two copies cost a fraction of
    the NCHW patch-matrix path."""
    x = np.asarray(X, dtype=F32)
    group = int(group)
    s, d, begin, _end, y, _z, bias = _prologue(x, W, B, None, group, kernel_shape, strides,
                                               dilations, pads, auto_pad, out, nhwc=False)
    if Z is not None or int(input_shuffle or 0) > 1 or branches or W.shape[1] != 1 \
            or W.shape[0] != group:
        raise KernelError("depthwise_native_nchw: a depthwise convolution without residual, "
                          "input shuffle or branches expected (its `when` says so)")
    if y.size == 0:
        return y
    n, c, h, w = x.shape
    xh = scratch("dw_nchw.x", (n, h, w, c))
    np.copyto(xh, x.transpose(0, 2, 3, 1))
    yh = scratch("dw_nchw.y", (n, y.shape[2], y.shape[3], c))
    depthwise_native(xh, W, bias, None, auto_pad=auto_pad, dilations=dilations, group=group,
                     kernel_shape=kernel_shape, pads=pads, strides=strides,
                     activation=activation, activation_params=activation_params, out=yh)
    np.copyto(y, yh.transpose(0, 3, 1, 2))
    return y


def _conv_dw_nchw(X, W, B=None, *, out=None, **attrs):
    """Conv in NCHW on the compiled depthwise loop."""
    return depthwise_native_nchw(X, W, B, None, out=out, **attrs)


def _conv_depthwise_native(X, W, B=None, *, out=None, **attrs):
    """Conv (no residual) on the compiled depthwise loop."""
    return depthwise_native(X, W, B, None, out=out, **attrs)


def register() -> None:
    """conv.cpu.depthwise_native on every Conv version and fusedconv.cpu.depthwise_native on
    FusedConv, NHWC, priority 12 (above the NumPy algorithms' 11); their NCHW twins
    (*_native_nchw) at 11, above conv.cpu.nchw's 10."""
    from opwarden.kernels.cpu.fused import _fused_workspace
    from opwarden.ops.base import REGISTRY

    kw = {"device": "cpu", "dtypes": ["float32"], "accepts_out": True, "layout": "NHWC",
          "priority": 12, "when": dw_native_when}
    nchw = {**kw, "layout": "NCHW", "priority": 11, "when": dw_nchw_when,
            "workspace_bytes": dw_nchw_workspace}
    for fn in (_conv_depthwise_native, depthwise_native):
        fn.prepare = prepare_nhwc(_dw_run, fn, _dw_bind, _dw_prepares,  # type: ignore
                                  shuffles=True)
    for opdef in REGISTRY.versions("Conv"):
        opdef.kernel(name="conv.cpu.depthwise_native",
                     workspace_bytes=route_workspace("depthwise"), **kw)(_conv_depthwise_native)
        opdef.kernel(name="conv.cpu.depthwise_native_nchw", **nchw)(_conv_dw_nchw)
    for opdef in REGISTRY.versions("FusedConv", "opwarden"):
        opdef.kernel(name="fusedconv.cpu.depthwise_native",
                     workspace_bytes=_fused_workspace(route_workspace("depthwise"), 3),
                     **kw)(depthwise_native)
        opdef.kernel(name="fusedconv.cpu.depthwise_native_nchw", **nchw)(depthwise_native_nchw)
