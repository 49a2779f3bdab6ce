"""Fast variants of the fused operators (domain "opwarden"): bias, residual and activation are
applied in place on the GEMM output, band by band for convolutions."""

from __future__ import annotations

from ..ops.base import REGISTRY
from ..ops.fused import shuffle_channels
from .conv import _conv_ok, conv_nchw, conv_nhwc
from .linalg import _gemm_ok, _matmul_ok, fused_matmul, gemm

DOMAIN = "opwarden"


def fused_conv_nhwc(X, W, B=None, Z=None, *, activation="", activation_params=None,
                    input_shuffle=0, out=None, **attrs):
    """act(Conv(shuffle(X), W, B) + Z) with X, Z and Y in NHWC."""
    return conv_nhwc(X, W, B, Z, activation=activation,
                     activation_params=activation_params or (), input_shuffle=input_shuffle,
                     out=out, **attrs)


def fused_conv_nchw(X, W, B=None, Z=None, *, activation="", activation_params=None,
                    input_shuffle=0, out=None, **attrs):
    """act(Conv(shuffle(X), W, B) + Z) in NCHW."""
    if int(input_shuffle or 0) > 1:
        X = shuffle_channels(X, int(input_shuffle), axis=1)
    return conv_nchw(X, W, B, Z, activation=activation,
                     activation_params=activation_params or (), out=out, **attrs)


def fused_gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_params=None, out=None):
    """act(alpha * A'B' + beta * C) into the planned buffer."""
    return gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                activation=activation, activation_params=activation_params or (), out=out)


def fused_matmul_kernel(A, B, C=None, *, activation="", activation_params=None, out=None):
    """act(MatMul(A, B) + C) into the planned buffer."""
    return fused_matmul(A, B, C, activation=activation,
                        activation_params=activation_params or (), out=out)


def register() -> bool:
    """Register the fused variants; False (nothing done) while the fused ops do not exist."""
    convs = REGISTRY.versions("FusedConv", DOMAIN)
    gemms = REGISTRY.versions("FusedGemm", DOMAIN)
    matmuls = REGISTRY.versions("FusedMatMul", DOMAIN)
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in convs:
        opdef.kernel(layout="NHWC", when=_conv_ok, name="fusedconv.cpu.nhwc",
                     **kw)(fused_conv_nhwc)
        opdef.kernel(layout="NCHW", when=_conv_ok, name="fusedconv.cpu.nchw",
                     **kw)(fused_conv_nchw)
    for opdef in gemms:
        opdef.kernel(when=_gemm_ok, name="fusedgemm.cpu.blas", **kw)(fused_gemm)
    for opdef in matmuls:
        opdef.kernel(when=_matmul_ok, name="fusedmatmul.cpu.blas", **kw)(fused_matmul_kernel)
    return bool(convs or gemms or matmuls)
