"""Fast float32 BatchNormalization (inference), LayerNormalization, InstanceNormalization and
LRN for the CPU."""

from __future__ import annotations

import math

import numpy as np

from opwarden import native
from opwarden.errors import KernelError
from opwarden.kernels.cpu import cast
from opwarden.kernels.cpu.blas_split import share
from opwarden.kernels.cpu.util import EW_CHUNK, F32, ones_row, output, scratch
from opwarden.ops.base import REGISTRY


def _affine(scale, B, mean, var, epsilon, c: int):
    """Per-channel (a, b) with BN(x) = x * a + b, computed in float32 as the reference does."""
    ps = []
    for name, p in (("scale", scale), ("B", B), ("mean", mean), ("var", var)):
        p = np.asarray(p, dtype=F32)
        if p.shape != (c,):
            raise KernelError(f"BatchNormalization: {name} has shape {p.shape}, expected ({c},)")
        ps.append(p)
    s, b, m, v = ps
    a = s / np.sqrt(v + np.float32(epsilon))
    return a, b - m * a


def _bn(X, scale, B, mean, var, epsilon, axis_last: bool, out):
    x = np.asarray(X)
    if x.ndim < 2:
        raise KernelError(f"BatchNormalization needs X of rank >= 2, got shape {x.shape}")
    c = x.shape[-1] if axis_last else x.shape[1]
    a, b = _affine(scale, B, mean, var, epsilon, c)
    if not axis_last:
        tail = (1,) * (x.ndim - 2)
        a, b = a.reshape((c,) + tail), b.reshape((c,) + tail)
    y = output(out, x.shape)
    np.multiply(x, a, out=y)
    y += b
    return y


def _training(kw, noutputs) -> bool:
    return bool(kw.get("training_mode", 0)) or (noutputs > 1 and not kw.get("is_test", 0))


def batchnorm_nchw(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, out=None, **kw):
    """BatchNormalization (inference) on NCHW-style activations (channels on axis 1)."""
    if _training(kw, noutputs):
        return _reference(X, scale, B, mean, var, epsilon=epsilon, noutputs=noutputs, **kw)
    return _bn(X, scale, B, mean, var, epsilon, False, out)


def batchnorm_nhwc(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, out=None, **kw):
    """BatchNormalization (inference) on channels-last activations."""
    if _training(kw, noutputs):
        res = _reference(np.moveaxis(X, -1, 1), scale, B, mean, var, epsilon=epsilon,
                         noutputs=noutputs, **kw)
        res = res if isinstance(res, tuple) else (res,)
        return (np.ascontiguousarray(np.moveaxis(res[0], 1, -1)),) + tuple(res[1:])
    return _bn(X, scale, B, mean, var, epsilon, True, out)


def _reference(X, *params, noutputs=1, **kw):
    """Training mode: the reference kernel of the right version (rare at inference)."""
    versions = REGISTRY.versions("BatchNormalization")
    if "training_mode" in kw:
        fn = versions[-1].reference
        return fn(X, *params, **kw)
    if "is_test" in kw or "consumed_inputs" in kw:
        fn = versions[0].reference
    else:
        fn = [v for v in versions if v.since == 7][0].reference
    return fn(X, *params, noutputs=noutputs, **kw)


def _normalize_rows(x2, y2, epsilon, mean, inv, scale=None, bias=None, row_scale=None,
                    row_bias=None) -> None:
    """y2 = (x2 - mean) * inv per row (two-pass variance, as the references), then * scale +
    bias along the rows (LayerNorm's) or * row_scale + row_bias per row (InstanceNorm's
    channels: folded into inv, which then holds inv * row_scale). x2, y2: (rows, cols) with
    a contiguous last axis; mean, inv: (rows,) float32, filled.

    Row blocks of about EW_CHUNK floats: the row sums are one matrix-vector product with ones
    (BLAS; 4 us a block against 15 for np.add.reduce), the squared deviations one einsum (no
    temporary), and Y is written once and rescaled in cache."""
    rows, cols = x2.shape
    step = max(1, EW_CHUNK // cols)
    ones = ones_row(cols)
    n = np.float32(cols)
    eps = np.float32(epsilon)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for a in range(0, rows, step):
            b = min(rows, a + step)
            xc, yc = x2[a:b], y2[a:b]
            m = mean[a:b]
            np.matmul(xc, ones, out=m)
            m /= n
            np.subtract(xc, m[:, None], out=yc)
            v = inv[a:b]
            np.einsum("ij,ij->i", yc, yc, out=v)
            v /= n
            v += eps
            np.sqrt(v, out=v)
            np.reciprocal(v, out=v)
            if row_scale is not None:
                v *= row_scale[a:b]
            yc *= v[:, None]
            if row_bias is not None:
                yc += row_bias[a:b, None]
            if scale is not None:
                yc *= scale
            if bias is not None:
                yc += bias


def layernorm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    """LayerNormalization-17 in float32 (stash float32): (Y, Mean, InvStdDev).

    Row by row (see _normalize_rows). Scale and B that broadcast over the leading axes too go
    to the reference."""
    x = np.asarray(X)
    if x.ndim == 0:
        raise KernelError("LayerNormalization needs an input of rank >= 1")
    if not -x.ndim <= axis < x.ndim:
        raise KernelError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
    ax = axis + x.ndim if axis < 0 else axis
    tail = x.shape[ax:]
    cols = math.prod(tail)
    rows = x.size // cols if cols else math.prod(x.shape[:ax])
    params = []
    for p in (Scale, B):
        if p is None:
            params.append(None)
            continue
        p = np.asarray(p)
        if p.ndim > len(tail) or p.dtype != F32:
            return _layernorm_reference(X, Scale, B, axis, epsilon, stash_type)
        if p.shape == tail and p.flags.c_contiguous:  # (the usual [C] row: a view, no copy)
            params.append(p.reshape(cols))
            continue
        try:
            params.append(np.ascontiguousarray(np.broadcast_to(p, tail)).reshape(cols))
        except ValueError:
            return _layernorm_reference(X, Scale, B, axis, epsilon, stash_type)
    scale, bias = params
    y = output(out, x.shape)
    stat_shape = x.shape[:ax] + (1,) * len(tail)
    mean = np.empty(rows, F32)
    inv = np.empty(rows, F32)
    if x.size == 0:  # an empty row's mean is NaN, as np.mean's
        mean.fill(np.nan)
        inv.fill(np.nan)
        return y, mean.reshape(stat_shape), inv.reshape(stat_shape)
    x2, y2 = np.ascontiguousarray(x).reshape(rows, cols), y.reshape(rows, cols)
    if not _native_rows(x2, y2, epsilon, mean, inv, scale, bias):
        _normalize_rows(x2, y2, epsilon, mean, inv, scale, bias)
    return y, mean.reshape(stat_shape), inv.reshape(stat_shape)


# LayerNorm rows on the compiled loop (native/layernorm.c: one read of the row for the mean,
# one for the variance, one to write y, the sums in double) where the extension loads; rows
# shared out by blas_split.share. Multiply-adds an element, over_rows' threshold unit:
LN_COST = 6


def _native_rows(x2, y2, epsilon, mean, inv, scale, bias) -> bool:
    """_normalize_rows on native.layernorm; False (nothing written) where it does not apply
    (no extension, a y that overlaps x without being x)."""
    if (not native.available() or x2.dtype != F32 or not x2.flags.c_contiguous
            or not y2.flags.c_contiguous
            or (np.may_share_memory(x2, y2) and x2.ctypes.data != y2.ctypes.data)):
        return False
    rows, cols = x2.shape
    share(rows, 1, rows * cols * LN_COST, lambda span, threads: native.layernorm(
        x2, y2, scale, bias, epsilon, mean, inv, span, n_threads=threads))
    return True


F16 = np.dtype(np.float16)


def _f32_param(p):
    """A float16 or float32 Scale / B as float32 (exact), None as None."""
    if p is None:
        return None
    p = np.asarray(p)
    if p.dtype == F16 and p.flags.c_contiguous and p.size >= cast.SMALL:
        return cast.convert(p, np.empty(p.shape, F32))
    return p.astype(F32)


def layernorm_half(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    """LayerNormalization-17 of float16 X with stash float32, as the reference and ONNX
    Runtime compute it: X, Scale and B widened to float32 (exactly, on the compiled
    conversion), the float32 kernel above (layernorm: the compiled rows), Y rounded to float16
    once; Mean and InvStdDev float32. (The reference's NumPy casts and reductions made a
    float16 LayerNorm 1.75x the float32 one.)"""
    x = np.asarray(X)
    if x.dtype != F16 or int(stash_type) != 1 or x.ndim == 0 or not native.available():
        return _layernorm_reference(X, Scale, B, axis, epsilon, stash_type)
    x = np.ascontiguousarray(x)
    wide = cast.convert(x, scratch("norm.half", x.shape))
    scale, bias = _f32_param(Scale), _f32_param(B)
    y32, mean, inv = layernorm(wide, scale, bias, axis=axis, epsilon=epsilon, out=wide)
    if y32.dtype != F32 or y32.shape != x.shape:  # (Scale / B the float32 kernel hands back)
        return _layernorm_reference(X, Scale, B, axis, epsilon, stash_type)
    y = output(out, x.shape, F16)
    if np.may_share_memory(y, y32):
        y = np.empty(x.shape, F16)
    return cast.convert(np.ascontiguousarray(y32), y), mean, inv


def instancenorm(input, scale, B, *, epsilon=1e-5, out=None, **_legacy):
    """InstanceNormalization in float32, channels on axis 1: each (instance, channel) row of
    the spatial axes normalised as LayerNorm's rows (see _normalize_rows), the per-channel
    scale folded into the row's 1/std and the shift added in the same block. (The reference
    divides by the std: results differ from it by an ulp or two.)"""
    x = np.asarray(input)
    if x.ndim < 3:
        raise KernelError(f"InstanceNormalization needs X of rank >= 3 (N, C, D1, ...), got "
                          f"shape {x.shape}")
    n, c = x.shape[:2]
    cols = math.prod(x.shape[2:])
    params = []
    for name, p in (("scale", scale), ("B", B)):
        p = np.asarray(p)
        if p.shape != (c,):
            raise KernelError(f"InstanceNormalization: {name} has shape {p.shape}, expected "
                              f"({c},)")
        params.append(np.ascontiguousarray(np.broadcast_to(p.astype(F32, copy=False), (n, c)))
                      .reshape(n * c))
    y = output(out, x.shape)
    if x.size == 0:
        return y
    rows = n * c
    mean = scratch("norm.mean", (rows,))
    inv = scratch("norm.inv", (rows,))
    _normalize_rows(np.ascontiguousarray(x).reshape(rows, cols), y.reshape(rows, cols),
                    epsilon, mean, inv, row_scale=params[0], row_bias=params[1])
    return y


def _instancenorm_ok(x, *params, **attrs) -> bool:
    return (x.shape is not None and len(x.shape) >= 3
            and all(p is None or p.dtype in (None, "float32") for p in params))


def _instancenorm_workspace(x, *_, **__) -> int:
    if not x or len(x) < 2 or not all(isinstance(d, int) for d in x):
        return 0
    rows, cols = x[0] * x[1], math.prod(x[2:])
    return 4 * (2 * rows + cols + 2 * rows)  # mean, inv, ones, per-row scale and shift


def _layernorm_reference(X, Scale, B, axis, epsilon, stash_type):
    return REGISTRY.versions("LayerNormalization")[-1].reference(
        X, Scale, B, axis=axis, epsilon=epsilon, stash_type=stash_type)


def _layernorm_ok(x, *params, stash_type=1, **attrs) -> bool:
    return int(stash_type) == 1 and all(p is None or p.dtype in (None, "float32")
                                        for p in params)


def _layernorm_workspace(x, *_, axis=-1, **__) -> int:
    if not x or not all(isinstance(d, int) for d in x):
        return 0
    ax = axis + len(x) if axis < 0 else axis
    return 4 * 3 * int(np.prod(x[ax:], dtype=np.int64))  # ones, contiguous Scale and B rows


def _layernorm_half_ok(x, *params, stash_type=1, **attrs) -> bool:
    return (int(stash_type) == 1 and native.available()
            and all(p is None or p.dtype in (None, "float16", "float32") for p in params))


def _layernorm_half_workspace(x, *rest, axis=-1, **attrs) -> int:
    """The float32 copy of X it normalizes in place, float32 Scale and B, and the float32
    kernel's rows."""
    if not x or not all(isinstance(d, int) for d in x):
        return 0
    ax = axis + len(x) if axis < 0 else axis
    cols = int(np.prod(x[ax:], dtype=np.int64))
    return 4 * math.prod(x) + 4 * 2 * cols + _layernorm_workspace(x, *rest, axis=axis)


# LRN works in blocks of about this many floats (a few block-sized temporaries stay in L2):
# as whole-tensor passes each of its ~10 passes was a trip to memory (see lrn).
LRN_BLOCK = EW_CHUNK


def _lrn_denominator(ss, tmp, scale, bias, beta) -> None:
    """ss = (bias + scale * ss) ** beta in place, ss holding the window sums of squares (tmp:
    scratch of ss's shape); the caller divides by it, as the reference does."""
    ss *= scale
    ss += bias
    if beta == 0.75:  # s^3/4 = sqrt(s) sqrt(sqrt(s)): correctly rounded roots, no pow
        np.sqrt(ss, out=tmp)
        np.sqrt(tmp, out=ss)
        ss *= tmp
    elif beta == 0.5:
        np.sqrt(ss, out=ss)
    elif beta != 1.0:
        np.power(ss, beta, out=ss)


def _lrn_rows(xc, yc, sq, ss, tmp, lo: int, hi: int, scale, bias, beta) -> None:
    """Channels last: xc (rows, C). sq, ss, tmp: (rows, lo + C + hi) scratch whose pad columns
    sq holds zero, so the window sums are lo + hi + 1 shifted adds over the flattened buffers
    and the rest runs over them whole (long contiguous runs; the pads keep each row's window
    to its own row, and what lands in ss's pad columns is never read)."""
    c = xc.shape[1]
    np.multiply(xc, xc, out=sq[:, lo:lo + c])
    s, t = sq.reshape(-1), ss.reshape(-1)
    n = s.size - lo - hi
    t[:lo] = 0
    t[lo + n:] = 0
    acc = t[lo:lo + n]
    np.copyto(acc, s[lo:lo + n])
    for d in range(1, lo + 1):
        acc += s[lo - d:lo - d + n]
    for d in range(1, hi + 1):
        acc += s[lo + d:lo + d + n]
    _lrn_denominator(t, tmp.reshape(-1), scale, bias, beta)
    np.divide(xc, ss[:, lo:lo + c], out=yc)


def _lrn_cols(xc, yc, sq, ss, lo: int, hi: int, scale, bias, beta) -> None:
    """Channels first: xc (C, cols) of one image; the window sums as shifted adds of whole
    rows."""
    c = xc.shape[0]
    np.multiply(xc, xc, out=sq)
    np.copyto(ss, sq)
    for k in range(1, min(lo, c - 1) + 1):
        ss[k:] += sq[:c - k]
    for k in range(1, min(hi, c - 1) + 1):
        ss[:c - k] += sq[k:]
    _lrn_denominator(ss, sq, scale, bias, beta)
    np.divide(xc, ss, out=yc)


def lrn(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, axis_last=False, out=None):
    """LRN across channels (axis 1, or the last axis for NHWC): per block of pixels (channels
    last: rows of C; channels first: C x columns of one image) the squares, their window sums
    as shifted-slice adds along the channels, the power and the division, in cache. beta 3/4
    (AlexNet's, GoogLeNet's) and 1/2 take square roots instead of pow (within 2 ulp).
    ZFNet's 109x109x96 LRN, channels last: 6.0 ms as whole-tensor passes, 2.6 ms in blocks."""
    if size is None:
        raise KernelError("LRN needs the attribute size")
    x = np.ascontiguousarray(X, dtype=F32)
    if x.ndim < 3:
        raise KernelError(f"LRN needs X of rank >= 3 (N, C, D1, ...), got shape {x.shape}")
    y = output(out, x.shape)
    if x.size == 0:
        return y
    lo, hi = (int(size) - 1) // 2, int(size) // 2
    scale = np.float32(alpha) / np.float32(size)
    b, be = np.float32(bias), float(np.float32(beta))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if axis_last:
            c = x.shape[-1]
            x2, y2 = x.reshape(-1, c), y.reshape(-1, c)
            lo, hi = min(lo, c - 1), min(hi, c - 1)  # (a window beyond C adds only zeros)
            w = lo + c + hi
            step = max(1, LRN_BLOCK // w)
            rows = min(step, x2.shape[0])
            sq, ss = scratch("lrn.sq", (rows, w)), scratch("lrn.ss", (rows, w))
            tmp = scratch("lrn.t", (rows, w))
            sq[:, :lo] = 0
            sq[:, lo + c:] = 0
            for a in range(0, x2.shape[0], step):
                e = min(x2.shape[0], a + step)
                _lrn_rows(x2[a:e], y2[a:e], sq[:e - a], ss[:e - a], tmp[:e - a], lo, hi, scale,
                          b, be)
        else:
            n, c = x.shape[:2]
            x3, y3 = x.reshape(n, c, -1), y.reshape(n, c, -1)
            cols = x3.shape[2]
            step = max(1, LRN_BLOCK // c)
            w = min(step, cols)
            sq, ss = scratch("lrn.sq", (c, w)), scratch("lrn.ss", (c, w))
            for i in range(n):
                for a in range(0, cols, step):
                    e = min(cols, a + step)
                    _lrn_cols(x3[i, :, a:e], y3[i, :, a:e], sq[:, :e - a], ss[:, :e - a], lo,
                              hi, scale, b, be)
    return y


def _lrn_workspace(axis_last: bool):
    """Block-sized float32 temporaries (squares, window sums, channels last a third for the
    power); see lrn."""

    def rule(x, *_, **attrs) -> int:
        if not x or len(x) < 3 or not all(isinstance(d, int) for d in x):
            return 0
        c = x[-1] if axis_last else x[1]
        other = math.prod(x) // c if c else 0
        if axis_last:  # rows padded by the window's reach on both sides
            size = int(attrs.get("size") or 1)
            w = c + min((size - 1) // 2, max(c - 1, 0)) + min(size // 2, max(c - 1, 0))
            return 3 * 4 * w * min(other, max(1, LRN_BLOCK // max(w, 1)))
        return 2 * 4 * c * min(other, max(1, LRN_BLOCK // max(c, 1)))

    return rule


def lrn_nhwc(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, out=None):
    """LRN on channels-last activations."""
    return lrn(X, alpha=alpha, beta=beta, bias=bias, size=size, axis_last=True, out=out)


def lrn_nchw(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None, out=None):
    """LRN on channels-first activations."""
    return lrn(X, alpha=alpha, beta=beta, bias=bias, size=size, axis_last=False, out=out)


def _bn_ok(x, *params, **attrs) -> bool:
    if x.shape is None or len(x.shape) < 2:
        return False
    if attrs.get("spatial", 1) == 0:
        return False  # per-position parameters: the reference handles them
    return all(p is None or p.dtype in (None, "float32") for p in params)


def _bn_nhwc_ok(x, *params, **attrs) -> bool:
    return _bn_ok(x, *params, **attrs) and len(x.shape) == 4


def _lrn_ok(x, **attrs) -> bool:
    return x.shape is not None and len(x.shape) >= 3


def _lrn_nhwc_ok(x, **attrs) -> bool:
    return x.shape is not None and len(x.shape) == 4


def register() -> None:
    """Register BatchNormalization, LayerNormalization, InstanceNormalization and LRN variants
    on every version."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True}
    for opdef in REGISTRY.versions("BatchNormalization"):
        opdef.kernel(layout="NHWC", when=_bn_nhwc_ok, name="batchnormalization.cpu.nhwc",
                     **kw)(batchnorm_nhwc)
        opdef.kernel(layout="NCHW", when=_bn_ok, name="batchnormalization.cpu.nchw",
                     **kw)(batchnorm_nchw)
    for opdef in REGISTRY.versions("LayerNormalization"):
        opdef.kernel(when=_layernorm_ok, name="layernormalization.cpu.fast",
                     workspace_bytes=_layernorm_workspace, **kw)(layernorm)
        if native.available():
            opdef.kernel(when=_layernorm_half_ok, name="layernormalization.cpu.half",
                         workspace_bytes=_layernorm_half_workspace,
                         **{**kw, "dtypes": ["float16"]})(layernorm_half)
    for opdef in REGISTRY.versions("InstanceNormalization"):
        opdef.kernel(layout="NCHW", when=_instancenorm_ok, name="instancenormalization.cpu.nchw",
                     workspace_bytes=_instancenorm_workspace, **kw)(instancenorm)
    for opdef in REGISTRY.versions("LRN"):
        opdef.kernel(layout="NHWC", when=_lrn_nhwc_ok, name="lrn.cpu.nhwc",
                     workspace_bytes=_lrn_workspace(True), **kw)(lrn_nhwc)
        opdef.kernel(layout="NCHW", when=_lrn_ok, name="lrn.cpu.nchw",
                     workspace_bytes=_lrn_workspace(False), **kw)(lrn_nchw)
