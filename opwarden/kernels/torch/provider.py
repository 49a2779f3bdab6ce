"""The torch device: operators run through PyTorch (its CPU, or CUDA when present).

Variants take and return NumPy arrays. On the CPU `torch.from_numpy` and `.numpy()` share memory,
so crossing between this device and `cpu` costs nothing; on CUDA every variant uploads its
inputs and downloads its result (constants are uploaded once and cached).

Convolution-like operators have two variants each: layout "NHWC" (the input arrives as an
(N, *spatial, C) array; `permute` turns it into a channels-last NCHW view, which is the layout
oneDNN convolves fastest, and the output goes back as a contiguous NHWC array) and "NCHW".
Fused operators (domain "opwarden") run the convolution or GEMM with its bias, then the residual
and activation in place on the fresh output.

Anything a variant cannot express in torch (an attribute torch lacks, training mode, an extra
output) is handed to the operator's reference kernel, so every variant is exact on every input the
reference accepts. Importing this module imports torch; `register()` adds the device.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

if "torch" not in sys.modules and not any(
    k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
):
    # OpenMP workers spin between parallel regions for GOMP_SPINCOUNT iterations, 300000 by
    # default: ~5 ms of a core burnt after every region, stolen from whatever runs next on a
    # small machine (the NumPy kernels' BLAS, another runtime in the process). Passive waiting
    # (no spin) costs a futex wake-up per region instead: whole models ran 1.15-1.4x slower
    # (ResNet-50 62.8 vs 50.4 ms on 2 cores). 30000 spins (~1 ms) keep the workers hot through
    # a model's back-to-back operators and idle soon after a run: the peer's runs alternated
    # with ours measured no slower than with passive waiting. Only a default: a policy the
    # user set wins, and a torch imported earlier keeps its own.
    os.environ["GOMP_SPINCOUNT"] = "30000"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812 - the conventional name

from opwarden.devices.base import Device, register_device  # noqa: E402
from opwarden.errors import KernelError  # noqa: E402
from opwarden.kernels.cpu.fused import _whole_ok  # noqa: E402
from opwarden.kernels.cpu.pool import COPY as _POOL_COPY  # noqa: E402
from opwarden.kernels.cpu.pool import UFUNC as _POOL_UFUNC  # noqa: E402
from opwarden.kernels.cpu.pool import _plan as _host_pool_plan  # noqa: E402
from opwarden.kernels.cpu.shuffle import DTYPES as _SHUFFLE_DTYPES  # noqa: E402
from opwarden.kernels.cpu.shuffle import channel_shuffle  # noqa: E402
from opwarden.memory.constants import is_constant  # noqa: E402
from opwarden.memory.constants import mark as mark_constant  # noqa: E402
from opwarden.ops import REGISTRY  # noqa: E402
from opwarden.ops.conv import conv_pads, spatial_params  # noqa: E402
from opwarden.ops.fused import branch_convs, last_reads  # noqa: E402
from opwarden.ops.pool import pool_geometry as _pool_setup  # noqa: E402

DEVICE_NAME = "torch"
FLOATS = ("float32", "float64")
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
INTS = ("int32", "int64")

_CUDA = torch.cuda.is_available()
_TARGET = torch.device("cuda") if _CUDA else torch.device("cpu")

# A cheap inference-mode guard: the context-manager class costs ~1.3 us per call, the C++
# guard ~0.5 us; both switch off autograd bookkeeping (version counters, views tracking).
_InferenceMode: Callable[[bool], Any] = getattr(torch._C, "_InferenceMode", None) or (
    lambda _on: torch.inference_mode()
)

# Work below these sizes runs on one torch thread when the OpenMP workers wait passively: the
# fork-join of a second worker woken by a futex costs more than it saves (measured on 2 shared
# cores: 1x1/3x3 convolutions under ~40 MFLOP 1.2-4x faster on one thread, memory-bound ops up
# to ~3M elements as fast or faster). With spinning workers (the default above) a two-thread
# GEMM of 3136x64x64 takes 137 us against 263 on one thread and 3025x128x16 75 against 156, so
# torch's own grain sizes decide.
_PASSIVE = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE" or (
    os.environ.get("GOMP_SPINCOUNT", "").strip() == "0"
)
_SERIAL_FLOPS = 40e6 if _PASSIVE else 0.0
_SERIAL_ELEMENTS = (1 << 21) if _PASSIVE else 0


class _Mode:
    """Inference mode for a kernel body; with `serial`, torch on one thread until exit."""

    __slots__ = ("_guard", "_restore", "_serial")

    def __init__(self, serial: bool = False) -> None:
        self._serial = serial
        self._restore = 0

    def __enter__(self) -> _Mode:
        self._guard = _InferenceMode(True)
        self._guard.__enter__()
        if self._serial and not _CUDA:
            n = torch.get_num_threads()
            if n > 1:
                torch.set_num_threads(1)
                self._restore = n
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._restore:
            torch.set_num_threads(self._restore)
            self._restore = 0
        self._guard.__exit__(*exc)


# Channel shuffles of at least this many elements run as one torch copy (its two threads);
# smaller ones as the host kernel. Measured alone, two threads, torch vs host: 56x56x112 g=4
# 157 vs 291 us, 28x28x136 55 vs 68, 14x14x272 31 vs 32, 7x7x544 24 vs 19. In-model the torch
# copy wins down to the smallest (ShuffleNet, every run after an ONNX Runtime run: 11.2 vs
# 11.7 ms, 0.944-0.958 in three A/B runs, with 14x14x272 and 7x7x544 moved to torch; likely
# because torch's OpenMP workers stay awake for the depthwise convolution that reads the
# result, not verified). Below 16K elements (not measured in-model) the host kernel's lower
# call cost is kept.
_SHUFFLE_TORCH_MIN = 1 << 14
SHUFFLE_IN_TORCH = True


def _channel_shuffle(X, *, group=1, out=None):
    """ChannelShuffle (Y[..., j*g + i] = X[..., i*(C/g) + j]) as a torch copy of the
    transposed (rows, g, C/g) view into `out` when it is large; else the host kernel."""
    x = np.asarray(X)
    g = int(group)
    c = x.shape[-1] if x.ndim else 0
    if (not SHUFFLE_IN_TORCH or _CUDA or x.size < _SHUFFLE_TORCH_MIN or g < 2 or c % g
            or x.dtype != np.float32 or not x.flags.c_contiguous):
        return channel_shuffle(x, group=g, out=out)
    src = _host_tensor(x).view(-1, g, c // g).transpose(1, 2)
    with _Mode():
        if out is not None and out.shape == x.shape and out.dtype == x.dtype \
                and out.flags.c_contiguous and not np.may_share_memory(out, x):
            torch.from_numpy(out).view(-1, c // g, g).copy_(src)
            return out
        return src.contiguous().view(x.shape).numpy()


def _small(*xs: Any) -> bool:
    """Whether memory-bound work over these inputs is too small to split across threads."""
    return max(np.size(x) for x in xs) < _SERIAL_ELEMENTS


# ---------------------------------------------------------------------------------------------
# NumPy <-> torch


class _ConstCache:
    """Tensors made from constant arrays (initializers, memory.constants), keyed by the array,
    freed with it."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, str], tuple[weakref.ref, Any]] = {}

    def get(self, arr: np.ndarray, kind: str, make: Callable[[np.ndarray], Any]) -> Any:
        key = (id(arr), kind)
        hit = self._items.get(key)
        if hit is not None and hit[0]() is arr:
            return hit[1]
        value = make(arr)
        items = self._items
        try:
            ref = weakref.ref(arr, lambda _r, key=key: items.pop(key, None))
        except TypeError:  # pragma: no cover - ndarrays support weak references
            return value
        items[key] = (ref, value)
        return value

    def clear(self) -> None:
        self._items.clear()


_CONSTS = _ConstCache()


_READONLY_WARNED = False


def _readonly_tensor(x: np.ndarray) -> torch.Tensor:
    """from_numpy of a read-only array (our kernels never write into inputs).

    torch warns about read-only arrays once per process; that first time is silenced here, and
    afterwards torch stays quiet, so later calls pay nothing for it.
    """
    global _READONLY_WARNED
    if _READONLY_WARNED:
        return _host_tensor(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = _host_tensor(x)
    _READONLY_WARNED = True
    return t


def _host_tensor(x: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing x's memory (a copy only for layouts torch cannot view)."""
    try:
        return torch.from_numpy(x)
    except (TypeError, ValueError, RuntimeError):
        # Negative strides or a non-native byte order: torch needs a plain copy.
        y = np.ascontiguousarray(x)
        if not y.dtype.isnative:
            y = y.astype(y.dtype.newbyteorder("="))
        return torch.from_numpy(y)


def _upload(x: np.ndarray) -> torch.Tensor:
    return _readonly_tensor(x).to(_TARGET)


def _t(x: Any) -> torch.Tensor:
    """The tensor for a kernel input (None stays None)."""
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if _CUDA and is_constant(x):
        # Initializers (memory.constants) are uploaded once.
        return _CONSTS.get(x, "t", _upload)
    t = _host_tensor(x) if x.flags.writeable else _readonly_tensor(x)
    return t.to(_TARGET) if _CUDA else t


def _opt(x: Any) -> torch.Tensor | None:
    return None if x is None else _t(x)


def _np(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous host array for a result tensor."""
    if _CUDA:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def _ret(y: torch.Tensor, out: np.ndarray | None) -> np.ndarray:
    """y as an array, written into the planned buffer `out` when there is one."""
    if out is None:
        return _np(y)
    torch.from_numpy(out).copy_(y)
    return out


def _out_t(out: np.ndarray | None) -> torch.Tensor | None:
    """A tensor over the planned buffer that torch ops may write with out= (CPU only)."""
    if out is None or _CUDA:
        return None
    return torch.from_numpy(out)


def _nchw_view(x: np.ndarray) -> torch.Tensor:
    """An NHWC (N, *spatial, C) array as a logical NCHW tensor (channels-last in memory)."""
    t = _t(x)
    if t.ndim < 3:
        return t
    return t.permute(0, t.ndim - 1, *range(1, t.ndim - 1))


def _to_nhwc(t: torch.Tensor) -> np.ndarray:
    """A logical NCHW result as a contiguous NHWC array."""
    if t.ndim < 3:
        return _np(t)
    return _np(t.permute(0, *range(2, t.ndim), 1))


def _nchw_of(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def _nhwc_of(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if y.ndim >= 3 else y


def _call_ref(ref: Callable[..., Any], args: tuple, kw: dict, nhwc: bool, noutputs=None):
    """The reference kernel on (possibly NHWC) data; only output 0 changes layout."""
    if noutputs is not None and _wants(ref, "noutputs"):
        kw = dict(kw, noutputs=noutputs)
    if not nhwc:
        return ref(*args, **kw)
    args = (_nchw_of(np.asarray(args[0])),) + tuple(args[1:])
    res = ref(*args, **kw)
    if isinstance(res, tuple):
        return (_nhwc_of(np.asarray(res[0])),) + res[1:]
    return _nhwc_of(np.asarray(res))


def _wants(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Activations (standalone and fused)

_MAX_F = 3.4028234663852886e38


def _activate_(y: torch.Tensor, activation: str, params) -> torch.Tensor:
    """Apply a fused activation to a fresh result, in place where torch can."""
    if not activation:
        return y
    p = [float(v) for v in (params or ())]
    if activation == "Relu":
        return y.relu_()
    if activation == "Clip":
        lo = p[0] if len(p) > 0 else -math.inf
        hi = p[1] if len(p) > 1 else math.inf
        return y.clamp_(lo, hi)
    if activation == "LeakyRelu":
        return F.leaky_relu_(y, p[0] if p else 0.01)
    if activation == "Sigmoid":
        return y.sigmoid_()
    if activation == "Tanh":
        return y.tanh_()
    if activation == "HardSwish":
        return F.hardswish(y, inplace=True)
    if activation == "Gelu":
        return F.gelu(y, approximate="tanh" if p and p[0] else "none")
    raise KernelError(
        f"activation {activation!r} is not one of Relu, Clip, LeakyRelu, Sigmoid, Tanh, "
        "HardSwish, Gelu"
    )


def _relu(X, *, out=None):
    with _Mode(_small(X)):
        o = _out_t(out)
        if o is not None:
            torch.clamp_min(_t(X), 0, out=o)
            return out
        return _ret(torch.relu(_t(X)), out)


def _sigmoid(X, *, out=None):
    with _Mode(_small(X)):
        o = _out_t(out)
        if o is not None:
            torch.sigmoid(_t(X), out=o)
            return out
        return _ret(torch.sigmoid(_t(X)), out)


def _tanh(X, *, out=None):
    with _Mode(_small(X)):
        o = _out_t(out)
        if o is not None:
            torch.tanh(_t(X), out=o)
            return out
        return _ret(torch.tanh(_t(X)), out)


def _leaky_relu(X, *, alpha=0.01):
    with _Mode(_small(X)):
        return _np(F.leaky_relu(_t(X), float(alpha)))


def _hard_swish(X):
    with _Mode(_small(X)):
        return _np(F.hardswish(_t(X)))


def _hard_sigmoid(X, *, alpha=0.2, beta=0.5):
    with _Mode(_small(X)):
        return _np(_t(X).mul(float(alpha)).add_(float(beta)).clamp_(0.0, 1.0))


def _elu(X, *, alpha=1.0):
    with _Mode(_small(X)):
        return _np(F.elu(_t(X), float(alpha)))


def _gelu(X, *, approximate="none"):
    with _Mode(_small(X)):
        return _np(F.gelu(_t(X), approximate="tanh" if approximate == "tanh" else "none"))


def _clip_bounds(lo, hi, x: torch.Tensor):
    lo = None if lo is None else np.asarray(lo).item()
    hi = None if hi is None else np.asarray(hi).item()
    if x.dtype.is_floating_point:
        lo = None if lo is None else float(lo)
        hi = None if hi is None else float(hi)
    return lo, hi


def _clip_11(input, min=None, max=None, *, out=None):  # noqa: A002 - spec names
    with _Mode(_small(input)):
        x = _t(input)
        lo, hi = _clip_bounds(min, max, x)
        if lo is None and hi is None:
            return _ret(x.clone(), out)
        o = _out_t(out)
        if o is not None:
            torch.clamp(x, lo, hi, out=o)
            return out
        return _ret(torch.clamp(x, lo, hi), out)


def _clip_6(input, *, min=-_MAX_F, max=_MAX_F, out=None):  # noqa: A002 - spec names
    with _Mode(_small(input)):
        x = _t(input)
        o = _out_t(out)
        if o is not None:
            torch.clamp(x, float(min), float(max), out=o)
            return out
        return _ret(torch.clamp(x, float(min), float(max)), out)


# ---------------------------------------------------------------------------------------------
# Elementwise arithmetic


def _binary(torch_fn: Callable[..., torch.Tensor], ref: Callable[..., Any], legacy: bool):
    """Add/Sub/Mul/Div; opset-6 `broadcast`/`axis` attributes go to the reference kernel."""

    def kernel(A, B, *, out=None, **attrs):
        if legacy and (attrs.get("broadcast") or attrs.get("axis") is not None):
            return ref(A, B, **attrs)
        with _Mode(_small(A, B)):
            o = _out_t(out)
            if o is not None:
                torch_fn(_t(A), _t(B), out=o)
                return out
            return _ret(torch_fn(_t(A), _t(B)), out)

    return kernel


def _sum(*data, out=None):
    with _Mode(_small(*data)):
        ts = [_t(d) for d in data]
        if len(ts) == 1:
            return _ret(ts[0].clone(), out)
        o = _out_t(out)
        # out= only when the first pair already has the final shape (torch would resize it).
        if o is not None and torch.broadcast_shapes(ts[0].shape, ts[1].shape) == o.shape:
            y = torch.add(ts[0], ts[1], out=o)
        else:
            y = torch.add(ts[0], ts[1])
        for t in ts[2:]:
            if torch.broadcast_shapes(y.shape, t.shape) == y.shape:
                y.add_(t)
            else:
                y = y + t
        if o is not None and y is o:
            return out
        return _ret(y, out)


# ---------------------------------------------------------------------------------------------
# Linear algebra


def _mm_flops(A, B) -> float:
    """Multiply-adds x 2 of matmul(A, B), near enough to pick a thread count."""
    a, b = np.shape(A), np.shape(B)
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    return 2.0 * max(math.prod(a) * n, math.prod(b) * m)


def _matmul(A, B, *, out=None):
    with _Mode(_mm_flops(A, B) < _SERIAL_FLOPS):
        a, b = _t(A), _t(B)
        o = _out_t(out)
        if o is not None and a.ndim >= 1 and b.ndim >= 1:
            torch.matmul(a, b, out=o)
            return out
        return _ret(torch.matmul(a, b), out)


def _gemm_t(a, b, c, alpha, beta, transA, transB, out=None) -> torch.Tensor:
    if transA:
        a = a.t()
    if transB:
        b = b.t()
    o = _out_t(out)
    if c is not None and beta != 0:
        if o is not None:
            return torch.addmm(c, a, b, beta=float(beta), alpha=float(alpha), out=o)
        return torch.addmm(c, a, b, beta=float(beta), alpha=float(alpha))
    y = torch.mm(a, b, out=o) if o is not None else torch.mm(a, b)
    if alpha != 1:
        y.mul_(float(alpha))
    return y


def _gemm_kernel(legacy: bool, ref: Callable[..., Any]):
    def kernel(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None, **attrs):
        A, B = np.asarray(A), np.asarray(B)
        bad = A.ndim != 2 or B.ndim != 2
        bad = bad or A.shape[0 if transA else 1] != B.shape[1 if transB else 0]
        if not bad and C is not None and beta != 0:
            m, n = A.shape[1 if transA else 0], B.shape[0 if transB else 1]
            cs = np.shape(C)
            if legacy and not attrs.get("broadcast") and tuple(cs) != (m, n):
                bad = True
            else:
                try:
                    bad = np.broadcast_shapes(cs, (m, n)) != (m, n)
                except ValueError:
                    bad = True
        if bad:
            # The reference kernel names the shape problem.
            return ref(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB, **attrs)
        with _Mode(2 * A.size * B.shape[0 if transB else 1] < _SERIAL_FLOPS):
            y = _gemm_t(_t(A), _t(B), _opt(C), alpha, beta, transA, transB, out)
            return out if (out is not None and not _CUDA) else _ret(y, out)

    return kernel


def _softmax_kernel(ref: Callable[..., Any], coerced: bool):
    """Softmax-13 along one axis, or Softmax-1/11 over the input coerced to 2-D at `axis`."""

    def kernel(input, *, axis=-1 if not coerced else 1):
        x = np.asarray(input)
        hi = x.ndim if coerced else x.ndim - 1
        if x.ndim == 0 or x.size == 0 or not -x.ndim <= axis <= hi:
            return ref(input, axis=axis)
        with _Mode(_small(x)):
            if not coerced:
                return _np(torch.softmax(_t(x), axis))
            ax = axis + x.ndim if axis < 0 else axis
            rows = math.prod(x.shape[:ax])
            return _np(torch.softmax(_t(x).reshape(rows, -1), 1).reshape(x.shape))

    return kernel


# ---------------------------------------------------------------------------------------------
# Data movement


def _concat(*inputs, axis=None, out=None):
    if axis is None:
        raise KernelError("Concat needs the attribute axis")
    with _Mode(sum(np.size(x) for x in inputs) < _SERIAL_ELEMENTS):
        ts = [_t(x) for x in inputs]
        o = _out_t(out)
        if o is not None:
            torch.cat(ts, dim=int(axis), out=o)
            return out
        return _ret(torch.cat(ts, dim=int(axis)), out)


_GATHERS: dict[tuple, torch.Tensor] = {}
_GATHER_MAX = 4096


def _inner_gather(shape: tuple, p: list[int]) -> torch.Tensor | None:
    """For a perm that only reorders a small trailing block of axes, the flat source index of
    each element of the transposed block (None for other perms).

    A channel shuffle (..., g, c) -> (..., c, g) is such a perm; gathering the block through a
    cached index (index_select) was measured 1.6x faster than torch's strided copy and 2-2.5x
    faster than NumPy's.
    """
    k = 0
    while k < len(p) and p[k] == k:
        k += 1
    inner = shape[k:]
    n = math.prod(inner)
    if k == 0 or n > _GATHER_MAX or math.prod(shape[:k]) < 16:
        return None
    key = (inner, tuple(p[k:]))
    idx = _GATHERS.get(key)
    if idx is None:
        if len(_GATHERS) > 256:
            _GATHERS.clear()
        local = [a - k for a in p[k:]]
        idx = _GATHERS[key] = torch.arange(n).reshape(inner).permute(*local).reshape(-1)
    return idx


def _transpose(data, *, perm=None):
    x = np.asarray(data)
    p = list(perm) if perm else list(range(x.ndim))[::-1]
    if p == list(range(x.ndim)):
        return x.copy()
    with _Mode(_small(x)):
        t = _t(x)
        idx = None if _CUDA else _inner_gather(x.shape, p)
        if idx is not None:
            n = idx.numel()
            y = t.reshape(-1, n).index_select(1, idx)
            return y.numpy().reshape([x.shape[a] for a in p])
        # torch's permuted copy beats NumPy's (measured 1.5-2x for NCHW -> NHWC); a perm that
        # only moves unit axes is already contiguous, and must still not share the input.
        y = t.permute(*p).contiguous()
        if y.data_ptr() == t.data_ptr():
            y = y.clone()
        return _np(y)


# ---------------------------------------------------------------------------------------------
# Convolution


def _pad_arg(begin, end) -> list[int]:
    """F.pad's argument (last axis first) for spatial pads."""
    flat: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        flat += [b, e]
    return flat


def _tup(v) -> tuple:
    return tuple(v) if v else ()


# oneDNN's fused convolution (the op torch.compile uses on CPU): weights reordered once into the
# blocked format, bias and activation (and a residual add) applied in the convolution's epilogue.
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
    # (N*H*W, C) view of the input, giving (N*H*W, M) = NHWC output directly. oneDNN's fused
    # convolution costs ~45 us per call before any arithmetic; below ~40 MFLOP the GEMM wins.
    # (With passive waiting MKL's two-thread GEMM on these skinny shapes was measured up to 8x
    # slower than one thread, 169x512x64: 730 vs 85 us, so there it runs serial: _SERIAL_FLOPS.)
    # Grouped (not depthwise) pointwise convolutions are one batched GEMM over the groups.
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
# Convolutions with at least this many input channels per group take oneDNN's packed kernel.
# With torch 2.13 it wins from one channel on (two threads, packed vs torch.convolution, both
# channels-last): RGB stems 224x224x3 -> 64 7x7/2 755 vs 895 us, -> 24 3x3/2 115 vs 130, -> 64
# 3x3/1 680 vs 661; depthwise 3x3 56x56x112/2 44 vs 53, 28x28x136 48 vs 62, 7x7x544 35 vs 50.
# Whole models on the torch path, A/B 8 vs 1 in one process: 0.973-0.997 on all nine of the
# light zoo. (An older torch measured the packed stem 1.7-4x slower; hence the knob.)
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
# fewer take one batched GEMM and a copy (ShuffleNet's groups of 4, two threads, in place vs
# copied: 3136 pixels 24 -> 112 channels 72 vs 161 us, 784x136 66 vs 84, 196x272 60 vs 72,
# 49x544 55 vs 48).
_GROUPED_OUT_MIN_ROWS = 128


def _grouped_gemm(x2: torch.Tensor, W, B, g: int) -> torch.Tensor:
    """(P, C) pixels times each group's (M/g, C/g) weights: (P, M), one batched GEMM. Measured
    against oneDNN's grouped convolution (ShuffleNet's 4 groups, two threads): 56x56x24 -> 112
    207 vs 362 us, 14x14x272 86 vs 118, 7x7x544 56 vs 90, 28x28 alike."""
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
# written (whole models 0-3.4% slower than fused; checking the inputs for NaN first instead cost
# 3.5-5.4%).
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
        # the branches (see kernels.fused._whole_ok).
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


# ---------------------------------------------------------------------------------------------
# Node-bound convolutions (Variant.specialize)
#
# The generic kernels above work out on every call what depends only on the node: the plan (a
# lookup keyed on shapes and attributes), the inference-mode guard, the packed weights' cache
# entry, the bias tensor, the layout views and checks. In a model each call finds the caches
# cold after the previous convolution's traffic, and that bookkeeping cost ~50 us per node
# in-model (ResNet-50, two threads; 15 us hot) around a oneDNN call of its own ~25 us. A node's
# bound kernel prepares all of it on its first call and then, while the input shape, the
# weights and the bias are those it prepared for, makes only the calls that move data (ResNet-50
# 0.927 of the generic time, SqueezeNet 0.949 with its plain convolutions bound).
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
    if not plan.packed or _PACK_FAILED or act is None:
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
                # has silenced that by now, see _readonly_tensor)
                if s[4] is not None and (X.flags.writeable or _READONLY_WARNED) and (
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


# FusedConv branches from this many input channels run as one convolution each (no products
# with W's structural zeros), each writing its channels of the NHWC result; with fewer, one
# convolution over the whole W. SqueezeNet's fire modules, two threads, whole vs apart (a 1x1
# GEMM into its channels, the 3x3 convolution copied into its): 55x55x16 -> 64+64 390 vs 317 us,
# 27x27x32 -> 128+128 392 vs 278, 13x13x48 -> 192+192 206 vs 187, 13x13x64 -> 256+256 333 vs
# 248. (Apart with a channel concatenation instead: 395, 290, 193, 256.)
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


def _fused_gemm_kernel(ref: Callable[..., Any]):
    def kernel(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_params=(), **attrs):
        A, B = np.asarray(A), np.asarray(B)
        if A.ndim != 2 or B.ndim != 2:
            return ref(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                       activation=activation, activation_params=activation_params, **attrs)
        with _Mode(2 * A.size * B.shape[0 if transB else 1] < _SERIAL_FLOPS):
            y = _gemm_t(_t(A), _t(B), _opt(C), alpha, beta, transA, transB)
            return _np(_activate_(y, activation, activation_params))

    return kernel


def _fused_matmul(A, B, C=None, *, activation="", activation_params=(), **_attrs):
    with _Mode(_mm_flops(A, B) < _SERIAL_FLOPS):
        y = torch.matmul(_t(A), _t(B))
        if C is not None:
            c = _t(C)
            if torch.broadcast_shapes(y.shape, c.shape) == y.shape:
                y.add_(c)
            else:
                y = y + c
        return _np(_activate_(y, activation, activation_params))


# ---------------------------------------------------------------------------------------------
# Pooling


def _pool_geometry(shape, attrs: dict):
    return _pool_setup(
        tuple(shape), attrs.get("kernel_shape"), attrs.get("strides"), attrs.get("dilations"),
        attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0),
    )


_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


POOL_END_BY_CEIL = True


def _simple_pads(kernel, d, begin, end) -> bool:
    """Symmetric pads torch can take as `padding`: at most half the kernel size (torch checks
    the undilated size: a dilated 3-tap window with pads 2 is refused)."""
    return begin == end and all(0 <= b <= k // 2 for b, k in zip(begin, kernel))


def _torch_pool_out(n: int, k: int, s: int, d: int, p: int, ceil: bool) -> int:
    """torch's pooled size of an axis of n (symmetric padding p): with ceil_mode the last
    window must still start inside the input or its left padding."""
    span = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    o = span // s + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def _end_pads_by_ceil(xs, kernel, s, d, begin, end, out) -> bool:
    """Whether torch's max pool with `padding=begin` and ceil_mode gives exactly the windows of
    pads (begin, end), end >= begin: windows start at the same places and both ignore what lies
    outside the input, so equal output sizes mean equal results, with no padded copy. (The SAME
    pads of TF exports, [0, 0, 1, 1] for a 3x3 stride-2 pool, are this case.)"""
    return all(
        e >= b and 0 <= b <= k // 2 and _torch_pool_out(n, k, st, di, b, True) == o
        for n, k, st, di, b, e, o in zip(xs, kernel, s, d, begin, end, out)
    )


def _maxpool_t(x: torch.Tensor, geom) -> torch.Tensor:
    kernel, s, d, begin, end, out, extra, simple = geom[:8]
    pool = _MAXPOOL[len(kernel)]
    ceil = any(extra)
    if simple:
        y = pool(x, kernel, s, begin, d, ceil_mode=ceil or simple == "ceil")
    else:
        # Padded with -inf to exactly the extent the `out` windows read (torch's own ceil rule
        # keeps a last window that starts in the end padding, which ONNX drops): floor mode.
        fit = [(o - 1) * st + (k - 1) * di + 1 - n - b
               for n, k, st, di, b, o in zip(x.shape[2:], kernel, s, d, begin, out)]
        xp = F.pad(x, _pad_arg(begin, fit), value=-math.inf)
        y = pool(xp, kernel, s, 0, d)
    if y.shape[2:] != out:  # pragma: no cover - geometry rules agree
        raise KernelError(f"MaxPool: torch produced spatial {list(y.shape[2:])}, expected {out}")
    return y


# NHWC 2-D max pools run separably with the host kernel's plan (kernels.pool._plan, in one band
# of all output rows): whole rows folded along H into a W-padded band (long contiguous runs),
# then its columns along W, each tap one torch.maximum over strided views; rows a tap would
# read from the padding are left out of it (no padded copy). torch's own channels-last max pool
# also tracks the argmax indices; two threads, 3x3/2 pools, separable vs F.max_pool2d:
# 111x111x64 150 vs 228 us, 55x55x128 61 vs 90, 56x56x192 96 vs 150, 28x28x480 56 vs 76,
# 27x27x256 40 vs 45 (one thread: 425 vs 475, 142 vs 187).
_SEPARABLE_MAXPOOL = True


def _maxpool_sep_plan(xs: tuple, geom) -> tuple:
    """(host plan steps, whether the band is x itself, band shape, y shape) of a separable
    NHWC 2-D max pool: buffers 0 = x, 1 = the band, 2 = y."""
    kernel, s, d, begin, _end, out = geom[:6]
    steps, direct, band_shape = _host_pool_plan(xs, kernel, s, d, begin, out, None,
                                                band_bytes=1 << 62)
    return steps, direct, band_shape, (xs[0], *out, xs[3])


def _maxpool_sep(x: torch.Tensor, plan: tuple) -> torch.Tensor:
    """Run a separable max pool plan on an NHWC tensor: the NHWC result."""
    steps, direct, band_shape, y_shape = plan
    bufs = (x, x if direct else x.new_empty(band_shape), x.new_empty(y_shape))
    maximum = torch.maximum
    for code, dst, di, a, ai, b, bi in steps:
        if code == _POOL_UFUNC:
            maximum(bufs[a][ai], bufs[b][bi], out=bufs[dst][di])
        elif code == _POOL_COPY:
            bufs[dst][di].copy_(bufs[a][ai])
        else:  # FILL (max pools have no SCALE steps)
            bufs[dst][di].fill_(-math.inf)
    return bufs[2]


def _avgpool_t(x: torch.Tensor, geom, cip: bool) -> torch.Tensor:
    kernel, s, d, begin, end, out, extra, simple = geom[:8]
    pool = _AVGPOOL[len(kernel)]
    if simple:
        y = pool(x, kernel, s, begin, ceil_mode=any(extra), count_include_pad=cip)
    else:
        # Window means over the explicitly padded input, divided by the mean of a mask of the
        # elements the ONNX divisor counts: those in the input, or with count_include_pad those
        # in the padded input but not in the ceil_mode extension.
        full = [e + t for e, t in zip(end, extra)]
        total = pool(F.pad(x, _pad_arg(begin, full)), kernel, s, 0)
        ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
        if cip:
            mask = F.pad(F.pad(ones, _pad_arg(begin, end), value=1.0),
                         _pad_arg([0] * len(extra), extra))
        else:
            mask = F.pad(ones, _pad_arg(begin, full))
        y = total.div_(pool(mask, kernel, s, 0))
    if y.shape[2:] != out:  # pragma: no cover - geometry rules agree
        raise KernelError(f"AveragePool: torch produced spatial {list(y.shape[2:])}, want {out}")
    return y


_POOL_PLANS: dict[tuple, Any] = {}


def _pool_plan(x: np.ndarray, attrs: dict, nhwc: bool, kind: str):
    """Pool geometry for this input shape and these attributes, or None (reference kernel)."""
    xs = x.shape
    key = (
        xs, x.dtype, nhwc, kind, _tup(attrs.get("kernel_shape")), _tup(attrs.get("strides")),
        _tup(attrs.get("pads")), _tup(attrs.get("dilations")), attrs.get("auto_pad", "NOTSET"),
        attrs.get("ceil_mode", 0),
    )
    try:
        return _POOL_PLANS[key]
    except KeyError:
        pass
    geom = None
    dil = attrs.get("dilations")
    ok = 3 <= len(xs) <= 5 and x.dtype.kind == "f" and x.size > 0
    if kind == "avg":  # torch's average pools have no dilation
        ok = ok and not (dil and any(int(v) != 1 for v in dil))
    if ok:
        logical = (xs[0], xs[-1], *xs[1:-1]) if nhwc else xs
        try:
            kernel, st, d, begin, end, out, extra = _pool_geometry(logical, attrs)
            simple = _simple_pads(kernel, d, begin, end)
            if kind == "avg" and any(p >= k for p, k in zip(begin + end, kernel + kernel)):
                # A window wholly in the padding averages nothing: the reference's NaN (ORT
                # refuses such pads), where torch's mask division gave numbers.
                raise KernelError("pads not smaller than the window")
            if (not simple and kind == "max" and POOL_END_BY_CEIL
                    and _end_pads_by_ceil(logical[2:], kernel, st, d, begin, end, out)):
                simple = "ceil"
            geom = (kernel, st, d, begin, end, tuple(out), extra, simple)
            if kind == "max" and nhwc and len(kernel) == 2:
                geom += (_maxpool_sep_plan(xs, geom),)
        except KernelError:
            geom = None
    if len(_POOL_PLANS) > 4096:
        _POOL_PLANS.clear()
    _POOL_PLANS[key] = geom
    return geom


def _pool_kernel(ref: Callable[..., Any], nhwc: bool, kind: str, has_indices: bool = False):
    """MaxPool/AveragePool; dilated average pools, Indices and integer inputs use the reference."""

    def kernel(X, *, noutputs=1, **attrs):
        x = X if isinstance(X, np.ndarray) else np.asarray(X)
        geom = None if (has_indices and noutputs > 1) else _pool_plan(x, attrs, nhwc, kind)
        if geom is None:
            return _call_ref(ref, (X,), attrs, nhwc, noutputs if has_indices else None)
        with _Mode(_small(x)):
            if len(geom) > 8 and _SEPARABLE_MAXPOOL:  # an NHWC 2-D max pool
                return _np(_maxpool_sep(_t(x), geom[8]))
            t = _nchw_view(x) if nhwc else _t(x)
            if kind == "max":
                y = _maxpool_t(t, geom)
            else:
                y = _avgpool_t(t, geom, bool(attrs.get("count_include_pad", 0)))
            return _to_nhwc(y) if nhwc else _np(y)

    if has_indices:
        return kernel

    def kernel1(X, **attrs):
        return kernel(X, **attrs)

    return kernel1


def _global_kernel(ref: Callable[..., Any], nhwc: bool, reduce: str):
    def kernel(X):
        x = np.asarray(X)
        if x.ndim < 3 or x.size == 0:
            return _call_ref(ref, (X,), {}, nhwc)
        with _Mode(_small(x)):
            t = _t(x)
            dims = tuple(range(1, x.ndim - 1)) if nhwc else tuple(range(2, x.ndim))
            y = t.mean(dim=dims, keepdim=True) if reduce == "mean" else t.amax(dims, keepdim=True)
            return _np(y)

    return kernel


# ---------------------------------------------------------------------------------------------
# Normalization


def _bn_kernel(ref: Callable[..., Any], nhwc: bool, since: int):
    def kernel(X, scale, B, mean, var, *, epsilon=1e-5, noutputs=1, **attrs):
        x = np.asarray(X)
        if since >= 14:
            training = bool(attrs.get("training_mode", 0))
        elif since >= 7:
            training = noutputs > 1
        else:
            training = noutputs > 1 and not attrs.get("is_test", 0)
        params = (scale, B, mean, var)
        c = x.shape[-1] if (nhwc and x.ndim >= 3) else (x.shape[1] if x.ndim >= 2 else -1)
        plain = all(np.ndim(p) == 1 and np.shape(p)[0] == c for p in params)
        if training or not plain or x.ndim < 2 or not int(attrs.get("spatial", 1)):
            return _call_ref(ref, (X, *params), dict(attrs, epsilon=epsilon), nhwc, noutputs)
        with _Mode(_small(x)):
            t = _nchw_view(x) if nhwc else _t(x)
            ps = [_t(p) for p in params]
            ps = [p if p.dtype == t.dtype else p.to(t.dtype) for p in ps]
            y = F.batch_norm(t, ps[2], ps[3], ps[0], ps[1], False, 0.0, float(epsilon))
            return _to_nhwc(y) if nhwc else _np(y)

    return kernel


def _lrn_t(x: torch.Tensor, size: int, alpha, beta, bias, channels_last: bool) -> torch.Tensor:
    """ONNX LRN: y = x / (bias + alpha/size * sum of squares over a channel window) ** beta.

    The window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; an average pool with zero
    padding (count_include_pad) gives sum/size directly.
    """
    lo, hi = (size - 1) // 2, size // 2
    sq = x * x
    if channels_last:
        # x is (N, *spatial, C) contiguous: pool along the last axis.
        c = sq.shape[-1]
        win = F.avg_pool1d(F.pad(sq.reshape(-1, 1, c), (lo, hi)), size, 1)
        win = win.reshape(sq.shape)
    else:
        n, c = sq.shape[0], sq.shape[1]
        s = sq.reshape(n, 1, c, -1)
        win = F.avg_pool2d(F.pad(s, (0, 0, lo, hi)), (size, 1), 1).reshape(sq.shape)
    return x / win.mul_(float(alpha)).add_(float(bias)).pow_(float(beta))


def _lrn_kernel(ref: Callable[..., Any], nhwc: bool):
    def kernel(X, *, alpha=0.0001, beta=0.75, bias=1.0, size=None):
        x = np.asarray(X)
        if size is None or int(size) < 1 or x.ndim < 2 or x.size == 0 or x.dtype.kind != "f":
            return _call_ref(
                ref, (X,), {"alpha": alpha, "beta": beta, "bias": bias, "size": size}, nhwc
            )
        with _Mode(_small(x)):
            t = _t(x)
            if nhwc and x.ndim >= 3:
                return _np(_lrn_t(t, int(size), alpha, beta, bias, True))
            return _np(_lrn_t(t, int(size), alpha, beta, bias, False))

    return kernel


# ---------------------------------------------------------------------------------------------
# FusedElementwise: the passes' elementwise programs, one torch call per statement; a temporary
# read for the last time by a statement is overwritten by it (in place), so a linear chain
# allocates one tensor.

_EW_OUT: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum, "neg": torch.neg, "abs": torch.abs,
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "reciprocal": torch.reciprocal,
    "tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish,
    "leakyrelu": lambda x, a: F.leaky_relu(x, a),
    "clip": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "hardsigmoid": lambda x, a, b: x.mul(a).add_(b).clamp_(0.0, 1.0),
}
_EW_INPLACE: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.Tensor.add_, "sub": torch.Tensor.sub_, "mul": torch.Tensor.mul_,
    "div": torch.Tensor.div_, "max": lambda a, b: torch.maximum(a, b, out=a),
    "min": lambda a, b: torch.minimum(a, b, out=a), "neg": torch.Tensor.neg_,
    "abs": torch.Tensor.abs_, "exp": torch.Tensor.exp_, "log": torch.Tensor.log_,
    "sqrt": torch.Tensor.sqrt_, "reciprocal": torch.Tensor.reciprocal_,
    "tanh": torch.Tensor.tanh_, "relu": torch.Tensor.relu_, "sigmoid": torch.Tensor.sigmoid_,
    "hardswish": lambda x: F.hardswish(x, inplace=True),
    "leakyrelu": lambda x, a: F.leaky_relu_(x, a),
    "clip": lambda x, lo, hi: x.clamp_(lo, hi),
    "hardsigmoid": lambda x, a, b: x.mul_(a).add_(b).clamp_(0.0, 1.0),
}
_COMMUTATIVE = {"add", "mul", "max", "min"}
_EW_PROGRAMS: dict[str, tuple] = {}


def _ew_compile(program: str, parse: Callable[[str], Any]) -> tuple:
    """(dest, out-of-place fn, in-place fn or None, tensor args, number args) per statement."""
    plan = _EW_PROGRAMS.get(program)
    if plan is not None:
        return plan
    stmts = parse(program)
    last = last_reads(stmts)
    out = []
    fused = -1
    for k, (dest, name, args) in enumerate(stmts):
        if k == fused:
            continue
        mad = _mul_add(stmts, k, last)
        if mad is not None:
            # mul then add of its product: one addcmul pass instead of two (DenseNet's
            # BatchNorm + Relu on 56x56x256: 173 against 206 us with the relu).
            out.append((stmts[k + 1][0], torch.addcmul, None, mad, ()))
            fused = k + 1
            continue
        tensors = [a for a in args if isinstance(a, str)]
        numbers = tuple(a for a in args if not isinstance(a, str))
        inplace = None
        if tensors and tensors[0][0] == "t" and last[tensors[0]] == k:
            inplace = _EW_INPLACE[name]
        elif (len(tensors) == 2 and name in _COMMUTATIVE and tensors[1][0] == "t"
              and last[tensors[1]] == k and tensors[0] != tensors[1]):
            tensors = [tensors[1], tensors[0]]
            inplace = _EW_INPLACE[name]
        out.append((dest, _EW_OUT[name], inplace, tuple(tensors), numbers))
    plan = tuple(out)
    if len(_EW_PROGRAMS) > 1024:
        _EW_PROGRAMS.clear()
    _EW_PROGRAMS[program] = plan
    return plan


def _mul_add(stmts, k: int, last: dict[str, int]) -> tuple[str, str, str] | None:
    """(c, a, b) when statement k is t = mul(a, b) and statement k + 1 is add(t, c) or
    add(c, t), the only read of t, with a, b and c tensors; else None."""
    dest, name, args = stmts[k]
    if name != "mul" or k + 1 >= len(stmts) or last.get(dest) != k + 1:
        return None
    _, name2, args2 = stmts[k + 1]
    if name2 != "add" or not all(isinstance(a, str) for a in (*args, *args2)):
        return None
    if len(args) != 2 or len(args2) != 2 or list(args2).count(dest) != 1:
        return None
    c = args2[1] if args2[0] == dest else args2[0]
    return (c, args[0], args[1])


def _fused_elementwise_kernel(ref: Callable[..., Any], parse: Callable[[str], Any]):
    def kernel(*inputs, program=""):
        try:
            plan = _ew_compile(str(program), parse)
        except (KernelError, KeyError):
            return ref(*inputs, program=program)  # names the problem
        if not inputs:
            return ref(*inputs, program=program)
        with _Mode(_small(*inputs)):
            env: dict[str, torch.Tensor] = {f"x{i}": _t(x) for i, x in enumerate(inputs)}
            y = None
            for dest, fn, inplace, tensors, numbers in plan:
                try:
                    vals = [env[a] for a in tensors]
                except KeyError:
                    return ref(*inputs, program=program)
                y = None
                if inplace is not None:
                    try:
                        y = inplace(*vals, *numbers)
                    except RuntimeError:  # a temporary smaller than the broadcast result
                        y = None
                if y is None:
                    y = fn(*vals, *numbers)
                env[dest] = y
            return _np(y)

    return kernel


# ---------------------------------------------------------------------------------------------
# Registration


def _add(opdef: Any, fn: Callable[..., Any], name: str, *, dtypes=FLOATS, layout="any",
         accepts_out=False, specialize=None) -> None:
    opdef.kernel(
        device=DEVICE_NAME, dtypes=dtypes, layout=layout, name=name, accepts_out=accepts_out,
        specialize=specialize,
    )(fn)


def _each(op_type: str, domain: str = ""):
    return REGISTRY.versions(op_type, domain)


def _register_variants() -> None:
    simple: dict[str, tuple[Callable[..., Any], tuple, bool]] = {
        "Relu": (_relu, FLOATS + INTS, True),
        "Sigmoid": (_sigmoid, FLOATS, True),
        "Tanh": (_tanh, FLOATS, True),
        "LeakyRelu": (_leaky_relu, FLOATS, False),
        "HardSwish": (_hard_swish, FLOATS, False),
        "HardSigmoid": (_hard_sigmoid, FLOATS, False),
        "Elu": (_elu, FLOATS, False),
        "Gelu": (_gelu, FLOATS, False),
        "Sum": (_sum, FLOATS + INTS, True),
        "MatMul": (_matmul, FLOATS, True),
        "Concat": (_concat, NUMERIC, True),
        "Transpose": (_transpose, NUMERIC, False),
    }
    for op_type, (fn, dts, acc) in simple.items():
        for o in _each(op_type):
            _add(o, fn, f"{op_type.lower()}.torch", dtypes=dts, accepts_out=acc)
    for o in _each("Clip"):
        fn = _clip_6 if o.since < 11 else _clip_11
        _add(o, fn, "clip.torch", dtypes=FLOATS + INTS, accepts_out=True)
    binary = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}
    for op_type, tfn in binary.items():
        dts = FLOATS if op_type == "Div" else FLOATS + INTS
        for o in _each(op_type):
            fn = _binary(tfn, o.reference, legacy=o.since < 7)
            _add(o, fn, f"{op_type.lower()}.torch", dtypes=dts, accepts_out=True)
    for o in _each("Gemm"):
        _add(o, _gemm_kernel(o.since < 7, o.reference), "gemm.torch", accepts_out=True)
    for o in _each("Softmax"):
        _add(o, _softmax_kernel(o.reference, coerced=o.since < 13), "softmax.torch")
    # Pure data movement: the NumPy kernel already returns views, on either side of a boundary.
    for op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Split"):
        for o in _each(op_type):
            _add(o, o.reference, f"{op_type.lower()}.torch", dtypes=None)
    if not _CUDA:
        # A channel shuffle is one copy into the planned buffer (_channel_shuffle): ShuffleNet's
        # shuffles as Reshape -> Transpose -> Reshape in torch took 2.4 of 14.3 ms.
        for o in _each("ChannelShuffle", "opwarden"):
            _add(o, _channel_shuffle, "channelshuffle.torch", dtypes=_SHUFFLE_DTYPES,
                 accepts_out=True)
    for layout in ("NCHW", "NHWC"):
        nhwc = layout == "NHWC"
        suffix = layout.lower()
        for o in _each("Conv"):
            fn = _conv_kernel(o.reference, nhwc)
            _add(o, fn, f"conv.torch.{suffix}", layout=layout,
                 specialize=_bound_conv(fn, fused=False) if nhwc else None)
        for o in _each("MaxPool"):
            fn = _pool_kernel(o.reference, nhwc, "max", has_indices=o.since >= 8)
            _add(o, fn, f"maxpool.torch.{suffix}", layout=layout)
        for o in _each("AveragePool"):
            fn = _pool_kernel(o.reference, nhwc, "avg")
            _add(o, fn, f"averagepool.torch.{suffix}", layout=layout)
        for o in _each("GlobalAveragePool"):
            _add(o, _global_kernel(o.reference, nhwc, "mean"), f"globalaveragepool.torch.{suffix}",
                 layout=layout)
        for o in _each("GlobalMaxPool"):
            _add(o, _global_kernel(o.reference, nhwc, "max"), f"globalmaxpool.torch.{suffix}",
                 layout=layout)
        for o in _each("BatchNormalization"):
            _add(o, _bn_kernel(o.reference, nhwc, o.since), f"batchnormalization.torch.{suffix}",
                 layout=layout)
        for o in _each("LRN"):
            _add(o, _lrn_kernel(o.reference, nhwc), f"lrn.torch.{suffix}", layout=layout)
        for o in _each("FusedConv", "opwarden"):
            fn = _fused_conv_kernel(o.reference, nhwc)
            _add(o, fn, f"fusedconv.torch.{suffix}", layout=layout,
                 specialize=_bound_conv(fn, fused=True) if nhwc else None)
    for o in _each("FusedGemm", "opwarden"):
        _add(o, _fused_gemm_kernel(o.reference), "fusedgemm.torch")
    for o in _each("FusedMatMul", "opwarden"):
        _add(o, _fused_matmul, "fusedmatmul.torch")
    ew = _each("FusedElementwise", "opwarden")
    if ew:
        from opwarden.ops import fused

        parse = getattr(fused, "parse_program", None)
        for o in ew if parse is not None else ():
            _add(o, _fused_elementwise_kernel(o.reference, parse), "fusedelementwise.torch")


# ---------------------------------------------------------------------------------------------
# Deferral: work the host's NumPy kernels run faster than torch's on the CPU (see Device.defers)

# Host vs torch, in-model, alternated in one process (2 cores, both pools 2 threads):
# - With torch's workers spinning (the default set above) the host won only LRN: AlexNet 2.97
#   vs 3.75 ms, Inception-v1 5.19 vs 5.91; whole models 1.1-1.2% faster (AlexNet, ZFNet). Left
#   on torch as measured: pools (average pools 1.6-1.7x faster there, strided max pools
#   1.1-1.7x; deferring even Inception-v2's stride-1 max pools, 1.4x faster on the host, cost
#   the whole model 1.5%) and Concat (DenseNet 1.6% faster deferred, Inception-v1/v2 and
#   ShuffleNet 1.3-2.3% slower).
# - With passive waiting torch runs small work on one thread (_SERIAL_ELEMENTS) and the host
#   won pools and Concat too: MaxPool 1.2-3.6x (3x3/2 on 112x112x64: 0.79 vs 1.81 ms), Concat
#   1.6-4x (DenseNet's 56x56 blocks: 0.12 vs 0.37-0.49 ms), global pools ~1.5x; whole models
#   with those deferred 4.6-22% faster (DenseNet, Inception-v1/v2, AlexNet).
_HOST_FASTER = {"LRN": "the host's LRN (one running window sum over channels) measured "
                       "1.1-1.3x faster"}
if _PASSIVE:
    _PASSIVE_WHY = "with passive OpenMP waiting the host's {} measured {} faster"
    _HOST_FASTER.update({
        "LRN": _PASSIVE_WHY.format("LRN", "1.2-4.4x"),
        "MaxPool": _PASSIVE_WHY.format("max pool", "1.2-3.6x"),
        "AveragePool": _PASSIVE_WHY.format("average pool", "1-2x"),
        "GlobalAveragePool": _PASSIVE_WHY.format("global pools", "~1.5x"),
        "GlobalMaxPool": _PASSIVE_WHY.format("global pools", "~1.5x"),
        "Concat": _PASSIVE_WHY.format("Concat", "1.6-4x"),
    })


def _defers(node: Any) -> str | None:
    """Why torch (on the CPU) leaves `node` to a host device in the session, or None."""
    return _HOST_FASTER.get(node.op_type) if node.domain == "" else None


def configure(intra_op_num_threads: int = 0) -> None:
    """Size torch's thread pool: the session's intra_op_num_threads, else leave torch's default.

    torch's default is the number of physical cores, as onnxruntime's is.
    """
    n = int(intra_op_num_threads or 0)
    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def register() -> Device:
    """Add the torch device and its variants (idempotent: variants replace same-named ones)."""
    where = "CUDA " + torch.cuda.get_device_name(0) if _CUDA else "its CPU"
    dev = register_device(
        Device(
            DEVICE_NAME,
            kind="torch",
            description=f"PyTorch {torch.__version__} on {where}; channels-last convolutions",
            preferred_layout="NHWC",
            concurrent=False,
            aliases=("pytorch",),
            defers=None if _CUDA else _defers,
            host_memory=not _CUDA,
            extra={"torch_version": torch.__version__, "cuda": _CUDA,
                   "threads": torch.get_num_threads(), "cores": os.cpu_count()},
        )
    )
    _register_variants()
    return dev


# Importing the module is how the device registry brings the provider in (on first need).
register()
