"""Operators: conv family (Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState),
with Conv's backward rule (im2col columns against dY), gradcheck cases and cost (FLOPs) rules.

All kernels are N-dimensional over NCHW-style layouts (batch, channels, *spatial). Convolutions
run as im2col + one batched GEMM; the only Python loops are over kernel offsets.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

from opwarden.contract import Contract, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op, shape_size
from opwarden.ops.grad import away_from_zero, differentiable, fit

AUTO_PAD = one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_POSITIVE_GROUP = such_that(lambda g: int(g) >= 1, "a positive integer")


# ---------------------------------------------------------------------------------------------
# Shared geometry helpers (also used by pool.py)


def acc_dtype(dtype: np.dtype) -> type:
    """The dtype a kernel accumulates in: float64 for doubles, float32 for narrower floats."""
    return np.float64 if dtype == np.float64 else np.float32


def spatial_params(nsp: int, strides, dilations) -> tuple[list[int], list[int]]:
    """Strides and dilations as per-axis lists, defaulting to 1."""
    s = [int(v) for v in strides] if strides else [1] * nsp
    d = [int(v) for v in dilations] if dilations else [1] * nsp
    if len(s) != nsp or len(d) != nsp:
        raise KernelError(f"strides {s} / dilations {d} must have {nsp} values (spatial rank)")
    if min(s + d, default=1) < 1:
        raise KernelError(f"strides {s} and dilations {d} must be positive")
    return s, d


def explicit_pads(nsp: int, pads) -> tuple[list[int], list[int]]:
    """`pads` ([b1..bn, e1..en]) split into begin and end lists, defaulting to 0."""
    if not pads:
        return [0] * nsp, [0] * nsp
    if len(pads) != 2 * nsp:
        raise KernelError(f"pads {list(pads)} must have {2 * nsp} values (2 x spatial rank)")
    return [int(p) for p in pads[:nsp]], [int(p) for p in pads[nsp:]]


def split_same(total: int, auto_pad: str) -> tuple[int, int]:
    """Split a total padding; the odd pixel goes to the end (SAME_UPPER) or start (SAME_LOWER)."""
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def conv_pads(in_sp, kernel, strides, dilations, pads, auto_pad) -> tuple[list[int], list[int]]:
    """Begin/end pads of a forward convolution or pooling window (ONNX auto_pad rules)."""
    nsp = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(in_sp, kernel, strides, dilations):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            b, e = split_same(total, auto_pad)
            begin.append(b)
            end.append(e)
        return begin, end
    if auto_pad == "VALID":
        return [0] * nsp, [0] * nsp
    return explicit_pads(nsp, pads)


def pad_spatial(x: np.ndarray, begin, end, value=0) -> np.ndarray:
    """x padded (or, for negative pads, cropped) on its spatial axes (2:)."""
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(n + b + e for n, b, e in zip(x.shape[2:], begin, end))
    y = np.full(shape, value, dtype=x.dtype)
    src = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(x.shape[2:], begin, end))
    dst = tuple(slice(max(b, 0), max(b, 0) + (s.stop - s.start)) for b, s in zip(begin, src))
    y[(slice(None), slice(None)) + dst] = x[(slice(None), slice(None)) + src]
    return y


def window_slices(offset, strides, dilations, out_sp) -> tuple[slice, ...]:
    """Spatial slices picking, for every output position, the input at kernel offset `offset`."""
    return tuple(
        slice(o * d, o * d + (n - 1) * s + 1, s)
        for o, d, n, s in zip(offset, dilations, out_sp, strides)
    )


def im2col(xp: np.ndarray, kernel, strides, dilations, out_sp) -> np.ndarray:
    """Patches of a padded input (N, C, *padded) as (N, C, K, P), K=prod(kernel), P=prod(out)."""
    n, c = xp.shape[:2]
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides):
        # 1x1 kernels: the input already is the patch matrix
        return xp.reshape(n, c, 1, math.prod(xp.shape[2:]))
    cols = np.empty((n, c, math.prod(kernel)) + tuple(out_sp), dtype=xp.dtype)
    for j, off in enumerate(np.ndindex(*kernel)):
        view = window_slices(off, strides, dilations, out_sp)
        cols[:, :, j] = xp[(slice(None), slice(None)) + view]
    return cols.reshape(n, c, cols.shape[2], math.prod(out_sp))


def col2im(cols: np.ndarray, kernel, strides, dilations, grid, size) -> np.ndarray:
    """Sum patches cols (N, C, K, *grid) back into an image (N, C, *size); inverse of im2col."""
    y = np.zeros(cols.shape[:2] + tuple(size), dtype=cols.dtype)
    if y.dtype == object:
        y[...] = ""  # string Col2Im concatenates; "" is the additive identity
    for j, off in enumerate(np.ndindex(*kernel)):
        view = window_slices(off, strides, dilations, grid)
        y[(slice(None), slice(None)) + view] += cols[:, :, j]
    return y


def conv_out_shape(in_sp, kernel, strides, dilations, begin, end) -> list[int]:
    """Output spatial shape of a forward convolution over explicitly padded input."""
    out = [
        (n + b + e - ((k - 1) * d + 1)) // s + 1
        for n, k, s, d, b, e in zip(in_sp, kernel, strides, dilations, begin, end)
    ]
    if min(out, default=1) < 1:
        raise KernelError(
            f"kernel {list(kernel)} (dilations {list(dilations)}) does not fit the padded input "
            f"{[n + b + e for n, b, e in zip(in_sp, begin, end)]}"
        )
    return out


def _grouped_gemm(w: np.ndarray, cols: np.ndarray, group: int) -> np.ndarray:
    """W (M, C/g, *k) applied to patches (N, C, K, P): (N, M, P)."""
    n, c, k, p = cols.shape
    m = w.shape[0]
    wg = w.reshape(group, m // group, (c // group) * k)
    y = np.matmul(wg, cols.reshape(n, group, (c // group) * k, p))
    return y.reshape(n, m, p)


def _check_conv_shapes(x: np.ndarray, w: np.ndarray, group: int, what: str) -> None:
    if x.ndim < 3 or w.ndim != x.ndim:
        raise KernelError(f"{what}: X {x.shape} and W {w.shape} must have the same rank >= 3")
    if group < 1 or x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise KernelError(
            f"{what}: X has {x.shape[1]} channels and W is {w.shape} with group={group}; "
            f"need C == W.shape[1] * group and W.shape[0] divisible by group"
        )


def _check_bias(b, m: int, what: str) -> None:
    if b is not None and b.shape != (m,):
        raise KernelError(f"{what}: bias shape {b.shape} must be ({m},)")


def _add_bias(y: np.ndarray, b) -> np.ndarray:
    if b is not None:
        y += b.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


# ---------------------------------------------------------------------------------------------
# Conv


def _conv_workspace(x, w, *rest, auto_pad="NOTSET", dilations=None, pads=None, strides=None, **_):
    """im2col matrix (N, C*K, P) plus the padded input copy, in float32 bytes (x2 for doubles)."""
    if not all(isinstance(v, int) for v in tuple(x) + tuple(w)):
        return 0
    nsp = len(x) - 2
    try:
        s, d = spatial_params(nsp, strides, dilations)
        b, e = conv_pads(x[2:], w[2:], s, d, pads, auto_pad)
        out = conv_out_shape(x[2:], w[2:], s, d, b, e)
    except KernelError:
        return 0
    padded = x[0] * x[1] * math.prod(n + pb + pe for n, pb, pe in zip(x[2:], b, e))
    cols = x[0] * x[1] * math.prod(w[2:]) * math.prod(out)
    return int((padded + cols) * 8)


_CONV_CONTRACT = Contract(
    layout="NCHW",
    nan="propagate",
    workspace_bytes=_conv_workspace,
    tolerance="normwise",  # sums of products: the fast paths reorder and transform them
    allowed={"auto_pad": AUTO_PAD, "group": _POSITIVE_GROUP},
)


@op("Conv", since=1, layout_inputs=(0,), contract=_CONV_CONTRACT)
def Conv(
    X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
    strides=None,
):
    """N-D convolution (cross-correlation), groups, dilations, padding (ONNX Conv-1/11/22)."""
    group = int(group)
    _check_conv_shapes(X, W, group, "Conv")
    _check_bias(B, W.shape[0], "Conv")
    kernel = W.shape[2:]
    if kernel_shape and tuple(kernel_shape) != kernel:
        raise KernelError(f"Conv: kernel_shape {list(kernel_shape)} != W spatial {list(kernel)}")
    nsp = X.ndim - 2
    s, d = spatial_params(nsp, strides, dilations)
    begin, end = conv_pads(X.shape[2:], kernel, s, d, pads, auto_pad)
    out_sp = conv_out_shape(X.shape[2:], kernel, s, d, begin, end)
    acc = acc_dtype(X.dtype)
    xp = pad_spatial(X.astype(acc, copy=False), begin, end)
    cols = im2col(xp, kernel, s, d, out_sp)
    y = _grouped_gemm(W.astype(acc, copy=False), cols, group)
    y = _add_bias(y.reshape((X.shape[0], W.shape[0]) + tuple(out_sp)), B)
    return y.astype(X.dtype, copy=False)


@Conv.flops
def _conv_flops(ins, outs):
    """Two per product: each output element meets the weights of its group, W[1:]."""
    return 2.0 * shape_size(outs[0]) * shape_size(ins[1][1:]) if len(ins) >= 2 and outs else None


def conv_weights(rng: np.random.Generator, *shape: int, dtype=np.float32) -> np.ndarray:
    """Random convolution weights scaled by 1/sqrt(fan-in), as trained nets have them: outputs
    stay ~N(0, 1) however many terms a sum has, so comparisons against the reference measure
    the kernel, not float32 rounding of huge sums."""
    w = rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))
    return w.astype(dtype)


@Conv.samples
def _conv_samples(rng):
    """One call per path of the fast convolution kernels (kernels.conv), W and B also checked as
    initializers: pointwise over few pixels (transposed GEMM; with and without a bias), larger
    and grouped pointwise, row taps (k x k, row stride 1, 196+ pixels), shifted GEMMs (16+
    channels, 700+ pixels), the banded patch matrix (with the bias row, without a bias,
    grouped), few output pixels with large weights, Winograd (3x3 stride 1, C*M >= 2^15 over
    7x7+ tiles), the few-channel stem (direct taps, phase planes), depthwise, dilated, SAME and
    asymmetric padding, an empty batch, 1-D."""
    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def w(*shape):
        return conv_weights(rng, *shape)

    p1 = [1, 1, 1, 1]
    s2 = {"pads": p1, "strides": [2, 2]}
    calls = [
        ("1x1, few pixels", (1, 8, 5, 5), (16, 8, 1, 1), True, {}),
        ("1x1, few pixels, no bias", (1, 8, 5, 5), (16, 8, 1, 1), False, {}),
        ("1x1", (1, 16, 12, 12), (24, 16, 1, 1), True, {}),
        ("grouped 1x1", (1, 8, 6, 6), (8, 4, 1, 1), True, {"group": 2}),
        ("3x3 row taps", (1, 16, 14, 14), (16, 16, 3, 3), True, {"pads": p1}),
        ("3x3 stride 2, shifted GEMMs, no bias", (1, 16, 57, 57), (32, 16, 3, 3), False, s2),
        ("3x1, shifted GEMMs over whole rows", (1, 16, 28, 28), (16, 16, 3, 1), True,
         {"pads": [1, 0, 1, 0]}),
        ("3x3 stride 2, patch matrix with the bias row", (1, 16, 15, 15), (16, 16, 3, 3),
         True, s2),
        ("3x3 stride 2, patch matrix, no bias", (1, 16, 15, 15), (16, 16, 3, 3), False, s2),
        ("grouped 3x3", (1, 8, 9, 9), (8, 4, 3, 3), True, {"pads": p1, "group": 2}),
        ("3x3 over 7x7 pixels, large weights", (1, 128, 7, 7), (256, 128, 3, 3), True,
         {"pads": p1}),
        ("3x3 Winograd", (1, 64, 28, 28), (512, 64, 3, 3), True, {"pads": p1}),
        ("3x3 Winograd, partial tiles", (1, 64, 30, 30), (512, 64, 3, 3), True, {"pads": p1}),
        # M 8: the compiled direct loop; M 6 (not in its 8-blocks): the NumPy stem's paths
        ("7x7 stride 2 stem (direct loop)", (1, 3, 16, 16), (8, 3, 7, 7), True,
         {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
        ("7x7 stride 2 stem (phase planes)", (1, 3, 16, 16), (6, 3, 7, 7), True,
         {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
        ("3x3 stride 2 stem (direct taps)", (1, 3, 17, 17), (6, 3, 3, 3), True,
         {"strides": [2, 2]}),
        ("depthwise", (1, 8, 7, 7), (8, 1, 3, 3), True, {"pads": p1, "group": 8}),
        ("dilated", (1, 4, 9, 9), (6, 4, 3, 3), False, {"pads": [2] * 4, "dilations": [2, 2]}),
        ("SAME_UPPER stride 2", (1, 4, 8, 8), (6, 4, 3, 3), True,
         {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ("asymmetric pads", (1, 4, 8, 8), (6, 4, 3, 3), True, {"pads": [0, 0, 1, 1]}),
        ("empty batch", (0, 4, 5, 5), (6, 4, 3, 3), True, {"pads": p1}),
        ("1-D", (1, 4, 10), (6, 4, 3), True, {"pads": [1, 1]}),
        ("1-D strided, grouped", (1, 6, 21), (6, 3, 4), True, {"strides": [2], "group": 2}),
        ("1-D dilated, SAME_UPPER", (1, 4, 15), (5, 4, 3), False,
         {"dilations": [2], "auto_pad": "SAME_UPPER"}),
    ]
    for label, xs, ws, bias, attrs in calls:
        inputs = [x(*xs), w(*ws)] + ([x(ws[0])] if bias else [])
        yield Sample(inputs, attrs, label=label, constants=(1, 2) if bias else (1,))


def _conv_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = away_from_zero(2, 4, 5, 5)
    return [
        Sample([x, away_from_zero(3, 4, 3, 3, seed=2), away_from_zero(3, seed=3)],
               {"pads": [1, 1, 1, 1]}),
        Sample([x, away_from_zero(4, 2, 2, 3, seed=4)],
               {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 1, 0]},
               label="groups strides dilations"),
        Sample([x, away_from_zero(2, 4, 3, 3, seed=5)],
               {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, label="SAME_LOWER"),
        Sample([away_from_zero(1, 2, 6), away_from_zero(2, 2, 3, seed=6)], {"strides": [2]},
               label="1-D"),
    ]


@differentiable("Conv", cases=_conv_grad_cases)
def _conv_grad(ctx, dY, **attrs):
    # dW: each output gradient against the im2col columns; dX: the columns' gradient folded
    # back (col2im) and unpadded.
    X, W = (np.asarray(x) for x in ctx.inputs[:2])
    B = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    group = int(attrs.get("group", 1) or 1)
    kernel = W.shape[2:]
    nsp = X.ndim - 2
    s, d = spatial_params(nsp, attrs.get("strides"), attrs.get("dilations"))
    begin, end = conv_pads(X.shape[2:], kernel, s, d, attrs.get("pads"), attrs.get("auto_pad"))
    out_sp = dY.shape[2:]
    n, c = X.shape[:2]
    m = W.shape[0]
    xp = pad_spatial(X.astype(dY.dtype, copy=False), begin, end)
    cols = im2col(xp, kernel, s, d, out_sp)  # (N, C, K, P)
    k, p = cols.shape[2], cols.shape[3]
    colsg = cols.reshape(n, group, (c // group) * k, p)
    gy = dY.reshape(n, group, m // group, p)
    wg = W.astype(dY.dtype, copy=False).reshape(group, m // group, (c // group) * k)
    dw = np.einsum("ngmp,ngkp->gmk", gy, colsg).reshape(W.shape)
    dcols = np.einsum("gmk,ngmp->ngkp", wg, gy).reshape((n, c, k) + tuple(out_sp))
    dxp = col2im(dcols, kernel, s, d, out_sp, xp.shape[2:])
    dx = pad_spatial(dxp, [-b for b in begin], [-e for e in end])
    db = None if B is None else dY.sum(axis=(0,) + tuple(range(2, dY.ndim)))
    return fit(ctx, dx, dw, db)


# ---------------------------------------------------------------------------------------------
# ConvTranspose


def _convtranspose_geometry(in_sp, kernel, s, d, out_pad, output_shape, pads, auto_pad):
    """(pads begin, pads end, output spatial shape) of a transposed convolution."""
    nsp = len(in_sp)
    full = [si * (n - 1) + op + (k - 1) * di + 1
            for n, k, si, di, op in zip(in_sp, kernel, s, d, out_pad)]
    if output_shape:
        out = [int(v) for v in output_shape][-nsp:]
        if len(out) != nsp:
            raise KernelError(f"output_shape {list(output_shape)} must have {nsp} spatial values")
        mode = "SAME_UPPER" if auto_pad == "SAME_UPPER" else "SAME_LOWER"
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [n * si for n, si in zip(in_sp, s)]
        mode = auto_pad
    else:
        begin, end = (([0] * nsp, [0] * nsp) if auto_pad == "VALID"
                      else explicit_pads(nsp, pads))
        out = [f - b - e for f, b, e in zip(full, begin, end)]
        if min(out, default=1) < 1:
            raise KernelError(f"ConvTranspose: pads {list(pads)} leave no output (full {full})")
        return begin, end, out
    begin, end = [], []
    for f, o in zip(full, out):
        b, e = split_same(f - o, mode)
        begin.append(b)
        end.append(e)
    return begin, end, out


def _convtranspose_workspace(x, w, *rest, group=1, **_):
    """Column buffer (N, M*K, P_in) before col2im, in float32 bytes (x2 for doubles)."""
    if not all(isinstance(v, int) for v in tuple(x) + tuple(w)) or not x[1]:
        return 0
    m = w[1] * int(group or 1)
    return int(x[0] * m * math.prod(w[2:]) * math.prod(x[2:]) * 8)


@op(
    "ConvTranspose",
    layout_inputs=(0,),
    since=1,
    contract=Contract(
        layout="NCHW",
        nan="propagate",
        workspace_bytes=_convtranspose_workspace,
        allowed={"auto_pad": AUTO_PAD, "group": _POSITIVE_GROUP},
    ),
)
def ConvTranspose(
    X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    output_padding=None, output_shape=None, pads=None, strides=None,
):
    """N-D transposed convolution (ONNX ConvTranspose-1/11/22)."""
    group = int(group)
    if X.ndim < 3 or W.ndim != X.ndim or X.shape[1] != W.shape[0] or X.shape[1] % group:
        raise KernelError(
            f"ConvTranspose: X {X.shape} and W {W.shape} (group={group}) need the same rank and "
            f"W.shape[0] == C divisible by group"
        )
    n, c = X.shape[:2]
    m = W.shape[1] * group
    _check_bias(B, m, "ConvTranspose")
    kernel = W.shape[2:]
    nsp = X.ndim - 2
    s, d = spatial_params(nsp, strides, dilations)
    out_pad = [int(v) for v in output_padding] if output_padding else [0] * nsp
    if len(out_pad) != nsp:
        raise KernelError(f"ConvTranspose: output_padding {out_pad} must have {nsp} values")
    begin, end, out_sp = _convtranspose_geometry(
        X.shape[2:], kernel, s, d, out_pad, output_shape, pads, auto_pad
    )
    acc = acc_dtype(X.dtype)
    k = math.prod(kernel)
    # Every input pixel scatters W[c, :, *k] * x into the output: first the products (a GEMM
    # per group), then col2im sums the overlapping kernel footprints.
    x = X.astype(acc, copy=False).reshape(n, group, c // group, -1)
    w = W.astype(acc, copy=False).reshape(group, c // group, (m // group) * k)
    cols = np.matmul(w.transpose(0, 2, 1), x).reshape((n, m, k) + X.shape[2:])
    full = [si * (i - 1) + op + (kk - 1) * di + 1
            for i, kk, si, di, op in zip(X.shape[2:], kernel, s, d, out_pad)]
    y = col2im(cols, kernel, s, d, X.shape[2:], full)
    # Crop the pads (negative pads, from a larger output_shape, grow the output with zeros).
    y = pad_spatial(y, [-b for b in begin], [-e for e in end])
    assert list(y.shape[2:]) == list(out_sp)
    return _add_bias(y, B).astype(X.dtype, copy=False)


@ConvTranspose.flops
def _convtranspose_flops(ins, outs):
    """Two per product: each input element scatters over the weights of its group, W[1:]."""
    return 2.0 * shape_size(ins[0]) * shape_size(ins[1][1:]) if len(ins) >= 2 else None


# ---------------------------------------------------------------------------------------------
# DeformConv


def _bilinear_sample(xg: np.ndarray, coords: list[np.ndarray], in_sp) -> np.ndarray:
    """N-linear samples of xg (N, G, Cg, prod(in)) at coords (each (N, G, P)); zero outside."""
    base = [np.floor(c) for c in coords]
    frac = [c - b for c, b in zip(coords, base)]
    base = [b.astype(np.int64) for b in base]
    out = None
    for corner in product((0, 1), repeat=len(in_sp)):
        weight = np.ones_like(coords[0])
        valid = np.ones(coords[0].shape, dtype=bool)
        flat = np.zeros(coords[0].shape, dtype=np.int64)
        for bit, b, f, size in zip(corner, base, frac, in_sp):
            idx = b + bit
            weight = weight * (f if bit else 1 - f)
            valid &= (idx >= 0) & (idx < size)
            flat = flat * size + np.clip(idx, 0, size - 1)
        vals = np.take_along_axis(xg, flat[:, :, None, :], axis=3)
        term = vals * np.where(valid, weight, 0)[:, :, None, :]
        out = term if out is None else out + term
    return out


def _deform_workspace(x, w, offset, *rest, **_):
    """Sampled column buffer (N, C*K, P) in float32 bytes (x2 for doubles)."""
    if not all(isinstance(v, int) for v in tuple(x) + tuple(w) + tuple(offset)):
        return 0
    return int(x[0] * x[1] * math.prod(w[2:]) * math.prod(offset[2:]) * 8)


@op(
    "DeformConv",
    since=19,
    contract=Contract(
        layout="NCHW",
        nan="propagate",
        workspace_bytes=_deform_workspace,
        allowed={"group": _POSITIVE_GROUP, "offset_group": _POSITIVE_GROUP},
    ),
)
def DeformConv(
    X, W, offset, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
    offset_group=1, pads=None, strides=None,
):
    """N-D deformable convolution with optional modulation mask (ONNX DeformConv-19/22)."""
    group, og = int(group), int(offset_group)
    _check_conv_shapes(X, W, group, "DeformConv")
    n, c = X.shape[:2]
    m = W.shape[0]
    _check_bias(B, m, "DeformConv")
    if c % og:
        raise KernelError(f"DeformConv: {c} channels not divisible by offset_group={og}")
    kernel = W.shape[2:]
    nsp = X.ndim - 2
    in_sp = X.shape[2:]
    s, d = spatial_params(nsp, strides, dilations)
    begin, end = explicit_pads(nsp, pads)
    out_sp = conv_out_shape(in_sp, kernel, s, d, begin, end)
    k, p = math.prod(kernel), math.prod(out_sp)
    want = (n, og * k * nsp) + tuple(out_sp)
    if offset.shape != want:
        raise KernelError(f"DeformConv: offset shape {offset.shape}, expected {want}")
    want = (n, og * k) + tuple(out_sp)
    if mask is not None and mask.shape != want:
        raise KernelError(f"DeformConv: mask shape {mask.shape}, expected {want}")
    acc = acc_dtype(X.dtype)
    xg = X.astype(acc, copy=False).reshape(n, og, c // og, -1)
    offs = offset.astype(acc, copy=False).reshape(n, og, k, nsp, p)
    masks = None if mask is None else mask.astype(acc, copy=False).reshape(n, og, k, p)
    # Undeformed sampling grid: output position * stride - pad_begin, per axis, flattened.
    grid = np.meshgrid(*[np.arange(o) * si - b for o, si, b in zip(out_sp, s, begin)],
                       indexing="ij")
    grid = [g.reshape(-1).astype(acc) for g in grid]
    cols = np.empty((n, og, c // og, k, p), dtype=acc)
    for j, off in enumerate(np.ndindex(*kernel)):
        coords = [grid[i] + off[i] * d[i] + offs[:, :, j, i] for i in range(nsp)]
        sampled = _bilinear_sample(xg, coords, in_sp)
        if masks is not None:
            sampled = sampled * masks[:, :, j, None, :]
        cols[:, :, :, j] = sampled
    y = _grouped_gemm(W.astype(acc, copy=False), cols.reshape(n, c, k, p), group)
    y = _add_bias(y.reshape((n, m) + tuple(out_sp)), B)
    return y.astype(X.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Col2Im


@op("Col2Im", since=18, contract=Contract(layout="NCHW", nan="propagate", overflow="wrap"))
def Col2Im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Sum column blocks (N, C*prod(block), L) into images (N, C, *image_shape) (ONNX Col2Im-18)."""
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nsp = len(image)
    if len(block) != nsp or input.ndim != 3:
        raise KernelError(
            f"Col2Im: input {input.shape} must be 3-D and image_shape {image} / block_shape "
            f"{block} the same length"
        )
    n, ck, blocks = input.shape
    k = math.prod(block)
    if k == 0 or ck % k:
        raise KernelError(f"Col2Im: input dim 1 ({ck}) is not a multiple of prod(block) ({k})")
    s, d = spatial_params(nsp, strides, dilations)
    begin, end = explicit_pads(nsp, pads)
    grid = conv_out_shape(image, block, s, d, begin, end)
    if math.prod(grid) != blocks:
        raise KernelError(
            f"Col2Im: input has {blocks} blocks but image {image} with block {block}, "
            f"strides {s}, dilations {d}, pads {begin + end} gives {grid}"
        )
    x = input
    if x.dtype == np.bool_:
        x = x.astype(np.int64)  # overlapping True blocks combine as a logical OR
    elif x.dtype.kind == "f" and x.dtype.itemsize < 4 or x.dtype.kind == "V":
        x = x.astype(np.float32)
    cols = x.reshape((n, ck // k, k) + tuple(grid))
    padded = [i + b + e for i, b, e in zip(image, begin, end)]
    y = col2im(cols, block, s, d, grid, padded)
    y = pad_spatial(y, [-b for b in begin], [-e for e in end])
    if input.dtype == np.bool_:
        return y != 0
    return y.astype(input.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# CausalConvWithState


def _causal_workspace(x, w, *rest, **_):
    """The state-prefixed input (B, C, L + k - 1) and the output accumulator, as float64 bytes."""
    if len(x) != 3 or len(w) != 3 or not all(isinstance(v, int) for v in tuple(x) + tuple(w)):
        return 0
    return int(x[0] * x[1] * (2 * x[2] + w[2] - 1) * 8)


@op(
    "CausalConvWithState",
    since=27,
    contract=Contract(
        nan="propagate",
        workspace_bytes=_causal_workspace,
        allowed={"activation": one_of("none", "silu", "swish")},
    ),
)
def CausalConvWithState(input, weight, bias=None, past_state=None, *, activation="none"):
    """Causal depthwise 1-D conv carrying the last k-1 positions (ONNX CausalConvWithState-27)."""
    if input.ndim != 3 or weight.ndim != 3 or weight.shape[:2] != (input.shape[1], 1):
        raise KernelError(
            f"CausalConvWithState: input {input.shape} must be (B, C, L) and weight "
            f"{weight.shape} (C, 1, k)"
        )
    b, c, length = input.shape
    k = weight.shape[2]
    if k < 1:
        raise KernelError("CausalConvWithState: kernel size must be >= 1")
    _check_bias(bias, c, "CausalConvWithState")
    acc = acc_dtype(input.dtype)
    if past_state is None:
        past = np.zeros((b, c, k - 1), dtype=acc)
    elif past_state.shape != (b, c, k - 1):
        raise KernelError(
            f"CausalConvWithState: past_state shape {past_state.shape}, expected {(b, c, k - 1)}"
        )
    else:
        past = past_state.astype(acc)
    padded = np.concatenate([past, input.astype(acc)], axis=2)
    w = weight.astype(acc)[:, 0, :]
    y = np.zeros((b, c, length), dtype=acc)
    for j in range(k):
        y += w[None, :, j, None] * padded[:, :, j:j + length]
    y = _add_bias(y, bias)
    if activation in ("silu", "swish"):
        with np.errstate(over="ignore"):  # exp(-y) -> inf for very negative y gives -0
            y = y / (1 + np.exp(-y))
    present = padded[:, :, padded.shape[2] - (k - 1):]
    return y.astype(input.dtype), present.astype(input.dtype)
