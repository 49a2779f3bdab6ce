"""Operators: the com.microsoft FusedConv and FusedGemm that ONNX Runtime writes into a model it
saves after its own graph optimizations (``SessionOptions.optimized_model_filepath`` at the
extended level), as ContribOperators.md documents them.

They compute as the opwarden-domain fused operators (ops/fused.py) the passes create, with
ORT's activation names and parameters: FusedConv's ``activation_params`` (LeakyRelu [alpha],
Clip [min, max], HardSigmoid [alpha, beta]) and FusedGemm's ``activation_alpha`` /
``activation_beta`` / ``activation_gamma``.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops import activation as _act
from opwarden.ops.base import Sample, op
from opwarden.ops.conv import Conv, conv_out_shape, conv_pads, spatial_params
from opwarden.ops.elementwise import Add
from opwarden.ops.linalg import Gemm

MS = "com.microsoft"
_FLOATS = ["float32", "float16", "float64"]
_CONV_ACTS = ("", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
_GEMM_ACTS = ("", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Elu", "Selu",
              "ThresholdedRelu", "Softsign", "Softplus")


def _conv_activation(y: np.ndarray, activation: str, params) -> np.ndarray:
    """FusedConv's activation with its activation_params, through the ONNX references."""
    p = [float(v) for v in (params or ())]
    if not activation:
        return y
    if activation in ("Relu", "Tanh", "Sigmoid"):
        return _act.REFERENCES[activation](y)
    if activation == "LeakyRelu":
        return _act.LeakyRelu(y, alpha=p[0] if p else 0.01)
    if activation == "Clip":
        if len(p) != 2:
            raise KernelError(f"FusedConv: Clip needs activation_params [min, max], got {p}")
        return _act.Clip(y, np.asarray(p[0], y.dtype), np.asarray(p[1], y.dtype))
    if activation == "HardSigmoid":
        if len(p) != 2:
            raise KernelError(f"FusedConv: HardSigmoid needs activation_params [alpha, beta], "
                              f"got {p}")
        return _act.HardSigmoid(y, alpha=p[0], beta=p[1])
    raise KernelError(f"FusedConv: unknown activation {activation!r}; expected one of "
                      f"{_CONV_ACTS}")


@op("FusedConv", domain=MS, since=1, inputs=["X: T", "W: T", "B?: T", "Z?: T"],
    outputs=["Y: T"], types={"T": _FLOATS},
    attrs={"activation": "", "activation_params": ("FLOATS", None), "auto_pad": "NOTSET",
           "dilations": ("INTS", None), "group": 1, "kernel_shape": ("INTS", None),
           "pads": ("INTS", None), "strides": ("INTS", None)},
    contract=Contract(nan="propagate", tolerance="normwise", allowed={
        "activation": one_of(*_CONV_ACTS),
        "auto_pad": one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")}))
def FusedConvMS(X, W, B=None, Z=None, *, activation="", activation_params=None,
                auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                strides=None):
    """activation(Conv(X, W, B) + Z) (com.microsoft FusedConv-1)."""
    y = Conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if Z is not None:
        if Z.shape != y.shape:
            raise KernelError(f"FusedConv: Z has shape {Z.shape}, the convolution gives "
                              f"{y.shape}")
        y = Add(y, Z)
    return _conv_activation(y, activation, activation_params)


@FusedConvMS.infer
def _fused_conv_ms_infer(x, w, *_, auto_pad="NOTSET", dilations=None, kernel_shape=None,
                         pads=None, strides=None, **__):
    if x.shape is None or w.shape is None or len(x.shape) < 3:
        return TensorFact(x.dtype, None)
    sp = tuple(x.shape[2:])
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    if not all(isinstance(v, int) for v in (*sp, *kernel)) or len(kernel) != len(sp):
        return TensorFact(x.dtype, (x.shape[0], w.shape[0], *(None,) * len(sp)))
    st, di = spatial_params(len(sp), strides, dilations)
    begin, end = conv_pads(sp, kernel, st, di, pads, auto_pad)
    return TensorFact(x.dtype, (x.shape[0], w.shape[0],
                                *conv_out_shape(sp, kernel, st, di, begin, end)))


@FusedConvMS.samples
def _fused_conv_ms_samples(rng):
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    z = rng.standard_normal((1, 6, 6, 6)).astype(np.float32)
    pad = {"pads": [1, 1, 1, 1]}
    for act, params in (("Relu", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.5]),
                        ("HardSigmoid", [0.3, 0.4]), ("Sigmoid", None), ("Tanh", None)):
        attrs = {**pad, "activation": act, **({"activation_params": params} if params else {})}
        yield Sample([x, w, b], attrs, label=act, constants=(1, 2))
    yield Sample([x, w, b, z], {**pad, "activation": "Relu"}, label="Z (residual) + Relu",
                 constants=(1, 2))
    yield Sample([x, w[:, :2], None], {"group": 2, "strides": [2, 2]}, label="grouped, strided")


_GEMM_UNARY = ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus")


def _gemm_activation(y, activation, alpha, beta, gamma):
    if not activation:
        return y
    if activation in _GEMM_UNARY:
        return _act.REFERENCES[activation](y)
    if activation == "LeakyRelu":
        return _act.LeakyRelu(y, alpha=0.01 if alpha is None else alpha)
    if activation == "HardSigmoid":
        return _act.HardSigmoid(y, alpha=0.2 if alpha is None else alpha,
                                beta=0.5 if beta is None else beta)
    if activation == "Elu":
        return _act.Elu(y, alpha=1.0 if alpha is None else alpha)
    if activation == "ThresholdedRelu":
        return _act.ThresholdedRelu(y, alpha=1.0 if alpha is None else alpha)
    if activation == "Selu":
        kw = {k: v for k, v in (("alpha", alpha), ("gamma", gamma)) if v is not None}
        return _act.Selu(y, **kw)
    raise KernelError(f"FusedGemm: unknown activation {activation!r}; expected one of "
                      f"{_GEMM_ACTS}")


@op("FusedGemm", domain=MS, since=1, inputs=["A: T", "B: T", "C?: T"], outputs=["Y: T"],
    types={"T": _FLOATS},
    attrs={"activation": "", "activation_alpha": ("FLOAT", None),
           "activation_beta": ("FLOAT", None), "activation_gamma": ("FLOAT", None),
           "alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
    contract=Contract(nan="propagate", broadcast="unidirectional", tolerance="normwise",
                      allowed={"activation": one_of(*_GEMM_ACTS), "transA": one_of(0, 1),
                               "transB": one_of(0, 1)}))
def FusedGemmMS(A, B, C=None, *, activation="", activation_alpha=None, activation_beta=None,
                activation_gamma=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    """activation(alpha * A' B' + beta * C) (com.microsoft FusedGemm-1)."""
    y = Gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return _gemm_activation(y, activation, activation_alpha, activation_beta, activation_gamma)


@FusedGemmMS.infer
def _fused_gemm_ms_infer(a, b, *_, transA=0, transB=0, **__):
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return TensorFact(a.dtype, None)
    return TensorFact(a.dtype, (a.shape[1] if transA else a.shape[0],
                                b.shape[0] if transB else b.shape[1]))


@FusedGemmMS.samples
def _fused_gemm_ms_samples(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    c = rng.standard_normal(4).astype(np.float32)
    for act, extra in (("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}),
                       ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.6}),
                       ("Elu", {"activation_alpha": 0.7}), ("Tanh", {}), ("Sigmoid", {})):
        yield Sample([a, b, c], {"activation": act, **extra}, label=act, constants=(1, 2))
    yield Sample([a.T.copy(), b.T.copy(), c], {"transA": 1, "transB": 1, "alpha": 0.5,
                                               "beta": 2.0, "activation": "Relu"},
                 label="transposed, alpha/beta")
