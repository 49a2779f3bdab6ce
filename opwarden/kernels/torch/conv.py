"""Conv and FusedConv on the torch device: the generic kernels (NCHW and NHWC), their node-bound
kernels, and their registration. How one convolution runs (plans, GEMM, packed oneDNN and
branch paths) is kernels.torch.conv_plan.

The generic kernels take NumPy arrays; an NHWC input is viewed as a channels-last NCHW tensor
(what oneDNN convolves fastest) and the output goes back as a contiguous NHWC array. FusedConv
runs the convolution with its bias, then the residual and activation in place on the fresh
output; a folded `input_shuffle` runs first (kernels.torch.movement). Anything a kernel cannot
express in torch goes to the operator's reference kernel, so every variant is exact on every
input the reference accepts.

Node-bound kernels (Variant.specialize, NHWC only): the generic kernels work out on every call
what depends only on the node: the plan (a lookup keyed on shapes and attributes), the
inference-mode guard, the packed weights' cache entry, the bias tensor, the layout views and
checks. In a model each call finds those caches cold after the previous convolution's traffic,
and that bookkeeping costs about as much as a small oneDNN call itself. A node's bound kernel
prepares all of it on its first call (`_conv_runner`) and then, while the input shape, the
weights and the bias are those it prepared for, makes only the calls that move data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from opwarden.errors import KernelError
from opwarden.kernels.cpu.fused import _whole_ok
from opwarden.kernels.torch import conv_plan, tensors
from opwarden.kernels.torch.activation import _activate_
from opwarden.kernels.torch.conv_plan import (
    _BRANCH_SPLIT_MIN_C,
    _POINTWISE,
    _PW_ACT,
    _branch_parts,
    _branches_apart,
    _branches_run,
    _conv_gemm,
    _conv_out_shape,
    _conv_plan,
    _conv_run,
    _grouped_gemm,
    _mm_bias,
    _packed_weight,
    _pointwise_weight,
    _pw_epilogue,
)
from opwarden.kernels.torch.movement import _channel_shuffle
from opwarden.kernels.torch.runtime import _CUDA, _SERIAL_FLOPS, _add, _each, _Mode
from opwarden.kernels.torch.tensors import (
    _call_ref,
    _nchw_view,
    _np,
    _opt,
    _readonly_tensor,
    _t,
    _to_nhwc,
)
from opwarden.memory.constants import is_constant


def _conv_kernel(ref: Callable[..., Any], nhwc: bool):
    def kernel(X, W, B=None, **attrs):
        plan = _conv_plan(X, W, attrs, nhwc)
        if plan is None:
            return _call_ref(ref, (X, W, B), attrs, nhwc)
        with _Mode(plan.flops < _SERIAL_FLOPS):
            if plan.gemm:
                return _conv_gemm(X, W, B, None, groups=plan.groups)
            if nhwc:
                return _to_nhwc(_conv_run(_nchw_view(X), W, B, plan))
            return _np(_conv_run(_t(X), W, B, plan))

    return kernel


def _fused_conv_kernel(ref: Callable[..., Any], nhwc: bool):
    def kernel(X, W, B=None, Z=None, *, activation="", activation_params=(), **attrs):
        shuffle = int(attrs.pop("input_shuffle", 0) or 0)
        branches = list(attrs.pop("branches", None) or ())
        if shuffle > 1 and nhwc and not _CUDA and np.ndim(X) >= 3:
            X = _channel_shuffle(X, group=shuffle)  # a folded ChannelShuffle, first
            shuffle = 0
        if branches and nhwc and Z is None and is_constant(W) and (
            np.ndim(X) == 4 and np.shape(X)[-1] >= _BRANCH_SPLIT_MIN_C
        ):
            y = _branches_apart(X, W, B, branches, attrs, activation, activation_params)
            if y is not None:
                return y
        # Branches run as one convolution over W only with finite inputs and zero taps outside
        # the branches (see kernels.cpu.fused._whole_ok).
        exact = bool(branches) and not _whole_ok(X, W, B, branches)
        plan = None if shuffle > 1 or exact else _conv_plan(X, W, attrs, nhwc)
        if plan is None:  # (a folded input shuffle, too, is left to the reference)
            return _call_ref(
                ref, (X, W, B, Z),
                dict(attrs, activation=activation, activation_params=activation_params,
                     input_shuffle=shuffle, branches=branches), nhwc,
            )
        with _Mode(plan.flops < _SERIAL_FLOPS):
            if plan.gemm:
                return _conv_gemm(X, W, B, Z, activation, activation_params, plan.groups)
            x = _nchw_view(X) if nhwc else _t(X)
            z = None
            if Z is not None:
                z = _nchw_view(Z) if nhwc else _t(Z)
                want = _conv_out_shape(x.shape, np.shape(W), plan)
                if tuple(z.shape) != want:
                    if nhwc:
                        want = (want[0], *want[2:], want[1])
                    raise KernelError(
                        f"FusedConv: residual Z has shape {tuple(np.shape(Z))}, expected Y's "
                        f"shape {want}{' (NHWC)' if nhwc else ''}"
                    )
            y = _conv_run(x, W, B, plan, activation, activation_params, z)
            return _to_nhwc(y) if nhwc else _np(y)

    return kernel



_F32 = np.dtype(np.float32)
_FUSED_ONLY = ("activation", "activation_params", "input_shuffle", "branches")


def _conv_runner(X, W, B, Z, attrs: dict, activation: str, params, shuffle: int,
                 branches: list) -> Callable[[np.ndarray, Any], np.ndarray] | None:
    """A prepared NHWC Conv/FusedConv for calls like this one (X, Z shapes; these constant W
    and B), or None where the generic kernel must decide on every call."""
    if not (isinstance(X, np.ndarray) and X.ndim == 4 and X.dtype == _F32 and not _CUDA
            and isinstance(W, np.ndarray) and is_constant(W)
            and (B is None or (isinstance(B, np.ndarray) and is_constant(B)))
            and (Z is None or (isinstance(Z, np.ndarray) and Z.dtype == _F32))):
        return None
    if branches:
        if Z is not None or shuffle > 1 or X.shape[-1] < _BRANCH_SPLIT_MIN_C:
            return None  # (fewer channels: the whole-W path checks X for non-finite values)
        return _branches_runner(X, W, B, branches, attrs, activation, params)
    plan = _conv_plan(X, W, attrs, True)
    if plan is None or plan.pad_arg is not None or plan.flops < _SERIAL_FLOPS:
        return None
    c, m = X.shape[-1], W.shape[0]
    if plan.gemm:
        if shuffle > 1:
            return None
        return _gemm_runner(W, B, c, m, plan.groups, X.shape[:-1] + (m,), activation, params)
    act = _PW_ACT.get(activation)
    if not plan.packed or conv_plan._PACK_FAILED or act is None:
        return None
    w = _packed_weight(W, plan, (X.shape[0], c, X.shape[1], X.shape[2]))
    b = None if B is None else _readonly_tensor(np.ascontiguousarray(B))
    name, scalars, alg, after = _pw_epilogue(act, params, Z is not None)
    pad, stride, dil, groups = list(plan.padding), list(plan.stride), list(plan.dilation), \
        plan.groups
    conv, binary = _POINTWISE, _POINTWISE.binary

    def run(X: np.ndarray, Z: Any) -> np.ndarray:
        if shuffle > 1:
            X = _channel_shuffle(X, group=shuffle)
        x = torch.from_numpy(X.transpose(0, 3, 1, 2))  # NCHW, channels-last in memory
        if Z is None:
            y = conv(x, w, b, pad, stride, dil, groups, name, scalars, alg)
        else:
            z = torch.from_numpy(Z.transpose(0, 3, 1, 2))
            y = binary(x, z, w, b, pad, stride, dil, groups, "add", None, None, [], "")
        if after:
            y = _activate_(y, activation, params)
        r = y.numpy().transpose(0, 2, 3, 1)
        return r if r.flags.c_contiguous else np.ascontiguousarray(r)

    return run


def _gemm_runner(W, B, c: int, m: int, groups: int, shape: tuple, activation: str, params):
    """A prepared pointwise convolution: one GEMM (grouped: one batched GEMM) over pixels."""
    wt = _pointwise_weight(W, c) if groups == 1 else None
    b = _opt(B)

    def run(X: np.ndarray, Z: Any) -> np.ndarray:
        x2 = torch.from_numpy(X.reshape(-1, c))
        y = _grouped_gemm(x2, W, B, groups) if wt is None else _mm_bias(x2, wt, b)
        if Z is not None:
            y.add_(torch.from_numpy(Z.reshape(-1, m)))
        if activation:
            y = _activate_(y, activation, params)
        return y.numpy().reshape(shape)

    return run


def _branches_runner(X, W, B, branches, attrs, activation, params):
    """A prepared FusedConv with branches apart: _branches_run with each branch's GEMM views
    and packed convolution made once."""
    try:
        parts = _branch_parts(X, W, branches, attrs)
    except KernelError:
        return None
    if parts is None or sum(plan.flops for _, _, plan in parts) < _SERIAL_FLOPS:
        return None
    return _branches_run(X, W, B, parts, activation, params, prepared=True)


def _bound_conv(generic: Callable[..., Any], fused: bool):
    """Variant.specialize for the NHWC Conv/FusedConv variants."""

    def specialize(kwargs: Mapping[str, Any]) -> Callable[..., Any]:
        attrs = {k: v for k, v in kwargs.items() if k not in _FUSED_ONLY}
        activation = kwargs.get("activation", "") or ""
        params = tuple(kwargs.get("activation_params", None) or ())
        shuffle = int(kwargs.get("input_shuffle", 0) or 0)
        branches = list(kwargs.get("branches", None) or ())
        state: list[Any] = [None]  # (X shape, W, B, Z shape or None, runner or None)

        def run_generic(X, W, B, Z, kw):
            return generic(X, W, B, Z, **kw) if fused else generic(X, W, B, **kw)

        def call(X, W, B, Z, kw):
            s = state[0]
            if (s is not None and W is s[1] and B is s[2] and type(X) is np.ndarray
                    and X.shape == s[0] and X.dtype == _F32):
                # (torch warns once per process about read-only arrays; the generic kernel
                # has silenced that by now, see tensors._readonly_tensor)
                if s[4] is not None and (X.flags.writeable or tensors._READONLY_WARNED) and (
                    Z is None if s[3] is None else (
                        type(Z) is np.ndarray and Z.shape == s[3] and Z.dtype == _F32
                    )
                ):
                    try:
                        return s[4](X, Z)
                    except ValueError:  # pragma: no cover - negative strides (from_numpy)
                        pass
                return run_generic(X, W, B, Z, kw)
            y = run_generic(X, W, B, Z, kw)
            # The generic kernel accepted these inputs: prepare for the next call like it.
            runner = _conv_runner(X, W, B, Z, attrs, activation, params, shuffle, branches)
            state[0] = (np.shape(X), W, B, None if Z is None else np.shape(Z), runner)
            return y

        if fused:
            def fused_conv(X, W, B=None, Z=None, **kw):
                return call(X, W, B, Z, kw)
            return fused_conv

        def plain_conv(X, W, B=None, **kw):
            return call(X, W, B, None, kw)
        return plain_conv

    return specialize


def register() -> None:
    """Add the Conv and FusedConv variants (both layouts; NHWC ones node-bound too) to the torch
    device."""
    for layout in ("NCHW", "NHWC"):
        nhwc = layout == "NHWC"
        suffix = layout.lower()
        for o in _each("Conv"):
            fn = _conv_kernel(o.reference, nhwc)
            _add(o, fn, f"conv.torch.{suffix}", layout=layout,
                 specialize=_bound_conv(fn, fused=False) if nhwc else None)
        for o in _each("FusedConv", "opwarden"):
            fn = _fused_conv_kernel(o.reference, nhwc)
            _add(o, fn, f"fusedconv.torch.{suffix}", layout=layout,
                 specialize=_bound_conv(fn, fused=True) if nhwc else None)
