"""Fused operators (domain "opwarden") created by the graph passes (issue 8).

Each reference kernel computes exactly the math of the nodes it replaces by calling their
reference kernels in the same order (Conv then +Z then the activation), so a fused graph agrees
with the unfused one bit for bit; fast variants (opwarden/kernels) are checked against these.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops import activation as _act
from opwarden.ops import elementwise as _ew
from opwarden.ops.base import Sample, op
from opwarden.ops.conv import (
    AUTO_PAD,
    Conv,
    _conv_workspace,
    conv_out_shape,
    conv_pads,
    conv_weights,
    spatial_params,
)
from opwarden.ops.grad import away_from_zero
from opwarden.ops.linalg import Gemm, MatMul

DOMAIN = "opwarden"
ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "Gelu", "Tanh")
FLOATS = ["float16", "float32", "float64", "bfloat16"]
_ACT_RULE = one_of(*ACTIVATIONS)


def apply_activation(y: np.ndarray, activation: str, params) -> np.ndarray:
    """`activation` (one of ACTIVATIONS) applied to y through the built-in reference kernels.

    params: Clip [min, max] (either may be missing: [] or [min]), LeakyRelu [alpha],
    Gelu [0] exact (default) or [1] tanh approximation; the others take none.
    """
    p = [float(v) for v in (params or ())]
    if not activation:
        return y
    if activation == "Relu":
        return _act.Relu(y)
    if activation == "Clip":
        lo = np.asarray(p[0], y.dtype) if len(p) > 0 else None
        hi = np.asarray(p[1], y.dtype) if len(p) > 1 else None
        return _act.Clip(y, lo, hi)
    if activation == "LeakyRelu":
        return _act.LeakyRelu(y, alpha=p[0] if p else 0.01)
    if activation == "Sigmoid":
        return _act.Sigmoid(y)
    if activation == "HardSwish":
        return _act.HardSwish(y)
    if activation == "Gelu":
        return _act.Gelu(y, approximate="tanh" if p and p[0] else "none")
    if activation == "Tanh":
        return _act.Tanh(y)
    raise KernelError(f"unknown fused activation {activation!r}; expected one of {ACTIVATIONS}")


def _facts_static(*facts: TensorFact | None) -> bool:
    return all(f is not None and f.static for f in facts)


def shuffle_channels(x, group: int, axis: int, what: str = "channel shuffle") -> np.ndarray:
    """A copy of x (always: even where the permutation is the identity) with the channels on
    `axis` split as (group, C/group) and transposed: out[.., j*group + i, ..] =
    x[.., i*(C/group) + j, ..]. `what` names the caller in the error."""
    x = np.asarray(x)
    axis %= max(x.ndim, 1)
    c = x.shape[axis] if x.ndim else 0
    if x.ndim == 0 or group < 1 or c % group:
        raise KernelError(
            f"{what}: axis {axis} of X {x.shape} must be divisible by group={group}"
        )
    split = x.reshape(*x.shape[:axis], group, c // group, *x.shape[axis + 1:])
    return split.swapaxes(axis, axis + 1).copy().reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# FusedConv


def _fused_conv_workspace(x, w, *rest, **attrs):
    """Conv's im2col workspace (the residual add and activation run in place)."""
    return _conv_workspace(x, w, **attrs)


_CONV_ATTRS = {
    "auto_pad": "NOTSET",
    "dilations": ("INTS", []),
    "group": 1,
    "kernel_shape": ("INTS", []),
    "pads": ("INTS", []),
    "strides": ("INTS", []),
    "activation": "",
    "activation_params": ("FLOATS", []),
    # g >= 2: X's channels are shuffled with group g first (ChannelShuffle folded into its
    # depthwise consumer by the layout pass: the shuffle rides on the padding copy).
    "input_shuffle": 0,
    # (M_1, kh_1, kw_1, M_2, kh_2, kw_2, ...): Y is the concatenation along the channels of
    # branches, branch b being output channels M_1 + .. + M_(b-1) onward, a convolution with
    # the centred kh_b x kw_b part of W; W's taps outside it are structural zeros that are never
    # multiplied (a Concat of sibling convolutions of X, merged by the passes). [] = one branch.
    "branches": ("INTS", []),
}


@op(
    "FusedConv",
    layout_inputs=(0, 3),
    domain=DOMAIN,
    since=1,
    inputs=["X: T", "W: T", "B?: T", "Z?: T"],
    outputs=["Y: T"],
    types={"T": FLOATS},
    attrs=_CONV_ATTRS,
    contract=Contract(
        layout="NCHW",
        nan="propagate",
        # Y may be written in place over the residual Z (a ResNet block's shortcut, dying at
        # its add): the pointwise kernel then adds only the bias before its GEMM accumulates.
        may_alias=((3, 0),),
        workspace_bytes=_fused_conv_workspace,
        tolerance="normwise",  # sums of products, as Conv
        allowed={
            "auto_pad": AUTO_PAD,
            "group": such_that(lambda g: int(g) >= 1, "a positive integer"),
            "activation": _ACT_RULE,
            "input_shuffle": such_that(lambda g: int(g) >= 0, "0 (none) or a group count"),
            "branches": such_that(
                lambda b: len(b) % 3 == 0 and all(int(v) >= 1 for v in b),
                "(channels, kh, kw) triples of positive integers",
            ),
        },
    ),
)
def FusedConv(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=None, input_shuffle=0,
    branches=None,
):
    """act(Conv(shuffle(X), W, B) + Z): convolution, optional channel shuffle of the input,
    residual Z and activation; with `branches`, the Conv is a concatenation of convolutions with
    centred parts of W (see branch_convs)."""
    if int(input_shuffle) > 1:
        X = shuffle_channels(X, int(input_shuffle), axis=1)
    kw = dict(auto_pad=auto_pad, dilations=dilations or None, group=group,
              kernel_shape=kernel_shape or None, pads=pads or None, strides=strides or None)
    if branches:
        parts = [Conv(X, w, b, **a) for w, b, a in branch_convs(X.shape, W, B, branches, kw)]
        y = np.concatenate(parts, axis=1)
    else:
        y = Conv(X, W, B, **kw)
    if Z is not None:
        if Z.shape != y.shape:
            raise KernelError(f"FusedConv: residual Z has shape {Z.shape}, Y has {y.shape}")
        y = _ew.Add(y, Z)
    return apply_activation(y, activation, activation_params)


def branch_convs(x_shape, W, B, branches, attrs: dict, channel_axis: int = 1) -> list:
    """The convolutions a FusedConv with `branches` concatenates: (W_b, B_b, attrs_b) per
    branch, W_b the centred (kh_b, kw_b) part of its rows of W and the pads shrunk by the taps
    cut off, so each branch's output has Y's spatial size. `x_shape` is X's shape with the
    channels on `channel_axis` (pads are resolved from its spatial sizes). KernelError when the
    branches do not tile W's output channels or a part is not centred in W's kernel."""
    if int(attrs.get("group") or 1) != 1 or np.ndim(W) != 4:
        raise KernelError("FusedConv: branches need a 2-D convolution with group=1")
    windows = branch_windows(W.shape, branches)
    kh, kw = W.shape[2:]
    hw = [d for i, d in enumerate(x_shape) if i not in (0, channel_axis)]
    s, d = spatial_params(2, attrs.get("strides") or None, attrs.get("dilations") or None)
    begin, end = conv_pads(hw, (kh, kw), s, d, attrs.get("pads") or None,
                           attrs.get("auto_pad") or "NOTSET")
    out = []
    for m0, mb, oh, ow, bh, bw in windows:
        pb = [begin[0] - oh * d[0], begin[1] - ow * d[1]]
        pe = [end[0] - oh * d[0], end[1] - ow * d[1]]
        if min(*pb, *pe) < 0:
            raise KernelError(
                f"FusedConv: pads {begin + end} cannot hold branch kernel {bh}x{bw} centred "
                f"in {kh}x{kw}"
            )
        wb = W[m0:m0 + mb, :, oh:oh + bh, ow:ow + bw]
        bb = None if B is None else B[m0:m0 + mb]
        a = dict(attrs, auto_pad="NOTSET", pads=[*pb, *pe], kernel_shape=[bh, bw])
        out.append((wb, bb, a))
    return out


def branch_windows(w_shape, branches) -> list[tuple[int, int, int, int, int, int]]:
    """Per branch of a FusedConv (M, C, kh, kw) weight: (first output channel, channels, tap
    row and column offset of its centred part, its kh, its kw). KernelError when `branches` is
    not (channels, kh, kw) triples tiling the output channels with parts centred in W's kernel."""
    spec = [int(v) for v in branches]
    if len(spec) % 3 or not spec:
        raise KernelError(f"FusedConv: branches {spec} must be (channels, kh, kw) triples")
    m, _c, kh, kw = w_shape
    if sum(spec[0::3]) != m:
        raise KernelError(
            f"FusedConv: branches {spec} give {sum(spec[0::3])} output channels, W has {m}"
        )
    out, m0 = [], 0
    for mb, bh, bw in zip(spec[0::3], spec[1::3], spec[2::3]):
        if bh > kh or bw > kw or (kh - bh) % 2 or (kw - bw) % 2:
            raise KernelError(
                f"FusedConv: branch kernel {bh}x{bw} is not centred in W's {kh}x{kw}"
            )
        out.append((m0, mb, (kh - bh) // 2, (kw - bw) // 2, bh, bw))
        m0 += mb
    return out


@FusedConv.infer
def _fused_conv_infer(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, pads=None,
                      strides=None, **_):
    dtype = x.dtype or w.dtype
    if not _facts_static(x, w):
        return TensorFact(dtype, None if x.shape is None else (x.shape[0], None) + (None,) * (
            len(x.shape) - 2))
    nsp = len(x.shape) - 2
    s, d = spatial_params(nsp, strides or None, dilations or None)
    begin, end = conv_pads(x.shape[2:], w.shape[2:], s, d, pads or None, auto_pad)
    out = conv_out_shape(x.shape[2:], w.shape[2:], s, d, begin, end)
    return TensorFact(dtype, (x.shape[0], w.shape[0], *out))


def _normal(rng, dtype=np.float32):
    return lambda *shape: rng.standard_normal(shape).astype(dtype)


@FusedConv.samples
def _fused_conv_samples(rng):
    """One call per kernel path (ONNX layout; the harness moves X and Z to NHWC for NHWC
    variants; W and B also as initializers): 1x1 as a GEMM, k x k, strided, depthwise (with a
    folded shuffle), grouped (in place over a residual, after an input shuffle), branches (with
    and without structural zeros, row taps and the patch matrix), the few-channel stem,
    dilated, SAME padding, asymmetric pads, 1-D, residuals on GEMMs big enough for the
    threaded adds, on the Winograd, shifted-GEMM, patch-matrix and few-pixel paths, every
    activation, an empty batch, float64."""
    x = _normal(rng)

    def w(*shape):
        return conv_weights(rng, *shape)

    def S(inputs, attrs, label):  # W and B are initializers: checked plain and as constants
        return Sample(inputs, attrs, label=label, constants=(1, 2))

    p1 = [1, 1, 1, 1]
    yield S([x(1, 8, 5, 5), w(16, 8, 1, 1), x(16)], {"activation": "Relu"}, label="1x1")
    yield S([x(2, 8, 6, 6), w(8, 8, 3, 3), x(8), x(2, 8, 6, 6)],
            {"pads": p1, "activation": "Relu"}, label="3x3 residual, batch 2")
    yield S([x(1, 6, 9, 9), w(12, 6, 3, 3), x(12)],
            {"pads": p1, "strides": [2, 2], "activation": "Clip",
             "activation_params": [0.0, 6.0]}, label="3x3 stride 2, clip")
    yield S([x(1, 8, 7, 7), w(8, 1, 3, 3), x(8)],
            {"group": 8, "pads": p1, "activation": "LeakyRelu", "activation_params": [0.1]},
            label="depthwise")
    yield S([x(1, 8, 8, 8), w(8, 1, 3, 3), x(8)],
            {"group": 8, "pads": p1, "strides": [2, 2], "input_shuffle": 2},
            label="depthwise stride 2, shuffled input")
    yield S([x(1, 8, 6, 6), w(8, 4, 1, 1), x(8)], {"group": 2, "activation": "Relu"},
            label="grouped 1x1")
    wb = w(12, 8, 3, 3)
    yield S([x(1, 8, 6, 6), wb, x(12)],
            {"pads": p1, "branches": [4, 1, 1, 8, 3, 3], "activation": "Relu"},
            label="branches 1x1 + 3x3, taps outside the 1x1 set (never read)")
    wz = w(12, 16, 3, 3)
    wz[:4, :, [0, 2], :] = 0
    wz[:4, :, :, [0, 2]] = 0
    yield S([x(1, 16, 14, 14), wz, x(12), x(1, 12, 14, 14)],
            {"pads": p1, "branches": [4, 1, 1, 8, 3, 3]},
            label="branches 1x1 + 3x3 with structural zeros, residual (row taps)")
    yield S([x(1, 3, 16, 16), w(8, 3, 7, 7), x(8)],
            {"pads": [3, 3, 3, 3], "strides": [2, 2], "activation": "Relu"},
            label="7x7 stride 2 stem")
    yield S([x(1, 4, 9, 9), w(6, 4, 3, 3)],
            {"dilations": [2, 2], "pads": [2, 2, 2, 2], "activation": "Sigmoid"},
            label="dilated, no bias")
    yield S([x(1, 4, 8, 8), w(6, 4, 3, 3), x(6)],
            {"auto_pad": "SAME_UPPER", "strides": [2, 2], "activation": "HardSwish"},
            label="SAME_UPPER stride 2")
    yield S([x(1, 4, 8, 8), w(6, 4, 3, 3), x(6)],
            {"pads": [0, 0, 1, 1], "activation": "Gelu"}, label="asymmetric pads, gelu")
    yield S([x(1, 4, 10), w(6, 4, 3), x(6)], {"pads": [1, 1], "activation": "Tanh"},
            label="1-D")
    yield S([x(1, 64, 14, 14), w(128, 64, 1, 1), x(128), x(1, 128, 14, 14)],
            {"activation": "Relu"}, label="1x1 residual, threaded adds")
    yield S([x(1, 32, 16, 16), w(64, 32, 3, 3), x(64), x(1, 64, 16, 16)],
            {"pads": p1, "activation": "Relu"}, label="3x3 residual, threaded adds")
    for hw in (28, 30):  # whole 4x4 tiles, and a partial last tile row and column
        yield S([x(1, 64, hw, hw), w(512, 64, 3, 3), x(512), x(1, 512, hw, hw)],
                {"pads": p1, "activation": "Relu"}, label=f"3x3 residual, Winograd {hw}x{hw}")
    yield S([x(1, 16, 57, 57), w(32, 16, 3, 3), x(32), x(1, 32, 29, 29)],
            {"pads": p1, "strides": [2, 2], "activation": "Relu"},
            label="3x3 stride 2 residual, shifted GEMMs")
    yield S([x(1, 16, 15, 15), w(16, 16, 3, 3), x(16), x(1, 16, 8, 8)],
            {"pads": p1, "strides": [2, 2], "activation": "Relu"},
            label="3x3 stride 2 residual, patch matrix with the bias row")
    yield S([x(1, 128, 7, 7), w(256, 128, 3, 3), x(256), x(1, 256, 7, 7)],
            {"pads": p1, "activation": "Relu"}, label="3x3 over 7x7 pixels residual")
    yield S([x(1, 8, 6, 6), w(8, 4, 1, 1), x(8), x(1, 8, 6, 6)], {"group": 2},
            label="grouped 1x1 residual (in place over it)")
    yield S([x(1, 8, 6, 6), w(8, 4, 1, 1), x(8)], {"group": 2, "input_shuffle": 2},
            label="grouped 1x1, shuffled input")
    yield S([x(1, 16, 9, 9), wz, x(12)],
            {"pads": p1, "strides": [2, 2], "branches": [4, 1, 1, 8, 3, 3]},
            label="branches stride 2 with structural zeros (patch matrix)")
    yield S([x(0, 4, 5, 5), w(6, 4, 3, 3), x(6)], {"pads": p1}, label="empty batch")
    d = _normal(rng, np.float64)
    yield S([d(1, 4, 6, 6), d(5, 4, 3, 3) / 6.0, d(5)], {"activation": "Tanh"},
            label="float64")


# ---------------------------------------------------------------------------------------------
# FusedGemm and FusedMatMul

_ACT_ATTRS = {"activation": "", "activation_params": ("FLOATS", [])}


@op(
    "FusedGemm",
    domain=DOMAIN,
    since=1,
    inputs=["A: T", "B: T", "C?: T"],
    outputs=["Y: T"],
    types={"T": FLOATS},
    attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, **_ACT_ATTRS},
    contract=Contract(
        nan="propagate",
        broadcast="unidirectional",
        allowed={"transA": one_of(0, 1), "transB": one_of(0, 1), "activation": _ACT_RULE},
    ),
)
def FusedGemm(
    A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
    activation_params=None,
):
    """act(alpha*A'B' + beta*C) (Gemm with an activation; also MatMul+Add on 2-D operands)."""
    y = Gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return apply_activation(y, activation, activation_params)


@FusedGemm.infer
def _fused_gemm_infer(a, b, c=None, *, transA=0, transB=0, **_):
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return TensorFact(a.dtype, None)
    m = a.shape[1] if transA else a.shape[0]
    n = b.shape[0] if transB else b.shape[1]
    return TensorFact(a.dtype, (m, n))


@FusedGemm.samples
def _fused_gemm_samples(rng):
    r = _normal(rng)
    yield Sample([r(4, 5), r(5, 3), r(3)], {"activation": "Relu"}, label="bias row, relu")
    yield Sample([r(5, 4), r(3, 5), r(4, 3)],
                 {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0, "activation": "Clip",
                  "activation_params": [-0.5, 0.5]}, label="transposed, alpha, beta, clip")
    yield Sample([r(4, 5), r(5, 3), r(1)], {"activation": "LeakyRelu",
                                             "activation_params": [0.2]}, label="scalar C")
    yield Sample([r(4, 5), r(3, 5)], {"transB": 1, "activation": "Sigmoid"}, label="no C")
    yield Sample([r(64, 96), r(96, 80), r(80)], {"activation": "Gelu"}, label="64x96x80")
    d = _normal(rng, np.float64)
    yield Sample([d(3, 4), d(4, 2), d(2)], {"activation": "Tanh"}, label="float64")


@op(
    "FusedMatMul",
    domain=DOMAIN,
    since=1,
    inputs=["A: T", "B: T", "C?: T"],
    outputs=["Y: T"],
    types={"T": FLOATS},
    attrs=_ACT_ATTRS,
    contract=Contract(
        nan="propagate", broadcast="multidirectional", allowed={"activation": _ACT_RULE}
    ),
)
def FusedMatMul(A, B, C=None, *, activation="", activation_params=None):
    """act(MatMul(A, B) + C): NumPy matmul semantics, C broadcast against the product."""
    y = MatMul(A, B)
    if C is not None:
        y = _ew.Add(y, C)
    return apply_activation(y, activation, activation_params)


@FusedMatMul.samples
def _fused_matmul_samples(rng):
    r = _normal(rng)
    yield Sample([r(4, 5), r(5, 6), r(6)], {"activation": "Relu"}, label="2-D, bias")
    yield Sample([r(2, 4, 5), r(5, 3)], {}, label="batched A, no C")
    yield Sample([r(2, 1, 4, 5), r(3, 5, 2), r(2, 3, 4, 2)],
                 {"activation": "HardSwish"}, label="broadcast batch, full C")
    yield Sample([r(64, 128), r(128, 96), r(96)], {"activation": "Relu"}, label="64x128x96")
    d = _normal(rng, np.float64)
    yield Sample([d(3, 4), d(4, 2), d(1)], {"activation": "Sigmoid"}, label="float64")


def _broadcast(*shapes):
    """Multidirectional broadcast of fact shapes (None where unknown)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) == 1:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            named = {d for d in dims if d != 1}
            out.append(named.pop() if len(named) == 1 else None)
    return tuple(out)


@FusedMatMul.infer
def _fused_matmul_infer(a, b, c=None, **_):
    if a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return TensorFact(a.dtype, None)
    batch = _broadcast(a.shape[:-2], b.shape[:-2])
    y = None if batch is None else (*batch, a.shape[-2], b.shape[-1])
    if c is not None and y is not None:
        y = _broadcast(y, c.shape)
    return TensorFact(a.dtype, y)


# ---------------------------------------------------------------------------------------------
# FusedElementwise
#
# `program` is a ';'-separated list of statements `tK=op(arg, ...)`; an argument is an input
# (`x0`, `x1`, ...), an earlier temporary (`tJ`) or a number literal. The last statement is the
# output. Every temporary has the output's shape (the passes only fuse nodes that do), so the
# fast kernel can evaluate the chain in place, chunk by chunk, without broadcasting surprises.


def _hardswish(x, out=None):
    # x is read again at the end, so the gate cannot be built in x's own buffer.
    t = np.asarray(np.divide(x, x.dtype.type(6), out=None if out is x else out))
    t += x.dtype.type(0.5)
    np.clip(t, 0, 1, out=t)
    return np.multiply(t, x, out=out if out is not None else t)


def _sigmoid(x, out=None):
    # 1/(1+e^-x): overflow to inf gives an exact 0; NaN stays NaN.
    t = np.negative(x, out=out)
    np.exp(t, out=t)
    t += t.dtype.type(1)
    return np.reciprocal(t, out=t)


def _leakyrelu(x, alpha, out=None):
    neg = x < 0
    if out is None:
        out = np.empty_like(x)
    np.copyto(out, x)
    np.multiply(out, out.dtype.type(alpha), out=out, where=neg)
    return out


def _relu(x, out=None):
    if out is not None:
        return _act.relu(x, out)  # the chunked maximum against zeros (float32 fast path)
    return np.maximum(x, x.dtype.type(0))


def _clip(x, lo, hi, out=None):
    t = np.maximum(x, x.dtype.type(lo), out=out)
    return np.minimum(t, x.dtype.type(hi), out=t)


def _hardsigmoid(x, alpha, beta, out=None):
    t = np.multiply(x, x.dtype.type(alpha), out=out)
    t += x.dtype.type(beta)
    return np.clip(t, 0, 1, out=t)


def _ref_clip(x, lo, hi):
    return _act.Clip(x, np.asarray(lo, x.dtype), np.asarray(hi, x.dtype))


# name -> (tensor arguments, number parameters, fast fn(*tensors, *params, out=), reference fn)
# The reference functions are the built-in operators' reference kernels, so a fused chain run
# by the reference variant equals the unfused nodes exactly.
PRIMITIVES: dict[str, tuple[int, int, Any, Any]] = {
    "add": (2, 0, np.add, _ew.Add),
    "sub": (2, 0, np.subtract, _ew.Sub),
    "mul": (2, 0, np.multiply, _ew.Mul),
    "div": (2, 0, np.divide, _ew.Div),
    "max": (2, 0, np.maximum, _ew.Max),
    "min": (2, 0, np.minimum, _ew.Min),
    "neg": (1, 0, np.negative, _ew.Neg),
    "abs": (1, 0, np.absolute, _ew.Abs),
    "exp": (1, 0, np.exp, _ew.Exp),
    "log": (1, 0, np.log, _ew.Log),
    "sqrt": (1, 0, np.sqrt, _ew.Sqrt),
    "reciprocal": (1, 0, np.reciprocal, _ew.Reciprocal),
    "tanh": (1, 0, np.tanh, _act.Tanh),
    "relu": (1, 0, _relu, _act.Relu),
    "sigmoid": (1, 0, _sigmoid, _act.Sigmoid),
    "hardswish": (1, 0, _hardswish, _act.HardSwish),
    "leakyrelu": (1, 1, _leakyrelu, lambda x, a: _act.LeakyRelu(x, alpha=a)),
    "clip": (1, 2, _clip, _ref_clip),
    "hardsigmoid": (1, 2, _hardsigmoid, lambda x, a, b: _act.HardSigmoid(x, alpha=a, beta=b)),
}

_STMT = re.compile(r"^\s*(t\d+)\s*=\s*([a-z]+)\((.*)\)\s*$")


@lru_cache(maxsize=1024)
def parse_program(program: str) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    """Statements (dest, op, args) of a program; args are 'xN'/'tN' names or floats."""
    stmts = []
    defined: set[str] = set()
    for k, text in enumerate(s for s in program.split(";") if s.strip()):
        m = _STMT.match(text)
        if m is None:
            raise KernelError(f"FusedElementwise: statement {k} {text!r} is not 'tN=op(args)'")
        dest, name, body = m.groups()
        if name not in PRIMITIVES:
            raise KernelError(
                f"FusedElementwise: statement {k} uses unknown op {name!r}; known: "
                f"{', '.join(sorted(PRIMITIVES))}"
            )
        args: list[Any] = []
        for a in (x.strip() for x in body.split(",") if x.strip()):
            if a[0] in "xt" and a[1:].isdigit():
                if a[0] == "t" and a not in defined:
                    raise KernelError(f"FusedElementwise: statement {k} reads {a} before it is set")
                args.append(a)
            else:
                try:
                    args.append(float(a))
                except ValueError:
                    raise KernelError(f"FusedElementwise: bad argument {a!r} in {text!r}") from None
        ntensor, nparam = PRIMITIVES[name][:2]
        if len(args) != ntensor + nparam or not all(isinstance(a, str) for a in args[:ntensor]):
            raise KernelError(
                f"FusedElementwise: {name} takes {ntensor} tensor and {nparam} number arguments, "
                f"got {text!r}"
            )
        defined.add(dest)
        stmts.append((dest, name, tuple(args)))
    if not stmts:
        raise KernelError("FusedElementwise: empty program")
    return tuple(stmts)


def _program_ok(program: Any) -> bool:
    try:
        parse_program(str(program))
    except KernelError:
        return False
    return True


@op(
    "FusedElementwise",
    domain=DOMAIN,
    since=1,
    inputs=["*inputs: T"],
    outputs=["Y: T"],
    types={"T": ["float32", "float64"]},
    attrs={"program": ("STRING", "")},
    contract=Contract(
        nan="produce",
        broadcast="multidirectional",
        allowed={"program": such_that(_program_ok, "a valid elementwise program")},
    ),
)
def FusedElementwise(*inputs, program=""):
    """An elementwise chain as one node: `program` over the inputs, NumPy broadcasting."""
    env: dict[str, Any] = {f"x{i}": x for i, x in enumerate(inputs)}
    result = None
    with np.errstate(all="ignore"):
        for dest, name, args in parse_program(program):
            ntensor, _, _, fn = PRIMITIVES[name]
            vals = []
            for a in args[:ntensor]:
                if a not in env:
                    raise KernelError(f"FusedElementwise: {a} is not given ({len(inputs)} inputs)")
                vals.append(np.asarray(env[a]))
            result = np.asarray(fn(*vals, *args[ntensor:]))
            env[dest] = result
    return result


@FusedElementwise.infer
def _fused_elementwise_infer(*facts, program=""):
    return TensorFact(facts[0].dtype if facts else None, _broadcast(*[f.shape for f in facts]))


@FusedElementwise.samples
def _fused_elementwise_samples(rng):
    r = _normal(rng)
    yield Sample([r(3, 4), r(4)], {"program": "t0=add(x0,x1);t1=relu(t0)"}, label="add relu")
    yield Sample([r(2, 3, 4), r(3, 1), r(1)],
                 {"program": "t0=mul(x0,x1);t1=add(t0,x2);t2=sigmoid(t1);t3=mul(t2,x0)"},
                 label="broadcast mul add, swish-like")
    yield Sample([np.abs(r(5, 6)) + 0.1],
                 {"program": "t0=sqrt(x0);t1=log(t0);t2=neg(t1);t3=exp(t2);t4=reciprocal(t3)"},
                 label="unary chain")
    yield Sample([r(4, 8), r(4, 8)],
                 {"program": "t0=sub(x0,x1);t1=abs(t0);t2=clip(t1,0.0,6.0);t3=div(t2,x1);"
                             "t4=max(t3,x0);t5=min(t4,x1);t6=tanh(t5)"}, label="binary chain")
    yield Sample([r(64, 64)], {"program": "t0=hardswish(x0);t1=leakyrelu(t0,0.1);"
                                          "t2=hardsigmoid(t1,0.2,0.5)"}, label="activations")
    d = _normal(rng, np.float64)
    yield Sample([d(3, 4), d(3, 4)], {"program": "t0=add(x0,x1);t1=tanh(t0)"}, label="float64")


# The fast variant runs the program in the output buffer with in-place ufuncs (a linear chain
# needs no other memory). Chunking the evaluation into cache-sized slabs (numexpr style) was
# measured slower here: with a 480 MiB L3 every tensor of the light zoo stays in cache, so the
# per-chunk dispatch costs more than it saves.


def last_reads(stmts) -> dict[str, int]:
    """Name -> index of the last statement of a parsed program that reads it."""
    last: dict[str, int] = {}
    for k, (_, _, args) in enumerate(stmts):
        for a in args:
            if isinstance(a, str):
                last[a] = k
    return last


def _compile(program: str):
    """Statements with each temporary mapped to a register: the output buffer (-1) first, then
    scratch buffers, reusing dead ones; a linear chain runs entirely in the output buffer."""
    stmts = parse_program(program)
    last = last_reads(stmts)
    reg_of: dict[str, int] = {}
    free: list[int] = [-1]
    nregs = 0
    plan = []
    for k, (dest, name, args) in enumerate(stmts):
        srcs = tuple(reg_of[a] if isinstance(a, str) and a[0] == "t" else a for a in args)
        # Temporaries whose last reader is this statement can hold its result (ufuncs allow
        # exact in-place operation).
        for a in set(args):
            if isinstance(a, str) and a[0] == "t" and last.get(a) == k and a in reg_of:
                free.append(reg_of.pop(a))
        if k == len(stmts) - 1:
            dst = -1  # every live temporary is read here, so the output buffer is free
        elif -1 in free:
            free.remove(-1)
            dst = -1
        elif free:
            dst = free.pop()
        else:
            dst, nregs = nregs, nregs + 1
        reg_of[dest] = dst
        plan.append((PRIMITIVES[name][2], PRIMITIVES[name][0], srcs, dst))
    return tuple(plan), nregs


_compile_cached = lru_cache(maxsize=1024)(_compile)


def _generate(plan, nregs: int):
    """The plan as one straight-line Python function run(xs, regs, out): no per-step
    interpretation, so a small tensor's chain costs about its bare ufunc calls."""

    def name(s) -> str:
        if isinstance(s, str):
            return f"xs[{int(s[1:])}]"
        return "out" if s < 0 else f"r{s}"

    lines = ["def run(xs, regs, out):"]
    lines += [f"    r{j} = regs[{j}]" for j in range(nregs)]
    env: dict[str, Any] = {}
    for k, (fn, ntensor, srcs, dst) in enumerate(plan):
        env[f"f{k}"] = fn
        # Numbers by name: repr() of inf / nan is no Python literal (Clip without a bound).
        args = [name(a) for a in srcs[:ntensor]]
        for j, p in enumerate(srcs[ntensor:]):
            env[f"c{k}_{j}"] = float(p)
            args.append(f"c{k}_{j}")
        lines.append(f"    f{k}({', '.join(args)}, out={name(dst)})")
    exec("\n".join(lines), env)  # noqa: S102 - source built from a parsed, whitelisted program
    return env["run"]


# Programs whose ops can overflow or leave their domain run under errstate (a context manager
# costs a few microseconds, as much as a small tensor's whole chain).
_QUIET = frozenset({"add", "sub", "mul", "max", "min", "neg", "abs", "relu", "clip", "tanh",
                    "leakyrelu", "hardsigmoid", "hardswish"})
_SETUPS: dict[tuple, tuple] = {}


def _setup(program: str, shapes: tuple) -> tuple:
    """(plan, scratch count, output shape, needs errstate) per program and input shapes."""
    key = (program, shapes)
    got = _SETUPS.get(key)
    if got is None:
        plan, nregs = _compile_cached(program)
        noisy = any(name not in _QUIET for _, name, _ in parse_program(program))
        got = (_generate(plan, nregs), nregs, np.broadcast_shapes(*shapes), noisy)
        if len(_SETUPS) > 4096:
            _SETUPS.clear()
        _SETUPS[key] = got
    return got


@FusedElementwise.kernel(device="cpu", name="fusedelementwise.cpu.inplace", accepts_out=True,
                         priority=10)
def fused_elementwise_inplace(*inputs, program="", out=None):
    """The program evaluated in place in `out` (scratch buffers only for non-linear programs)."""
    xs = [x if isinstance(x, np.ndarray) else np.asarray(x) for x in inputs]
    run, nregs, shape, noisy = _setup(program, tuple(x.shape for x in xs))
    dtype = xs[0].dtype
    if out is None:
        out = np.empty(shape, dtype)
    regs = [np.empty(shape, dtype) for _ in range(nregs)]
    if noisy:
        with np.errstate(all="ignore"):
            run(xs, regs, out)
    else:
        run(xs, regs, out)
    return out


# ---------------------------------------------------------------------------------------------
# ChannelShuffle
#
# The layout pass emits it for ShuffleNet's Reshape -> Transpose -> Reshape chain on channels-last
# data: the same channel permutation as one node (one copy, into a planned buffer), instead of a
# Reshape of a transposed view that NumPy copies into a fresh array on every run.


@op(
    "ChannelShuffle",
    domain=DOMAIN,
    since=1,
    inputs=["X: T"],
    outputs=["Y: T"],
    types={"T": ["float16", "float32", "float64", "bfloat16", "int8", "uint8", "int32", "int64",
                 "bool"]},
    attrs={"group": 1},
    contract=Contract(
        nan="propagate",
        allowed={"group": such_that(lambda g: int(g) >= 1, "a positive integer")},
    ),
)
def ChannelShuffle(X, *, group=1):
    """Channels on the LAST axis, split as (group, C/group), transposed and merged:
    Y[..., j*group + i] = X[..., i*(C/group) + j]."""
    return shuffle_channels(X, int(group), axis=-1, what="ChannelShuffle")


@ChannelShuffle.infer
def _channel_shuffle_infer(x, *, group=1):
    return TensorFact(x.dtype, x.shape)


@ChannelShuffle.samples
def _channel_shuffle_samples(rng):
    r = _normal(rng)
    yield Sample([r(1, 5, 5, 12)], {"group": 3}, label="NHWC map, group 3")
    yield Sample([r(1, 56, 56, 24)], {"group": 4}, label="56x56x24, group 4")
    yield Sample([rng.integers(-9, 9, size=(2, 8)).astype(np.int32)], {"group": 2},
                 label="int32")


@ChannelShuffle.grad
def _channel_shuffle_grad(ctx, dY, *, group=1):
    # A permutation's gradient is its inverse: the shuffle with the complementary group.
    c = np.shape(dY)[-1] if np.ndim(dY) else 1
    return (shuffle_channels(dY, c // int(group), axis=-1),)


@ChannelShuffle.grad_cases
def _channel_shuffle_grad_cases(op_type, since):
    return [Sample([away_from_zero(2, 3, 12)], {"group": g}, label=f"group{g}") for g in (2, 3, 4)]
