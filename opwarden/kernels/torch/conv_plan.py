"""How one convolution runs on the torch device: its plan, and the paths the plan picks.

`_conv_plan` works out, once per shapes and attributes (cached), everything that depends only on
them (`_ConvPlan`: stride, padding and the pad a padded copy needs, dilation, groups, FLOPs) and
the path:
- pointwise (1x1, stride 1, unpadded) NHWC convolutions under `_GEMM_MAX_FLOPS` are one GEMM
  over the (N*H*W, C) pixels (`_conv_gemm`), grouped ones one batched GEMM whose groups write
  their column blocks of the result in place from `_GROUPED_OUT_MIN_ROWS` pixels;
- NHWC 2-D float32 convolutions with constant weights take oneDNN's fused convolution
  (`_POINTWISE`, the op torch.compile uses on CPU: weights reordered once into the blocked
  format, bias, activation and a residual add in the epilogue; `_conv_packed`), except that the
  NaN-eating relu and clip run after it;
- the rest torch.convolution, with the activation in place after it (`_conv_run`).
A FusedConv's `branches` from `_BRANCH_SPLIT_MIN_C` input channels run one convolution per branch,
each writing its channels of one NHWC result (`_branches_run`: 1x1 branches as GEMMs straight into
their columns), instead of one convolution over W's structural zeros.

The generic and node-bound kernels that use these paths are in kernels.torch.conv.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from opwarden.errors import KernelError
from opwarden.kernels.torch import tensors
from opwarden.kernels.torch.activation import _activate_
from opwarden.kernels.torch.runtime import _CUDA, _SERIAL_FLOPS, _Mode
from opwarden.kernels.torch.tensors import (
    _np,
    _opt,
    _pad_arg,
    _readonly_tensor,
    _t,
    _tup,
)
from opwarden.memory.constants import is_constant
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.conv import conv_pads, spatial_params
from opwarden.ops.fused import branch_convs

# Bound here rather than imported by name: CPython compiles `name.get(...)` on an imported name as
# an attribute load plus call, on a module global as the cheaper method call.
_CONSTS = tensors._CONSTS

# oneDNN's fused convolution and its weight reorder (None where this torch build lacks them).
_POINTWISE = getattr(getattr(torch.ops, "mkldnn", None), "_convolution_pointwise", None)
_REORDER = getattr(torch._C._nn, "mkldnn_reorder_conv2d_weight", None)
_PW_ACT = {
    "": ("none", None), "Relu": ("relu", None), "Sigmoid": ("sigmoid", None),
    "Tanh": ("tanh", None), "HardSwish": ("hardswish", None), "LeakyRelu": ("leaky_relu", 1),
    "Clip": ("hardtanh", 2), "Gelu": ("gelu", 0),
}


class _ConvPlan:
    """Everything about one convolution that depends only on shapes and attributes."""

    __slots__ = ("stride", "padding", "pad_arg", "dilation", "groups", "packed", "gemm", "flops")

    def __init__(self, stride, padding, pad_arg, dilation, groups, packed, gemm=False,
                 flops=math.inf) -> None:
        self.stride, self.padding, self.pad_arg = stride, padding, pad_arg
        self.dilation, self.groups, self.packed = dilation, groups, packed
        self.gemm, self.flops = gemm, flops


_CONV_PLANS: dict[tuple, _ConvPlan | None] = {}


def _conv_plan(X, W, attrs: dict, nhwc: bool) -> _ConvPlan | None:
    """The plan for this convolution, or None when the reference kernel must run it."""
    xs, ws = np.shape(X), np.shape(W)
    key = (
        xs, ws, nhwc, X.dtype, _tup(attrs.get("strides")), _tup(attrs.get("dilations")),
        _tup(attrs.get("pads")), attrs.get("auto_pad", "NOTSET"), attrs.get("group", 1),
        _tup(attrs.get("kernel_shape")),
    )
    try:
        return _CONV_PLANS[key]
    except KeyError:
        pass
    plan = _make_conv_plan(xs, ws, X.dtype, attrs, nhwc)
    if len(_CONV_PLANS) > 4096:  # dynamic shapes: keep the table bounded
        _CONV_PLANS.clear()
    _CONV_PLANS[key] = plan
    return plan


def _make_conv_plan(xs, ws, dtype, attrs: dict, nhwc: bool) -> _ConvPlan | None:
    if len(xs) != len(ws) or not 3 <= len(xs) <= 5:
        return None
    ks = attrs.get("kernel_shape")
    if ks and tuple(ks) != tuple(ws[2:]):
        return None
    c = xs[-1] if nhwc else xs[1]
    g = int(attrs.get("group", 1))
    if g < 1 or c != ws[1] * g or ws[0] % g:
        return None
    in_sp = xs[1:-1] if nhwc else xs[2:]
    nsp = len(ws) - 2
    try:
        s, d = spatial_params(nsp, attrs.get("strides"), attrs.get("dilations"))
        begin, end = conv_pads(list(in_sp), list(ws[2:]), s, d, attrs.get("pads"),
                               attrs.get("auto_pad", "NOTSET"))
    except KernelError:
        return None
    flops = 2.0 * xs[0] * ws[0] * math.prod(ws[1:])
    for n, b, e, k, di, st in zip(in_sp, begin, end, ws[2:], d, s):
        if n + b + e - (k - 1) * di - 1 < 0:
            return None  # the window does not fit the input: the reference says so
        flops *= (n + b + e - (k - 1) * di - 1) // st + 1
    pad_arg = None
    if begin != end or min(begin, default=0) < 0:
        pad_arg = _pad_arg(begin, end)
        begin = [0] * nsp
    packed = (
        nhwc and not _CUDA and nsp == 2 and dtype == np.float32 and _POINTWISE is not None
        and _REORDER is not None and ws[1] >= _PACK_MIN_CIN
    )
    # A pointwise (1x1, stride 1, unpadded, ungrouped) NHWC convolution is one GEMM over the
    # (N*H*W, C) view of the input, giving (N*H*W, M) = NHWC output directly: oneDNN's fused
    # convolution has a fixed cost per call that small GEMMs do not pay. (With passive waiting
    # the GEMM on these skinny shapes runs serial: _SERIAL_FLOPS.) Grouped (not depthwise)
    # pointwise convolutions are one batched GEMM over the groups.
    pointwise = (
        nhwc and pad_arg is None and all(k == 1 for k in ws[2:])
        and all(v == 1 for v in s) and not any(begin)
    )
    gemm = pointwise and (
        (g == 1 and (not packed or 2 * math.prod(xs) * ws[0] < _GEMM_MAX_FLOPS))
        or (g > 1 and ws[1] > 1)
    )
    return _ConvPlan(s, begin, pad_arg, d, g, packed, gemm, flops)


_GEMM_MAX_FLOPS = 40e6
# Convolutions with at least this many input channels per group take oneDNN's packed kernel
# (with current torch it wins from one channel on, RGB stems and depthwise included; an older
# torch's packed stem was slower, hence the knob).
_PACK_MIN_CIN = 1


def _conv_gemm(X, W, B, Z, activation="", params=(), groups: int = 1) -> np.ndarray:
    """act(X @ W^T + B (+ Z)) for a pointwise NHWC convolution, as an NHWC array (with
    `groups`, one batched GEMM of each group's channels)."""
    x = _t(X)
    c, m = x.shape[-1], np.shape(W)[0]
    x2 = x.reshape(-1, c)
    y = (_grouped_gemm(x2, W, B, groups) if groups > 1
         else _mm_bias(x2, _pointwise_weight(W, c), _opt(B)))
    if Z is not None:
        want = (*x.shape[:-1], m)
        if tuple(np.shape(Z)) != want:
            raise KernelError(
                f"FusedConv: residual Z has shape {tuple(np.shape(Z))}, expected Y's shape "
                f"{want} (NHWC)"
            )
        y.add_(_t(Z).reshape(-1, m))
    y = _activate_(y, activation, params)
    return _np(y).reshape(*x.shape[:-1], m)


def _pointwise_weight(W, c: int) -> torch.Tensor:
    """A pointwise convolution's W (M, C, 1, ...) as the (C, M) right-hand GEMM operand."""
    return _t(W).reshape(np.shape(W)[0], c).t()


def _mm_bias(x2: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """(P, C) pixels @ wt (+ b): (P, M), written into `out` when given (a column block of a
    wider result is fine: its strides are BLAS-compatible)."""
    return torch.mm(x2, wt, out=out) if b is None else torch.addmm(b, x2, wt, out=out)


# Grouped GEMMs over at least this many pixels write each group's block of the result in place;
# fewer take one batched GEMM and a copy (cheaper for few pixels).
_GROUPED_OUT_MIN_ROWS = 128


def _grouped_gemm(x2: torch.Tensor, W, B, g: int) -> torch.Tensor:
    """(P, C) pixels times each group's (M/g, C/g) weights: (P, M), one batched GEMM (faster
    than oneDNN's grouped convolution)."""
    p, c = x2.shape
    m = np.shape(W)[0]
    cg, mg = c // g, m // g

    def make(w: np.ndarray) -> torch.Tensor:
        return _readonly_tensor(w).reshape(g, mg, cg).transpose(1, 2).contiguous()

    wt = _CONSTS.get(W, ("grouped", g), make) if is_constant(W) else make(W)
    xg = x2.reshape(p, g, cg).transpose(0, 1)  # (g, P, C/g), a strided view

    def bmm(out=None) -> torch.Tensor:
        if B is None:
            return torch.bmm(xg, wt, out=out)
        return torch.baddbmm(_t(B).reshape(g, 1, mg), xg, wt, out=out)

    if p < _GROUPED_OUT_MIN_ROWS:
        return bmm().transpose(0, 1).reshape(p, m)
    # Each group's GEMM writes its column block of the (P, M) result in place (the (g, P, M/g)
    # view has BLAS-compatible strides), instead of a (g, P, M/g) result copied over.
    y = torch.empty((p, m), dtype=x2.dtype, device=x2.device)
    bmm(out=y.view(p, g, mg).transpose(0, 1))
    return y


def _packed_weight(W: np.ndarray, plan: _ConvPlan, xshape) -> Any:
    """W reordered for oneDNN (cached while W lives; only for constant weights)."""

    def make(w: np.ndarray) -> Any:
        return _REORDER(
            # (to_mkldnn reads a strided tensor's memory as if it were contiguous)
            _readonly_tensor(np.ascontiguousarray(w)).to_mkldnn(), plan.padding, plan.stride,
            plan.dilation,
            plan.groups, list(xshape),
        )

    key = ("pk", tuple(plan.padding), tuple(plan.stride), tuple(plan.dilation), plan.groups)
    return _CONSTS.get(W, key, make)


_PACK_FAILED = False


def _conv_run(x: torch.Tensor, W, B, plan: _ConvPlan, activation="", params=(), z=None):
    """act(conv(x, W) + B (+ z)) as a tensor in x's memory format."""
    global _PACK_FAILED
    if plan.pad_arg is not None:
        x = F.pad(x, plan.pad_arg)
    if plan.packed and not _PACK_FAILED and is_constant(W):
        act = _PW_ACT.get(activation)
        if act is not None:
            try:
                return _conv_packed(x, W, B, plan, act, params, z, activation)
            except RuntimeError:  # pragma: no cover - an oneDNN build without the fused op
                _PACK_FAILED = True
    y = torch.convolution(
        x, _t(W), _opt(B), plan.stride, plan.padding, plan.dilation, False,
        [0] * len(plan.stride), plan.groups,
    )
    if z is not None:
        y.add_(z)
    return _activate_(y, activation, params)


# oneDNN's fused relu and clip (hardtanh) turn NaN into 0 or a bound, where FusedConv's
# contract propagates it: those activations run unfused, one in-place pass over the output just
# written (cheaper than checking the inputs for NaN first).
_NAN_EATERS = ("relu", "hardtanh")


def _pw_epilogue(act, params, residual: bool) -> tuple[str, list, str, bool]:
    """(oneDNN unary attr, its scalars, its algorithm, whether the activation runs after the
    convolution instead) for a _PW_ACT entry: NaN eaters and any activation that follows a
    fused residual add run after it."""
    name, nparams = act
    if residual or name in _NAN_EATERS:
        return "none", [], "", name != "none"
    p = [float(v) for v in (params or ())]
    if nparams == 1:
        return name, [p[0] if p else 0.01], "", False
    if nparams == 2:
        return name, [p[0] if len(p) > 0 else -math.inf, p[1] if len(p) > 1 else math.inf], "", \
            False
    if nparams == 0:
        return name, [], "tanh" if p and p[0] else "none", False
    return name, [], "", False


def _conv_packed(x, W, B, plan: _ConvPlan, act, params, z, activation: str):
    w = _packed_weight(W, plan, x.shape)
    b = None if B is None else _t(np.ascontiguousarray(B))  # (oneDNN ignores a bias's stride)
    name, scalars, alg, after = _pw_epilogue(act, params, z is not None)
    if z is not None:  # the residual add fused, the activation after it
        y = _POINTWISE.binary(x, z, w, b, plan.padding, plan.stride, plan.dilation,
                              plan.groups, "add", None, None, [], "")
    else:
        y = _POINTWISE(x, w, b, plan.padding, plan.stride, plan.dilation, plan.groups,
                       name, scalars, alg)
    return _activate_(y, activation, params) if after else y


# FusedConv branches from this many input channels run as one convolution each (no products
# with W's structural zeros), each writing its channels of the NHWC result; with fewer, one
# convolution over the whole W (cheaper for few channels).
_BRANCH_SPLIT_MIN_C = 16


def _branches_apart(X, W, B, branches, attrs, activation, params) -> np.ndarray | None:
    """act(concat of each branch's convolution) in NHWC; None when a branch has no plan."""
    try:
        parts = _branch_parts(X, W, branches, attrs)
    except KernelError:
        return None  # the reference names the problem
    if parts is None:
        return None
    with _Mode(sum(plan.flops for _, _, plan in parts) < _SERIAL_FLOPS):
        return _branches_run(X, W, B, parts, activation, params, prepared=False)(X, None)


def _branches_run(X, W, B, parts, activation, params, prepared: bool):
    """run(X, Z=None) for branches apart: each branch writes its channels of one NHWC result, a
    1x1 one as a GEMM straight into its columns, a kxk one as a convolution copied into them.
    `prepared` (a node-bound kernel; CPU, constant weights): the GEMM views and the packed
    convolutions with their arguments are made here, once; else each call goes through
    _conv_run (padding, torch.convolution, the packed kernel's fallback)."""
    n, _h, _w, c = X.shape
    m = np.shape(W)[0]
    steps = []
    for wb, (m0, m1), plan in parts:
        bb = None if B is None else B[m0:m1]
        if plan.gemm:
            steps.append((m0, m1, True, _pointwise_weight(wb, c), _opt(bb)))
        elif prepared and plan.packed and not _PACK_FAILED and plan.pad_arg is None:
            wp = _packed_weight(wb, plan, (n, c, X.shape[1], X.shape[2]))
            bt = None if bb is None else _t(np.ascontiguousarray(bb))  # (see _conv_packed)
            args = (list(plan.padding), list(plan.stride), list(plan.dilation), plan.groups)

            def conv(x, wp=wp, bt=bt, args=args):
                return _POINTWISE(x, wp, bt, *args, "none", [], "")

            steps.append((m0, m1, False, conv, None))
        elif prepared:
            return None
        else:
            steps.append((m0, m1, False, lambda x, wb=wb, bb=bb, plan=plan: _conv_run(
                x, wb, bb, plan), None))
    out_sp = _conv_out_shape((n, c, *X.shape[1:3]), parts[0][0].shape, parts[0][2])[2:]
    tensor = torch.from_numpy if prepared else _t

    def run(X: np.ndarray, Z: Any = None) -> np.ndarray:
        t = tensor(X)
        x = t.permute(0, 3, 1, 2)  # NCHW, channels-last in memory
        x2 = t.reshape(-1, c)
        y = torch.empty((n, *out_sp, m), dtype=x.dtype, device=x.device)
        y2 = y.view(-1, m)
        for m0, m1, gemm, w, b in steps:
            if gemm:  # straight into its columns
                _mm_bias(x2, w, b, out=y2[:, m0:m1])
            else:
                y[..., m0:m1].copy_(w(x).permute(0, 2, 3, 1))
        return _np(_activate_(y, activation, params))

    return run


def _branch_parts(X, W, branches, attrs) -> list | None:
    """Per branch (its weights, a contiguous read-only copy; its output channels (m0, m1); its
    conv plan), worked out once per weights, branches, input shape and attributes; None when a
    branch has no plan. KernelError for invalid branches."""
    key = ("branches", tuple(int(v) for v in branches), np.shape(X), X.dtype,
           *(_tup(attrs.get(a)) for a in ("pads", "strides", "dilations")),
           attrs.get("auto_pad", "NOTSET"))

    def make(w: np.ndarray) -> list | None:
        out, m0 = [], 0
        for wb, _bb, a in branch_convs(np.shape(X), w, None, branches, attrs, channel_axis=3):
            # Cached with the constant W it is cut from: constant too (its packing is cached).
            wb = mark_constant(np.ascontiguousarray(wb))
            plan = _conv_plan(X, wb, a, True)
            if plan is None:
                return None
            out.append((wb, (m0, m0 + wb.shape[0]), plan))
            m0 += wb.shape[0]
        return out

    return _CONSTS.get(W, key, make)


def _conv_out_shape(xs, ws, plan: _ConvPlan) -> tuple:
    sp = list(xs[2:])
    if plan.pad_arg is not None:
        flat = plan.pad_arg
        for i in range(len(sp)):
            j = len(sp) - 1 - i
            sp[i] += flat[2 * j] + flat[2 * j + 1]
    out = [
        (n + 2 * p - (k - 1) * d - 1) // s + 1
        for n, p, k, d, s in zip(sp, plan.padding, ws[2:], plan.dilation, plan.stride)
    ]
    return (xs[0], ws[0], *out)
