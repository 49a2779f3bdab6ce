"""Shared pieces of the fast CPU kernels: scratch buffers, packed-weight cache, activations."""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from opwarden import native
from opwarden.blas import openblas_symbol, sgemm
from opwarden.errors import KernelError
from opwarden.kernels.cpu.blas_split import share
from opwarden.memory import hugepages
from opwarden.memory.constants import is_constant
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.activation import RELU_CHUNK, RELU_SMALL, RELU_ZEROS, relu  # noqa: F401
from opwarden.ops.fused import ACTIVATIONS

F32 = np.dtype(np.float32)

# ---------------------------------------------------------------------------------------------
# Scratch memory: one growable byte buffer per (thread, purpose). Thread-local because parallel
# branches may run two convolutions at once; grown, never shrunk, so steady-state runs allocate
# nothing.

_LOCAL = threading.local()
# Scratch buffers of at least this many bytes live in huge pages (memory.hugepages).
SCRATCH_HUGE = True
SCRATCH_HUGE_MIN = 1 << 20


def scratch(tag: str, shape: Sequence[int], dtype: Any = F32) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape`, reused across calls on this thread."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    pool = getattr(_LOCAL, "pool", None)
    if pool is None:
        pool = _LOCAL.pool = {}
    buf = pool.get(tag)
    if buf is None or buf.nbytes < nbytes:
        probe = getattr(_LOCAL, "probe", None)
        if (SCRATCH_HUGE and probe is None and nbytes >= SCRATCH_HUGE_MIN
                and hugepages.enabled()):
            buf = hugepages.huge_page_buffer(nbytes)
        else:
            # 64-byte alignment keeps the BLAS and SIMD loops on their fast paths.
            raw = np.empty(nbytes + 64, dtype=np.uint8)
            off = (-raw.ctypes.data) % 64
            buf = raw[off:off + nbytes]
        pool[tag] = buf
        if probe is not None:
            probe[tag] = nbytes
    return buf[:nbytes].view(dtype).reshape(tuple(shape))


def release_scratch() -> None:
    """Drop this thread's scratch buffers (tests and long-lived idle threads)."""
    _LOCAL.pool = {}


def scratch_held() -> int:
    """Bytes held by this thread's scratch buffers."""
    return sum(b.nbytes for b in getattr(_LOCAL, "pool", {}).values())


@contextmanager
def scratch_probe() -> Iterator[dict[str, int]]:
    """Measure the scratch a block of kernel calls takes on this thread: inside, the thread
    starts from an empty pool (so every buffer the calls need is acquired, and seen) whose
    buffers all come from the Python heap, where tracemalloc counts them (huge-page buffers are
    mappings it does not see); yields {tag: bytes} of what was acquired, filled as the calls
    run. The thread's own pool is back afterwards, untouched. (The `opwarden check` workspace
    check: kernel scratch is part of a variant's declared workspace.)"""
    saved = getattr(_LOCAL, "pool", None)
    saved_probe = getattr(_LOCAL, "probe", None)
    got: dict[str, int] = {}
    _LOCAL.pool, _LOCAL.probe = {}, got
    try:
        yield got
    finally:
        _LOCAL.pool, _LOCAL.probe = saved if saved is not None else {}, saved_probe


def output(
    out: np.ndarray | None, shape: Sequence[int], dtype: Any = F32, strided_ok: bool = False
) -> np.ndarray:
    """The planned buffer when it fits, else a fresh array.

    `strided_ok`: the caller (a variant registered with ``strided_out=True``) can write into a
    view whose outer axes are strided (a slice of a Concat's output), as long as the last axis
    is contiguous.
    """
    shape = tuple(shape)
    if out is None or out.shape != shape or out.dtype != dtype:
        return np.empty(shape, dtype=dtype)
    if out.flags.c_contiguous:
        return out
    if strided_ok and (out.strides[-1] == out.itemsize or shape[-1] <= 1):
        return out
    return np.empty(shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Packed weights: repacked once per weight array. Only arrays the runtime declared constant
# (memory.constants: a program's initializers) are cached; the entry dies with the array, so an
# id is never reused stale.

_PACKED: dict[tuple, tuple[tuple[weakref.ref, ...], np.ndarray, tuple]] = {}
_PACK_LOCK = threading.Lock()


def packed(
    w: np.ndarray, tag: Any, pack: Callable[[np.ndarray], np.ndarray],
    deps: tuple[np.ndarray, ...] = (),
) -> np.ndarray:
    """pack(w), cached for a constant `w` (memory.constants) under (id, tag) and the ids of
    `deps`: other constant arrays the packing reads (e.g. a bias); the entry dies with any of
    them. A hit also checks that the arrays are the same objects (weak references) with the
    same shape, strides and dtype as when packed. Other arrays, read-only or not, are packed on
    every call: their values may differ from the last call's.

    (Called for every convolution of every run, so a hit stays cheap: no data pointer in the
    key, whose ctypes lookup alone cost ~1 us. A constant's buffer and values are fixed for its
    life by declaration, see memory.constants.mark.)"""
    if not is_constant(w):
        return pack(w)
    if deps:
        if not all(is_constant(a) for a in deps):
            return pack(w)
        key: tuple = (id(w), tag, *map(id, deps))
        arrays: tuple = (w, *deps)
    else:
        key, arrays = (id(w), tag), (w,)
    sig = tuple((a.shape, a.strides, a.dtype) for a in arrays)
    hit = _PACKED.get(key)
    if hit is not None and hit[2] == sig and all(
        r() is a for r, a in zip(hit[0], arrays, strict=True)
    ):
        return hit[1]
    p = pack(w)
    if not isinstance(p, np.ndarray):  # a plan object (memo): cached as it is
        return _store(key, arrays, sig, p)
    if p.nbytes >= hugepages.MIN_BYTES and not np.shares_memory(p, w):
        # Streamed on every call: huge pages spare the TLB misses (memory.hugepages). A packing
        # only this call holds (its own new array) is moved without being resident twice.
        private = p.flags.owndata and p.base is None and sys.getrefcount(p) <= 2
        q = hugepages.huge_copy(p, private=private)
        if q is not p:
            nbytes, p = p.nbytes, q
            hugepages.release_heap(nbytes)
    mark_constant(p)  # derived from constants and cached with them: constant as long as it lives
    return _store(key, arrays, sig, p)


def _store(key: tuple, arrays: tuple, sig: tuple, p: Any) -> Any:
    def _drop(_ref, key=key, cache=_PACKED):
        # The cache is bound now: at interpreter exit module globals may already be None.
        cache.pop(key, None)

    try:
        refs = tuple(weakref.ref(a, _drop) for a in arrays)
    except TypeError:  # not weak-referenceable: do not cache
        return p
    with _PACK_LOCK:
        _PACKED[key] = (refs, p, sig)
    return p


def memo(w: np.ndarray, tag: Any, build: Callable[[np.ndarray], Any],
         deps: tuple[np.ndarray, ...] = ()) -> Any:
    """build(w): any object derived from a constant `w` (and constant `deps`), cached as
    `packed` caches a packing (same keys, same life), e.g. a kernel's plan for one input
    kind; rebuilt on every call where `w` or a dep is not constant."""
    return packed(w, tag, build, deps)


_PTRS: dict[int, tuple[weakref.ref, int]] = {}


def ptr(a: np.ndarray) -> int:
    """The address of a's data, for raw BLAS calls; remembered for constants (packed weights,
    biases: memory.constants), whose buffer is fixed for life, since a.ctypes.data costs ~1 us
    and the GEMM loops ask for the same weights on every call."""
    key = id(a)
    hit = _PTRS.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    p = a.ctypes.data
    if is_constant(a):

        def _drop(_ref, key=key, cache=_PTRS):
            if cache.get(key, (None,))[0] is _ref:
                del cache[key]

        _PTRS[key] = (weakref.ref(a, _drop), p)
    return p


# ---------------------------------------------------------------------------------------------
# Activations applied in place on a float32 buffer (the fused operators' `activation` attribute,
# one of ops.fused.ACTIVATIONS: the ONNX operator names, the one list their contracts check).


def zero_chunk(x: np.ndarray) -> np.ndarray:
    """Read-only zeros of x's shape, x a chunk of at most EW_CHUNK (= RELU_CHUNK) floats: max
    and min against an array take NumPy's fast loop, against a scalar a broadcasting one."""
    return RELU_ZEROS[:x.size].reshape(x.shape)


def one_chunk(x: np.ndarray) -> np.ndarray:
    """Read-only ones of x's shape (as zero_chunk)."""
    return ones_row(x.size).reshape(x.shape)


def activation_workspace(activation: str, params: Sequence[float] | None, n: int) -> int:
    """Workspace bytes of apply_activation on n elements: the chunked activations' float32
    scratch (see `chunked`); the others run in place."""
    if activation == "Gelu":
        return chunked_workspace(gelu_chunk(bool(params and float(params[0])))[1], n)
    if activation == "Swish":
        return chunked_workspace(1, n)  # (the NumPy chunks; the compiled loop takes none)
    return chunked_workspace(CHUNK_TEMPS.get(activation or "", 0), n)


def apply_activation(y: np.ndarray, activation: str, params: Sequence[float] = ()) -> np.ndarray:
    """y <- act(y) in place; returns y."""
    if not activation:
        return y
    if activation == "Relu":
        return relu(y)
    params = [float(p) for p in params or ()]
    with np.errstate(over="ignore", invalid="ignore"):
        if activation == "Clip":
            lo = params[0] if len(params) > 0 else -np.inf
            hi = params[1] if len(params) > 1 else np.inf
            np.clip(y, np.float32(lo), np.float32(hi), out=y)
        elif activation == "LeakyRelu":
            chunked(leaky_chunk(np.float32(params[0] if params else 0.01)), y, y, 1)
        elif activation == "Sigmoid":
            chunked(_sigmoid_chunk, y, y, 0)
        elif activation == "HardSwish":
            chunked(_hardswish_chunk, y, y, 1)
        elif activation == "Tanh":
            np.tanh(y, out=y)
        elif activation == "Gelu":
            _gelu_inplace(y, bool(params and params[0]))
        elif activation == "Swish":
            _swish_inplace(y, params[0] if params else 1.0)
        else:
            raise KernelError(
                f"activation {activation!r} is not one of {', '.join(map(repr, ACTIVATIONS))}"
            )
    return y


# Swish on the compiled loop (native/silu.c, as the SiLU kernels): blocks shared out by
# blas_split.share (their sizes and cost weight as kernels/cpu/silu_native.py's).
SWISH_BLOCK = 1 << 14
SWISH_COST = 16


def _swish_inplace(y: np.ndarray, alpha: float) -> None:
    """y <- y sigmoid(alpha y): the compiled loop on C-contiguous float32, else NumPy chunks
    of y / (1 + e^(-alpha y)) (e^ overflowing to inf gives -0 where the product is below
    float32's range anyway; inf / inf = NaN at y = -inf, as inf * 0 in the reference)."""
    if (native.available() and isinstance(y, np.ndarray) and y.dtype == F32
            and y.flags.c_contiguous and y.flags.writeable):
        n = y.size
        share(n, SWISH_BLOCK, n * SWISH_COST,
              lambda span, threads: native.swish(y, y, alpha, span, n_threads=threads))
        return
    a = np.float32(-alpha)

    def run(x, out, t):
        np.multiply(x, a, out=t)
        np.exp(t, out=t)
        t += _ONE
        np.divide(x, t, out=out)

    chunked(run, y, y, 1)


def leaky_chunk(alpha: np.float32) -> Callable[..., None]:
    """The chunk function of LeakyRelu: max(x, alpha x) for 0 < alpha <= 1, else
    max(x, 0) + alpha min(x, 0) (alpha = 0 too: inf * 0 would turn +inf into NaN). Both are
    exact (products with 0 or 1 and sums with 0 round nothing) and propagate NaN; a masked
    multiply (`where=`) costs ~6 ns an element."""
    if 0 < alpha <= 1:
        def run(x, y, t):
            np.multiply(x, alpha, out=t)
            np.maximum(x, t, out=y)
    else:
        def run(x, y, t):
            np.minimum(x, np.float32(0), out=t)
            t *= alpha
            np.maximum(x, np.float32(0), out=y)
            y += t
    return run


_SIX = np.float32(6.0)


def _hardswish_chunk(x, y, t) -> None:
    """y = x max(0, min(1, x/6 + 1/2)) (y may be x): divided by 6 as the reference does
    (x * (1/6) may differ by an ulp)."""
    np.divide(x, _SIX, out=t)
    t += _HALF
    np.minimum(t, one_chunk(t), out=t)
    np.maximum(t, zero_chunk(t), out=t)
    np.multiply(x, t, out=y)


def gelu_chunk(tanh: bool) -> tuple[Callable[..., None], int]:
    """(chunk function, float32 temporaries it takes) of Gelu: the tanh approximation or the
    erf form."""
    return (_gelu_tanh_chunk, 1) if tanh else (_gelu_chunk, 4)


def _gelu_inplace(y: np.ndarray, tanh: bool) -> None:
    # params [1] selects the tanh approximation (the fused operators' convention).
    if gelu_native(y, y, tanh):
        return
    fn, ntemps = gelu_chunk(tanh)
    chunked(fn, y, y, ntemps)


# Gelu on the compiled loop (native/gelu.c): one pass where the NumPy chunks make eight to
# twenty, the bias row added in the same pass, blocks shared out by blas_split.share.
GELU_BLOCK = 1 << 14
GELU_COST = 24  # multiply-adds an element, over_rows' threshold unit (~22 flops, a division)


def native_pair(x: Any, y: Any) -> bool:
    """Can a compiled elementwise kernel map x into y: extension loaded, float32 C-contiguous
    arrays of one shape, y writable and x itself or apart from it."""
    return (native.available() and isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
            and x.dtype == F32 and y.dtype == F32 and x.shape == y.shape
            and x.flags.c_contiguous and y.flags.c_contiguous and y.flags.writeable
            and (not np.may_share_memory(x, y) or x.ctypes.data == y.ctypes.data))


def gelu_native(x: Any, y: Any, tanh: bool, bias: Any = None) -> bool:
    """y = Gelu(x + bias) on the compiled kernel (native.gelu) where it applies (native_pair;
    bias None or a float32 row over the last axis apart from y). False: nothing written (the
    caller runs the NumPy chunks)."""
    if not native_pair(x, y):
        return False
    if bias is not None:
        if (not isinstance(bias, np.ndarray) or bias.dtype != F32 or bias.ndim != 1
                or x.ndim == 0 or bias.shape[0] != x.shape[-1] or bias.size == 0
                or np.may_share_memory(bias, y)):
            return False
        bias = np.ascontiguousarray(bias)
    n = x.size
    share(n, GELU_BLOCK, n * GELU_COST,
          lambda span, threads: native.gelu(x, y, tanh, bias, span, n_threads=threads))
    return True


# ---------------------------------------------------------------------------------------------
# Many-pass elementwise math (erf, Gelu): chunk by chunk, so the temporaries are a few chunk-sized
# scratch buffers that stay in L1/L2 instead of input-sized arrays.

# Floats per chunk: 64K (256 KiB a buffer).
EW_CHUNK = 1 << 16


def chunked_workspace(ntemps: int, n: int) -> int:
    """Scratch bytes `chunked` takes for `ntemps` float32 temporaries over n elements."""
    return 4 * ntemps * min(n, EW_CHUNK)


def chunked(fn: Callable[..., Any], x: np.ndarray, y: np.ndarray, ntemps: int) -> np.ndarray:
    """y = fn over x, chunk by chunk: fn(xc, yc, *temps) gets matching chunks of x and y (y may
    be x, or a strided view such as a slice of a Concat's output) and `ntemps` float32 scratch
    arrays of the chunk's shape, at most EW_CHUNK elements each. x and y have the same shape."""
    bufs = [scratch(f"ew.t{i}", (min(x.size, EW_CHUNK),)) for i in range(ntemps)]
    _chunks(fn, x, y, bufs)
    return y


def chunked_into(fn: Callable[..., Any], X: Any, out: np.ndarray | None,
                 ntemps: int) -> np.ndarray:
    """An elementwise kernel's body: `chunked` from X into the planned buffer `out` (a new
    array without one), floating-point warnings off (overflow to inf, NaN from inf - inf are
    results, as in the references)."""
    x = np.asarray(X)
    y = out if out is not None else np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return chunked(fn, x, y, ntemps)


def _chunks(fn, x, y, bufs) -> None:
    n = x.size
    if n <= EW_CHUNK:
        fn(x, y, *(t[:n].reshape(x.shape) for t in bufs))
    elif x.ndim <= 1 or (x.flags.c_contiguous and y.flags.c_contiguous):
        xf, yf = x.reshape(-1), y.reshape(-1)
        for a in range(0, n, EW_CHUNK):
            b = min(n, a + EW_CHUNK)
            fn(xf[a:b], yf[a:b], *(t[:b - a] for t in bufs))
    else:  # strided: slabs of whole rows (or one row at a time, itself chunked)
        inner = n // x.shape[0]
        step = max(1, EW_CHUNK // inner)
        for a in range(0, x.shape[0], step):
            _chunks(fn, x[a:a + step] if step > 1 else x[a], y[a:a + step] if step > 1 else y[a],
                    bufs)


def ones_row(n: int) -> np.ndarray:
    """n float32 ones, read-only (shared, filled once: see _ones): row sums as one BLAS
    matrix-vector product (x @ ones)."""
    return _ones(n)[:n]


def _horner(coef: tuple, t: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = sum coef[k] t^k (out must not be t)."""
    np.multiply(t, coef[-1], out=out)
    out += coef[-2]
    for c in coef[-3::-1]:
        out *= t
        out += c
    return out


# erf(x) ~ x P(x^2) / Q(x^2) on |x| <= ERF_CLAMP (float32 erf rounds to +-1 beyond ~3.87), the
# output clipped to [-1, 1]. Coefficients: our own weighted least-squares fit (Loeb iterations
# towards minimax; tools/fit_erf.py) of erf(x)/x on t = x^2 in [0, 3.9^2], relative fit error
# 1.8e-9, with P scaled by 1 + 2^-23 so that float32 rounding brings erf(+-3.9) (hence
# erf(+-inf)) to exactly +-1. Evaluated in float32 the result is within 8 units in the last
# place of the correctly rounded erf (absolute error < 5e-7; tests/kernels/test_math.py checks
# it on a dense grid).
# Rational rather than piecewise: every pass is a plain multiply-add (a masked select costs
# ~6 ns an element in NumPy): 1.4 ms on 128x3072 floats against 48 ms through math.erf.
ERF_CLAMP = np.float32(3.9)
_ERF_P = tuple(np.float32(c) for c in (
    1.1283793449401855, 0.18510589003562927, 0.05422070249915123, 0.0038349484093487263,
    0.0003758871171157807, 4.5861556827730965e-06, -1.2675257288208286e-08))
_ERF_Q = tuple(np.float32(c) for c in (
    1.0, 0.49737921357154846, 0.11384444683790207, 0.015419595874845982,
    0.0012996160658076406, 6.218258931767195e-05))
_ONE = np.float32(1.0)


def _erf_into(u: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray,
              q: np.ndarray) -> None:
    """y = erf(u) (y may be u; t, p, q are scratch of the same shape). NaN stays NaN."""
    np.clip(u, -ERF_CLAMP, ERF_CLAMP, out=y)
    np.multiply(y, y, out=t)
    _horner(_ERF_P, t, p)
    p *= y
    _horner(_ERF_Q, t, q)
    np.divide(p, q, out=y)
    np.clip(y, -_ONE, _ONE, out=y)


_erf_chunk = _erf_into  # chunked's signature: (x chunk, y chunk, 3 temporaries)


def erf_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float32 array into `out` (default: a new array); see _erf_into."""
    y = np.empty_like(x) if out is None else out
    return chunked(_erf_chunk, x, y, 3)


_RSQRT2 = np.float32(1.0 / math.sqrt(2.0))
_HALF = np.float32(0.5)


def _gelu_chunk(x: np.ndarray, y: np.ndarray, e: np.ndarray, t: np.ndarray, p: np.ndarray,
                q: np.ndarray) -> None:
    """y = x/2 (1 + erf(x / sqrt 2)) (y may be x: x is read again at the end)."""
    np.multiply(x, _RSQRT2, out=e)
    _erf_into(e, e, t, p, q)
    e += _ONE
    e *= _HALF
    np.multiply(x, e, out=y)


_GELU_C = np.float32(math.sqrt(2.0 / math.pi))
_GELU_K = np.float32(0.044715)


def _gelu_tanh_chunk(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
    """y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (y may be x)."""
    np.multiply(x, x, out=t)
    t *= _GELU_K
    t += _ONE
    t *= x
    t *= _GELU_C
    np.tanh(t, out=t)
    t += _ONE
    t *= _HALF
    np.multiply(x, t, out=y)


# Operator -> float32 temporaries (of one chunk each) of its chunk function here, for the
# workspace rules (Gelu: the erf form; gelu_chunk gives the tanh form's).
CHUNK_TEMPS = {"LeakyRelu": 1, "HardSwish": 1, "Sigmoid": 0, "Erf": 3, "Gelu": gelu_chunk(False)[1]}


def _sigmoid_chunk(x: np.ndarray, y: np.ndarray) -> None:
    """y = 1/(1+e^-x) (y may be x): e^-x overflowing to inf (x < -88.7) gives an exact 0 where
    sigmoid is below 2^-127 (a masked select of the overflow-free form costs ~6 ns an
    element)."""
    np.negative(x, out=y)
    np.exp(y, out=y)
    y += _ONE
    np.reciprocal(y, out=y)


def tap_range(off: int, size: int, o: int, st: int, b: int) -> tuple[int, int]:
    """Output indices [lo, hi) (of o, stride st, leading pad b) whose window tap at offset
    `off` reads inside an input axis of `size`: the rest read padding."""
    lo = min(o, max(0, -((off - b) // st)))
    hi = min(o, (size - 1 - off + b) // st + 1)
    return lo, max(lo, hi)


def is_f32(*facts: Any) -> bool:
    """Every given fact is float32 (or unknown dtype, which placement already filtered)."""
    return all(f is None or f.dtype in (None, "float32") for f in facts)


def static_rank(fact: Any) -> int | None:
    """The rank a fact states, or None."""
    shape = getattr(fact, "shape", None)
    return None if shape is None else len(shape)


def _operand(a: np.ndarray) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a 2-D float32 matrix BLAS can read in place."""
    e = a.itemsize
    r, c = a.shape
    if (a.strides[1] == e or c == 1) and a.strides[0] % e == 0 and a.strides[0] >= c * e:
        return False, max(1, a.strides[0] // e) if r > 1 else max(1, c)
    if (a.strides[0] == e or r == 1) and a.strides[1] % e == 0 and a.strides[1] >= r * e:
        return True, max(1, a.strides[1] // e) if c > 1 else max(1, r)
    return None


def matmul_acc(a: np.ndarray, b: np.ndarray, y: np.ndarray, accumulate: bool) -> None:
    """y = a @ b, or y += a @ b when `accumulate` (one BLAS call, no temporary): float32 2-D
    operands, row-major or transposed, y with unit inner stride."""
    gemm = sgemm() if a.size and b.size and y.size else None
    ta, tb = _operand(a), _operand(b)
    if (gemm is None or ta is None or tb is None or y.strides[1] != y.itemsize
            or y.strides[0] % y.itemsize or a.dtype != F32 or b.dtype != F32 or y.dtype != F32):
        if accumulate:
            y += a @ b
        else:
            np.matmul(a, b, out=y)
        return
    m, k = a.shape
    n = b.shape[1]
    ldc = y.strides[0] // y.itemsize if m > 1 else n
    gemm(m, n, k, ptr(a), ta[1], ptr(b), tb[1], 1.0 if accumulate else 0.0,
         y.ctypes.data, max(ldc, n), ta[0], tb[0])


# ---------------------------------------------------------------------------------------------
# Bias and residual adds through OpenBLAS's level-1/2 routines. NumPy's add runs on one thread;
# OpenBLAS's axpy (y += x) and rank-1 update ger (y += ones * bias^T) run on its threads, which
# are still awake just after the GEMM whose output they update. The sums are the same float32
# additions (alpha is 1, so alpha * x is exact): results equal NumPy's bit for bit, NaN and
# Inf included.

# Off: NumPy's adds everywhere (for measuring). Below these many floats NumPy's call is as
# fast or faster (no thread hand-off, no ctypes call).
BLAS_ADDS = True
BLAS_ROWS_MIN = 1 << 15
BLAS_AXPY_MIN = 1 << 17
_LEVEL12: list = []
_ONES: list = [np.ones(0, F32)]


def _level12() -> tuple[Any, Any]:
    """(saxpy, sger) of NumPy's OpenBLAS (ILP64 CBLAS), each None when it cannot be found."""
    import ctypes

    if not _LEVEL12:
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        axpy = openblas_symbol("scipy_cblas_saxpy64_", "cblas_saxpy64_")
        if axpy is not None:
            axpy.argtypes = [i64, f32, ptr, i64, ptr, i64]
            axpy.restype = None
        ger = openblas_symbol("scipy_cblas_sger64_", "cblas_sger64_")
        if ger is not None:
            ger.argtypes = [ctypes.c_int, i64, i64, f32, ptr, i64, ptr, i64, ptr, i64]
            ger.restype = None
        _LEVEL12.append((axpy, ger))
    return _LEVEL12[0]


def blas_adds() -> bool:
    """Whether add_rows and add_into run on OpenBLAS (large float32 operands)."""
    return BLAS_ADDS and None not in _level12()


def _ones(n: int) -> np.ndarray:
    ones = _ONES[0]
    if ones.size < n:
        ones = np.ones(max(n, 2 * ones.size), F32)
        mark_constant(ones)  # (read-only, never written: its address is remembered, see ptr)
        _ONES[0] = ones  # (a racing thread at worst makes its own: same values)
    return ones


def add_rows(y: np.ndarray, v: np.ndarray, threaded: bool = True) -> None:
    """y += v in place, v (M,) broadcast over y's last axis (a bias over an NHWC output or a
    (pixels, M) matrix): OpenBLAS's threaded rank-1 update when y's rows are unit-stride
    float32 and large enough, NumPy's add otherwise or when not `threaded` (the caller knows
    OpenBLAS's threads may be asleep)."""
    m = y.shape[-1] if y.ndim else 0
    if (threaded and BLAS_ADDS and y.size >= BLAS_ROWS_MIN and y.dtype == F32 and v.dtype == F32
            and v.shape == (m,) and v.strides[0] % 4 == 0 and v.strides[0] > 0):
        ger = _level12()[1]
        y2 = y.reshape(-1, m) if y.ndim != 2 else y
        if (ger is not None and y2.strides[1] == 4 and y2.strides[0] % 4 == 0
                and y2.strides[0] >= 4 * m and np.may_share_memory(y2, y)
                and not np.may_share_memory(y, v)):  # (a reshape that copied shares nothing)
            rows = y2.shape[0]
            ger(101, rows, m, 1.0, ptr(_ones(rows)), 1, ptr(v),
                v.strides[0] // 4, y2.ctypes.data, y2.strides[0] // 4)
            return
    y += v


def add_into(y: np.ndarray, z: np.ndarray, threaded: bool = True) -> None:
    """y += z in place for equal shapes: OpenBLAS's threaded axpy when both are contiguous
    float32 and large enough (and do not overlap), NumPy's add otherwise or when not
    `threaded` (as add_rows)."""
    if (threaded and BLAS_ADDS and y.size >= BLAS_AXPY_MIN and y.dtype == F32 and z.dtype == F32
            and y.shape == z.shape
            and y.flags.c_contiguous and z.flags.c_contiguous
            and (z is y or not np.may_share_memory(y, z))):
        axpy = _level12()[0]
        if axpy is not None:
            axpy(y.size, 1.0, z.ctypes.data, 1, y.ctypes.data, 1)
            return
    y += z
