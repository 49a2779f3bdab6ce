"""Fused operators (domain "opwarden") created by the graph passes: FusedConv, FusedGemm,
FusedMatMul, ChannelShuffle (FusedElementwise: fused_elementwise.py).

Each reference kernel computes exactly the math of the nodes it replaces by calling their
reference kernels in the same order (Conv then +Z then the activation), so a fused graph agrees
with the unfused one bit for bit; fast variants (opwarden/kernels) are checked against these.

Each fused operator also declares the operators it computes (``pieces``, FusedElementwise's
too): a device whose profile does not name the fused operator runs it when it runs every piece
(devices.base). Its cost (``flops``) is its base operator's rule: the residual add and the
activation count as bytes moved, not FLOPs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops import activation as _act
from opwarden.ops import elementwise as _ew
from opwarden.ops.base import Sample, op
from opwarden.ops.common import broadcast_shapes, normal
from opwarden.ops.conv import (
    AUTO_PAD,
    Conv,
    _conv_flops,
    _conv_workspace,
    conv_out_shape,
    conv_pads,
    conv_weights,
    spatial_params,
)
from opwarden.ops.grad import away_from_zero
from opwarden.ops.linalg import Gemm, MatMul, _gemm_flops, _matmul_flops

DOMAIN = "opwarden"
ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "Gelu", "Tanh", "Swish")
FLOATS = ["float16", "float32", "float64", "bfloat16"]
_ACT_RULE = one_of(*ACTIVATIONS)


def apply_activation(y: np.ndarray, activation: str, params) -> np.ndarray:
    """`activation` (one of ACTIVATIONS) applied to y through the built-in reference kernels.

    params: Clip [min, max] (either may be missing: [] or [min]), LeakyRelu [alpha],
    Gelu [0] exact (default) or [1] tanh approximation, Swish [alpha] (x sigmoid(alpha x),
    default 1: SiLU, computed as the Sigmoid and Mul nodes it replaces do); the others take
    none.
    """
    p = [float(v) for v in (params or ())]
    if not activation:
        return y
    if activation in ("Relu", "Sigmoid", "HardSwish", "Tanh"):
        return _act.REFERENCES[activation](y)
    if activation == "Clip":
        lo = np.asarray(p[0], y.dtype) if len(p) > 0 else None
        hi = np.asarray(p[1], y.dtype) if len(p) > 1 else None
        return _act.Clip(y, lo, hi)
    if activation == "LeakyRelu":
        return _act.LeakyRelu(y, alpha=p[0] if p else 0.01)
    if activation == "Gelu":
        return _act.Gelu(y, approximate="tanh" if p and p[0] else "none")
    if activation == "Swish":
        alpha = p[0] if p else 1.0
        if alpha == 1.0:
            return _ew.Mul(y, _act.Sigmoid(y))
        return _act.Swish(y, alpha=alpha)
    raise KernelError(f"unknown fused activation {activation!r}; expected one of {ACTIVATIONS}")


Piece = tuple[str, dict[str, Any], list[Any]]


def _activation_piece(node: Any) -> list[Piece]:
    """The fused activation as a piece over the node's output ([] without one); Swish as
    the Sigmoid and Mul it computes (Swish the operator is opset 24 only)."""
    act = node.attrs.get("activation", "")
    if isinstance(act, bytes):
        act = act.decode()
    if act == "Swish":
        y = node.outputs[:1]
        return [("Sigmoid", {}, y), ("Mul", {}, y + y)]
    return [(act, {}, node.outputs[:1])] if act else []


def _residual_piece(node: Any, index: int) -> list[Piece]:
    """The Add of the optional input `index` to the node's output ([] when it is omitted)."""
    if len(node.inputs) > index and node.inputs[index] is not None:
        return [("Add", {}, [node.outputs[0], node.inputs[index]])]
    return []


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


# The attributes of the Conv piece (the shuffle and the branches are FusedConv's own).
_CONV_PIECE_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@FusedConv.pieces
def _fused_conv_pieces(node: Any) -> list[Piece]:
    """Conv(X, W, B), + Z, the activation."""
    attrs = {k: v for k, v in node.attrs.items() if k in _CONV_PIECE_ATTRS}
    return [("Conv", attrs, node.inputs[:3]), *_residual_piece(node, 3), *_activation_piece(node)]


FusedConv.flops(_conv_flops)


@FusedConv.samples
def _fused_conv_samples(rng):
    """One call per kernel path (ONNX layout; the harness moves X and Z to NHWC for NHWC
    variants; W and B also as initializers): 1x1 as a GEMM, k x k, strided, depthwise (with a
    folded shuffle), grouped (in place over a residual, after an input shuffle), branches (with
    and without structural zeros, row taps and the patch matrix), the few-channel stem,
    dilated, SAME padding, asymmetric pads, 1-D, residuals on GEMMs big enough for the
    threaded adds, on the Winograd, shifted-GEMM, patch-matrix and few-pixel paths, every
    activation, an empty batch, float64."""
    x = normal(rng)

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
    silu = {"activation": "Swish", "activation_params": [1.0]}
    yield S([x(1, 16, 7, 7), w(24, 16, 1, 1), x(24), x(1, 24, 7, 7)], silu,
            label="1x1 residual, silu")
    yield S([x(1, 24, 9, 9), w(24, 1, 3, 3), x(24)],
            {"group": 24, "pads": p1, "strides": [2, 2], **silu}, label="depthwise stride 2, silu")
    yield S([x(1, 8, 6, 6), w(8, 8, 3, 3), x(8)], {"pads": p1, **silu}, label="3x3, silu")
    yield S([x(1, 3, 16, 16), w(8, 3, 3, 3), x(8)],
            {"pads": p1, "strides": [2, 2], "activation": "Swish",
             "activation_params": [1.702]}, label="3x3 stride 2 stem, swish alpha 1.702")
    yield S([x(0, 4, 5, 5), w(6, 4, 3, 3), x(6)], {"pads": p1}, label="empty batch")
    d = normal(rng, np.float64)
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


@FusedGemm.pieces
def _fused_gemm_pieces(node: Any) -> list[Piece]:
    """Gemm(A, B, C), the activation."""
    attrs = {k: v for k, v in node.attrs.items() if k in ("alpha", "beta", "transA", "transB")}
    return [("Gemm", attrs, node.inputs), *_activation_piece(node)]


FusedGemm.flops(_gemm_flops)


@FusedGemm.samples
def _fused_gemm_samples(rng):
    r = normal(rng)
    yield Sample([r(4, 5), r(5, 3), r(3)], {"activation": "Relu"}, label="bias row, relu")
    yield Sample([r(5, 4), r(3, 5), r(4, 3)],
                 {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0, "activation": "Clip",
                  "activation_params": [-0.5, 0.5]}, label="transposed, alpha, beta, clip")
    yield Sample([r(4, 5), r(5, 3), r(1)], {"activation": "LeakyRelu",
                                             "activation_params": [0.2]}, label="scalar C")
    yield Sample([r(4, 5), r(3, 5)], {"transB": 1, "activation": "Sigmoid"}, label="no C")
    yield Sample([r(64, 96), r(96, 80), r(80)], {"activation": "Gelu"}, label="64x96x80")
    yield Sample([r(8, 12), r(12, 16), r(16)], {"activation": "Swish",
                                                 "activation_params": [1.0]}, label="silu")
    d = normal(rng, np.float64)
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
    r = normal(rng)
    yield Sample([r(4, 5), r(5, 6), r(6)], {"activation": "Relu"}, label="2-D, bias")
    yield Sample([r(2, 4, 5), r(5, 3)], {}, label="batched A, no C")
    yield Sample([r(2, 1, 4, 5), r(3, 5, 2), r(2, 3, 4, 2)],
                 {"activation": "HardSwish"}, label="broadcast batch, full C")
    yield Sample([r(64, 128), r(128, 96), r(96)], {"activation": "Relu"}, label="64x128x96")
    yield Sample([r(2, 4, 5), r(5, 3), r(3)], {"activation": "Swish",
                                               "activation_params": [1.702]},
                 label="batched, swish alpha 1.702")
    d = normal(rng, np.float64)
    yield Sample([d(3, 4), d(4, 2), d(1)], {"activation": "Sigmoid"}, label="float64")


@FusedMatMul.pieces
def _fused_matmul_pieces(node: Any) -> list[Piece]:
    """MatMul(A, B), + C, the activation."""
    return [("MatMul", {}, node.inputs[:2]), *_residual_piece(node, 2), *_activation_piece(node)]


FusedMatMul.flops(_matmul_flops)


@FusedMatMul.infer
def _fused_matmul_infer(a, b, c=None, **_):
    if a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return TensorFact(a.dtype, None)
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    y = None if batch is None else (*batch, a.shape[-2], b.shape[-1])
    if c is not None and y is not None:
        y = broadcast_shapes(y, c.shape)
    return TensorFact(a.dtype, y)


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
    r = normal(rng)
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
