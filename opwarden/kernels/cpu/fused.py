"""Fast variants of the fused operators (domain "opwarden"): bias, residual and activation are
applied in place on the GEMM output, band by band for convolutions.

FusedConv in NHWC has the variants Conv has (kernels.cpu.conv): fusedconv.cpu.<algorithm>, one
per algorithm, chosen at placement by the same `when`, and the dispatcher fusedconv.cpu.nhwc.
Branches whose inputs turn out non-finite, or whose W is not zero outside them, run branch by
branch through the dispatcher (each branch is a convolution of its own shape)."""

from __future__ import annotations

import numpy as np

from opwarden.errors import KernelError
from opwarden.kernels.cpu.conv import (
    _BIND,
    _RUN,
    VARIANTS,
    _conv_ok,
    conv_nchw,
    conv_nhwc,
    nchw_workspace,
    nhwc_kernel,
    nhwc_workspace,
    route_when,
    route_workspace,
)
from opwarden.kernels.cpu.conv_common import _finite, _own, geometry
from opwarden.kernels.cpu.conv_prepared import prepare_nhwc
from opwarden.kernels.cpu.linalg import (
    _gemm_ok,
    _matmul_ok,
    fused_matmul,
    fused_matmul_workspace,
    gemm,
    gemm_workspace,
)
from opwarden.kernels.cpu.util import apply_activation, output, packed
from opwarden.ops.base import REGISTRY
from opwarden.ops.fused import branch_convs, branch_windows, shuffle_channels

DOMAIN = "opwarden"


def _whole_ok(X, W, B, branches) -> bool:
    """Can a FusedConv with branches run as one convolution over W, structural zeros included?
    Yes when W's taps outside each branch's centred part are zeros (the passes build W so; the
    op's meaning is that they are never read, so other values send the node branch by branch)
    and X, W and B are finite: every product with a zero tap is then an exact zero. A NaN or
    Inf in X would turn such a product into NaN where the branch never reads that input."""
    if not _finite_weights(W) or (B is not None and not _finite(np.asarray(B))):
        return False
    if not _zero_outside(W, branches):
        return False
    return _finite(np.asarray(X))


def _finite_weights(W) -> bool:
    return bool(packed(W, "finite", lambda w: np.array(np.isfinite(w).all()))[()])


def _zero_outside(W, branches) -> bool:
    """Are W's taps outside each branch's centred kh x kw part all zero? (cached per weight)"""
    spec = tuple(int(v) for v in branches)

    def scan(w: np.ndarray) -> np.ndarray:
        try:
            windows = branch_windows(np.shape(w), spec)
        except (KernelError, ValueError):
            return np.array(False)  # malformed: the branch-by-branch path names the problem
        for m0, mb, oh, ow, bh, bw in windows:
            outside = np.array(w[m0:m0 + mb])
            outside[:, :, oh:oh + bh, ow:ow + bw] = 0
            if outside.any():
                return np.array(False)
        return np.array(True)

    return bool(packed(W, ("zero_outside", spec), scan)[()])


def _by_branch(conv, X, W, B, Z, branches, attrs, axis, out, **act):
    """The exact FusedConv with branches: each branch its own convolution (ops.fused.
    branch_convs), written into its channels of Y; then residual and activation."""
    x = np.asarray(X)
    parts = branch_convs(x.shape, W, B, branches, attrs, channel_axis=axis)
    ys = [conv(x, wb, bb, None, **ab) for wb, bb, ab in parts]
    shape = list(ys[0].shape)
    shape[axis] = sum(y.shape[axis] for y in ys)
    y = output(out, tuple(shape))
    Z = _own(Z, y)  # (Y in place over Z: Z is read after the branches are written)
    np.concatenate(ys, axis=axis, out=y)
    if Z is not None:
        if np.shape(Z) != y.shape:
            raise KernelError(f"FusedConv: residual Z {np.shape(Z)} must match the output "
                              f"{y.shape}")
        np.add(y, Z, out=y)
    apply_activation(y, act.get("activation") or "", act.get("activation_params") or ())
    return y


def _fused_nhwc(conv):
    """FusedConv's NHWC kernel over a conv_nhwc-shaped one (the dispatcher or an algorithm's,
    see kernels.cpu.conv.nhwc_kernel)."""

    def kernel(X, W, B=None, Z=None, *, activation="", activation_params=None,
               input_shuffle=0, branches=None, out=None, **attrs):
        if branches and not _whole_ok(X, W, B, branches):
            return _by_branch(conv_nhwc, X, W, B, Z, branches, attrs, 3, out,
                              activation=activation, activation_params=activation_params)
        return conv(X, W, B, Z, activation=activation,
                    activation_params=activation_params or (), input_shuffle=input_shuffle,
                    out=out, branches=branches or None, **attrs)

    kernel.__name__ = kernel.__qualname__ = f"fused_{conv.__name__}"
    kernel.__doc__ = conv.__doc__
    return kernel


fused_conv_nhwc = _fused_nhwc(conv_nhwc)
fused_conv_nhwc.__doc__ = """act(Conv(shuffle(X), W, B) + Z) with X, Z and Y in NHWC. With
    `branches`, one convolution over W when the inputs are finite and W's taps outside the
    branches zero (see _whole_ok), else branch by branch."""


def fused_conv_nchw(X, W, B=None, Z=None, *, activation="", activation_params=None,
                    input_shuffle=0, branches=None, out=None, **attrs):
    """act(Conv(shuffle(X), W, B) + Z) in NCHW (branches as in fused_conv_nhwc)."""
    if int(input_shuffle or 0) > 1:
        X = shuffle_channels(X, int(input_shuffle), axis=1)
    if branches and not _whole_ok(X, W, B, branches):
        return _by_branch(conv_nchw, X, W, B, Z, branches, attrs, 1, out,
                          activation=activation, activation_params=activation_params)
    return conv_nchw(X, W, B, Z, activation=activation,
                     activation_params=activation_params or (), out=out, **attrs)


def _fused_workspace(conv_workspace, axis: int):
    """FusedConv's workspace rule over a conv kernel's (kernels.conv.nhwc_workspace or
    nchw_workspace; `axis`: the channel axis): with branches, the larger of the one-convolution
    path and the branch-by-branch one (each branch's own convolution, their outputs, which
    are Y's size in all, and the residual's copy); the NCHW kernel's input shuffle is a copy
    of X."""

    def workspace(x, w, b=None, z=None, *, branches=None, input_shuffle=0, **attrs) -> int:
        nhwc = axis == 3
        extra = 0
        if not nhwc and int(input_shuffle or 0) > 1 and all(isinstance(v, int) for v in x):
            extra = 4 * int(np.prod(x))
        whole = conv_workspace(x, w, b, z, branches=branches,
                               input_shuffle=input_shuffle if nhwc else 0, **attrs)
        if not branches or len(x) != 4 or len(w) != 4:
            return extra + whole
        try:
            parts = branch_convs(tuple(x), np.broadcast_to(np.float32(0), tuple(w)), None,
                                 branches, attrs, channel_axis=axis)
        except (KernelError, ValueError, TypeError):
            return extra + whole
        each = max(conv_workspace(x, wb.shape, (wb.shape[0],) if b else None, None,
                                  **ab) for wb, _bb, ab in parts)
        hw = x[1:3] if nhwc else x[2:4]
        oh, ow = geometry(hw, w[2:4], attrs.get("strides"), attrs.get("dilations"),
                          attrs.get("pads"), attrs.get("auto_pad") or "NOTSET")[4]
        y = 4 * x[0] * oh * ow * int(w[0])
        by_branch = each + y + (y if z else 0)  # (omitted inputs: None or ())
        return extra + max(whole, by_branch)

    return workspace


def fused_gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_params=None, out=None):
    """act(alpha * A'B' + beta * C) into the planned buffer."""
    return gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                activation=activation, activation_params=activation_params or (), out=out)


def fused_matmul_kernel(A, B, C=None, *, activation="", activation_params=None, out=None):
    """act(MatMul(A, B) + C) into the planned buffer."""
    return fused_matmul(A, B, C, activation=activation,
                        activation_params=activation_params or (), out=out)


def _in_place_nhwc(attrs) -> bool:
    """Y over Z pays in the ungrouped NHWC kernel: its pointwise and row-tap paths add only
    the bias to Z before their GEMMs accumulate (less time, a smaller arena). Grouped
    convolutions are slower in place (their batched matmul cannot accumulate) and keep Y
    apart."""
    return int(attrs.get("group", 1) or 1) == 1


def _never(attrs) -> bool:
    """The NCHW kernel would copy Z aside first (it writes Y before reading Z)."""
    return False


def register() -> bool:
    """Register the fused variants; False (nothing done) while the fused ops do not exist."""
    convs = REGISTRY.versions("FusedConv", DOMAIN)
    gemms = REGISTRY.versions("FusedGemm", DOMAIN)
    matmuls = REGISTRY.versions("FusedMatMul", DOMAIN)
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in convs:
        for route, (suffix, _doc) in VARIANTS.items():
            fn = _fused_nhwc(nhwc_kernel(route))
            fn.prepare = prepare_nhwc(_RUN[route], fn, _BIND.get(route))  # type: ignore
            opdef.kernel(layout="NHWC", when=route_when(route), name=f"fusedconv.cpu.{suffix}",
                         in_place_when=_in_place_nhwc,
                         workspace_bytes=_fused_workspace(route_workspace(route), 3),
                         **{**kw, "priority": 11})(fn)
        opdef.kernel(layout="NHWC", when=_conv_ok, name="fusedconv.cpu.nhwc",
                     in_place_when=_in_place_nhwc,
                     workspace_bytes=_fused_workspace(nhwc_workspace, 3),
                     **kw)(fused_conv_nhwc)
        opdef.kernel(layout="NCHW", when=_conv_ok, name="fusedconv.cpu.nchw",
                     in_place_when=_never, workspace_bytes=_fused_workspace(nchw_workspace, 1),
                     **kw)(fused_conv_nchw)
    for opdef in gemms:
        opdef.kernel(when=_gemm_ok, name="fusedgemm.cpu.blas", workspace_bytes=gemm_workspace,
                     **kw)(fused_gemm)
    for opdef in matmuls:
        opdef.kernel(when=_matmul_ok, name="fusedmatmul.cpu.blas",
                     workspace_bytes=fused_matmul_workspace, **kw)(fused_matmul_kernel)
    return bool(convs or gemms or matmuls)
