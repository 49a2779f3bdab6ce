"""opwarden's compiled kernels (a C extension with OpenMP, built by `pip install .`), and
whether they are in use.

The extension is optional: the NumPy kernels are the reference and the fallback. `status()`
says which path is active and why; `OPWARDEN_NATIVE=0` in the environment turns the compiled
path off at import (so the fallback can be tested on a machine that has the build). Kernels
register their compiled variants only when `available()`.

Tree ensembles (`Forest`): the forest is flattened once into arrays the C walk reads:
- `nodes`: one NODE_DTYPE record per interior node; a child is a node index (>= 0) or a leaf
  as -(leaf + 1); a BRANCH_MEMBER node's threshold slot holds the [begin, end) int32 range
  of its set in `members`;
- `roots`: per tree, its root in the child encoding (a one-leaf tree is a leaf);
- per leaf, its (target, weight) entries: `leaf_off` (CSR offsets), `leaf_tgt`, `leaf_w`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from opwarden.blas import blas_thread_count
from opwarden.errors import KernelError
from opwarden.native import blas_pool as _pool

# Node comparison modes (ONNX TreeEnsemble-5 numbering).
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)

NODE_DTYPE = np.dtype([("thr", "<f8"), ("feat", "<i4"), ("child_false", "<i4"),
                       ("child_true", "<i4"), ("mode", "u1"), ("miss", "u1"),
                       ("pad", "<u2")])

AGGREGATES = {"AVERAGE": 0, "SUM": 1, "MIN": 2, "MAX": 3}


# GOMP_SPINCOUNT while the extension's libgomp loads (it reads the variable once). Its workers
# also run OpenBLAS's jobs (blas_pool), so their spin after a region bridges the gaps between a
# run's GEMMs and passes: 10000 iterations, ~0.4 ms here (OpenBLAS's own workers spun ~2.7 ms).
# With OpenBLAS on its own threads a spinning worker takes a core from those (MobileNetV3 spent
# ~3x its CPU time so on a loaded machine): 1000 then. (benchmarks/NOTES.md, session #10.)
OMP_SPIN = "10000" if _pool.wanted() else "1000"


@contextlib.contextmanager
def _short_omp_spin():
    """OMP spin default for the extension's libgomp only: set while it loads, then the
    environment as it was (a policy the user set wins; a libgomp loaded earlier by another
    library keeps what it read; torch loads its own copy and sets its own default)."""
    if any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = OMP_SPIN
    try:
        yield
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)


def _load() -> tuple[Any, str]:
    """The compiled module (or None) and a sentence saying why that path is active."""
    if os.environ.get("OPWARDEN_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "NumPy fallback: disabled by OPWARDEN_NATIVE=0"
    try:
        with _short_omp_spin():
            from opwarden.native import _native  # type: ignore[attr-defined]
    except ImportError as e:
        return None, f"NumPy fallback: the compiled extension did not import ({e})"
    omp = _native.openmp()
    return _native, ("native compiled: C extension " + (f"with OpenMP {omp}" if omp else
                                                       "without OpenMP (single thread)"))


_LIB, _REASON = _load()
_pool.install(_LIB)


def available() -> bool:
    """Whether the compiled kernels are in use in this process."""
    return _LIB is not None


# OPWARDEN_QGEMM_ISA=avx2 (or portable) makes this process a CPU with at most that for the
# integer GEMM: its variants, the QDQ fusion and the kernel all act as there (a test of an
# AVX2 machine's choices on a VNNI one).
QGEMM_CAP = {"avx2": 2, "portable": 1}.get(os.environ.get("OPWARDEN_QGEMM_ISA", ""), 0)
_QGEMM_NAMES = {0: "portable", 1: "avx512-vnni", 2: "avx2"}  # qgemm_isa's codes


def qgemm_isa() -> str:
    """The instruction set of the compiled integer GEMM: "avx512-vnni", "avx2", "portable"
    (a reference loop, not a fast path) or "none" (no extension)."""
    if _LIB is None:
        return "none"
    code = int(_LIB.qgemm_isa())
    if QGEMM_CAP:
        code = 0 if QGEMM_CAP == 1 else (2 if code == 1 else code)
    return _QGEMM_NAMES.get(code, "portable")


# OPWARDEN_PACKED_GEMM=0 keeps OpenBLAS everywhere: the packed GEMM's panels are a second copy
# of every weight they pack (BERT-base: ~335 MB more resident), which a memory-bound deployment
# may not want to pay for the speed.
_PACKED_GEMM_ON = os.environ.get("OPWARDEN_PACKED_GEMM", "1").strip().lower() not in (
    "0", "false", "no", "off")


def sgemm_packed() -> str:
    """The packed-weight float32 GEMM (sgemm.c): "avx512f" where it runs, "off" where
    OPWARDEN_PACKED_GEMM=0 turned it off, "none" without the extension or AVX-512F."""
    if _LIB is None or not hasattr(_LIB, "sgemm_packed_isa") or not _LIB.sgemm_packed_isa():
        return "none"
    return "avx512f" if _PACKED_GEMM_ON else "off"


def status() -> dict[str, Any]:
    """Which kernel path is active: {"active": "native" | "numpy", "reason": str,
    "openmp": version or 0, "module": path of the extension or None, "blas_pool": "openmp" |
    "openblas" (whose threads run NumPy's OpenBLAS jobs), "blas_pool_reason": str,
    "qgemm_isa": the integer GEMM's instruction set (qgemm_isa), "sgemm_packed": the packed
    float32 GEMM's state (sgemm_packed)}."""
    pool, why = _pool.state()
    return {
        "active": "native" if _LIB is not None else "numpy",
        "reason": _REASON,
        "openmp": int(_LIB.openmp()) if _LIB is not None else 0,
        "module": getattr(_LIB, "__file__", None),
        "blas_pool": pool,
        "blas_pool_reason": why,
        "qgemm_isa": qgemm_isa(),
        "sgemm_packed": sgemm_packed(),
    }


def set_blas_pool(on: bool) -> bool:
    """NumPy's OpenBLAS runs its parallel jobs on the extension's OpenMP threads (on, the
    default at import) or on its own (off); False where that cannot be done (see status())."""
    return _pool.set_pool(_LIB, on)


def blas_pool_counts() -> tuple[int, int]:
    """(OpenBLAS job sets run on an OpenMP team, job sets run on plain threads) so far."""
    return tuple(_LIB.blas_pool_counts()) if _LIB is not None else (0, 0)  # type: ignore


def _threads(n_threads: int | None) -> int:
    return max(1, int(n_threads) if n_threads else blas_thread_count())


def bias_act(y: np.ndarray, bias: np.ndarray | None, act: str,
             n_threads: int | None = None) -> np.ndarray:
    """y = act(y + bias) in place over a C-contiguous float32 [rows, cols] array (bias [cols]
    or None; act "none" | "relu" | "gelu", the exact erf form); returns y."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if y.dtype != np.float32 or not y.flags.c_contiguous or not y.flags.writeable:
        raise KernelError("bias_act needs a writable C-contiguous float32 array")
    cols = y.shape[-1] if y.ndim else 1
    rows = y.size // cols if cols else 0
    b = np.ascontiguousarray(bias, dtype=np.float32) if bias is not None else y[:0]
    if bias is not None and b.size != cols:
        raise KernelError(f"bias_act: bias has {b.size} values for {cols} columns")
    code = {"none": 0, "relu": 1, "gelu": 2}.get(act)
    if code is None:
        raise KernelError(f"bias_act: unknown activation {act!r}")
    _LIB.bias_act(y, b, bias is not None, rows, cols, code, _threads(n_threads))
    return y


# FusedConv activations the compiled depthwise epilogue applies (depthwise.c's codes); Gelu
# is "Gelu" with params [0] (erf) or [1] (tanh form).
DW_ACTS = {"": 0, "Relu": 1, "Clip": 2, "LeakyRelu": 3, "Sigmoid": 4, "HardSwish": 5,
           "Tanh": 6, "Gelu": 7, "Swish": 9}


def _act_code(codes: dict[str, int], activation: str,
              params) -> tuple[int, float, float] | None:
    """(code, p0, p1) of a fused activation in a kernel's table `codes`, None if absent."""
    code = codes.get(activation or "")
    if code is None:
        return None
    p = [float(v) for v in (params or ())]
    if activation == "Clip":
        return code, (p[0] if p else -np.inf), (p[1] if len(p) > 1 else np.inf)
    if activation == "LeakyRelu":
        return code, (p[0] if p else 0.01), 0.0
    if activation == "Swish":
        return code, (p[0] if p else 1.0), 0.0
    return code, 0.0, 0.0


def dw_act_code(activation: str, params) -> tuple[int, float, float] | None:
    """(code, p0, p1) of a fused activation for depthwise_nhwc, None if it has none here."""
    if activation == "Gelu" and params and float(params[0]):
        return 8, 0.0, 0.0  # the tanh form
    return _act_code(DW_ACTS, activation, params)


def _nhwc_epilogue_args(name: str, y: np.ndarray, z: np.ndarray | None,
                        bias: np.ndarray | None, activation: str, params,
                        rows: tuple[int, int] | None) -> tuple[tuple[int, float, float], int, int]:
    """What the NHWC convolution loops check of their epilogue and row range: z has y's
    shape, bias one value per output channel, the activation a DW_ACTS code, `rows` within
    the N*OH output rows (all of them when None). Returns (activation code, r0, r1)."""
    if z is not None and z.shape != y.shape:
        raise KernelError(f"{name}: z {z.shape} must match y {y.shape}")
    m = y.shape[3]
    if bias is not None and bias.size != m:
        raise KernelError(f"{name}: bias has {bias.size} values for {m} channels")
    act = dw_act_code(activation, params)
    if act is None:
        raise KernelError(f"{name}: activation {activation!r} is not one of {sorted(DW_ACTS)}")
    total = y.shape[0] * y.shape[1]
    r0, r1 = rows if rows is not None else (0, total)
    if not 0 <= r0 <= r1 <= total:
        raise KernelError(f"{name}: rows {rows} outside 0..{total}")
    return act, r0, r1


def depthwise_nhwc(x: np.ndarray, taps: np.ndarray, bias: np.ndarray | None,
                   z: np.ndarray | None, y: np.ndarray, strides, dilations, pads_begin,
                   activation: str = "", params=(), n_threads: int | None = None,
                   rows: tuple[int, int] | None = None) -> np.ndarray:
    """y[n, i, j, c] = act(bias[c] + z[n, i, j, c] + sum over taps (a, b) of
    x[n, i*sh - pt + a*dh, j*sw - pl + b*dw, c] * taps[a, b, c]) (taps outside x read zero),
    over C-contiguous float32 NHWC x [N, H, W, C], taps [kh, kw, C], y and z [N, OH, OW, C]
    (z may be y itself); returns y. `rows` (r0, r1): only output rows r0..r1-1 of the N*OH
    (n, i) rows, for a caller sharing them out over its own threads (n_threads 1)."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    arrays = [x, taps, y] + [a for a in (bias, z) if a is not None]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
        raise KernelError("depthwise_nhwc needs C-contiguous float32 arrays")
    if x.ndim != 4 or y.ndim != 4 or taps.ndim != 3 or not y.flags.writeable:
        raise KernelError(f"depthwise_nhwc: x {x.shape}, taps {taps.shape}, y {y.shape}: "
                          "need 4-D x and y (writable), 3-D taps")
    n, h, w, c = x.shape
    kh, kw, tc = taps.shape
    if y.shape[0] != n or y.shape[3] != c or tc != c:
        raise KernelError(f"depthwise_nhwc: x {x.shape}, taps {taps.shape}, y {y.shape} "
                          "disagree on N or C")
    act, r0, r1 = _nhwc_epilogue_args("depthwise_nhwc", y, z, bias, activation, params, rows)
    _LIB.depthwise_nhwc(x, taps, bias if bias is not None else x[:0],
                        z if z is not None else x[:0], y, bias is not None, z is not None,
                        n, h, w, c, y.shape[1], y.shape[2], kh, kw, int(strides[0]),
                        int(strides[1]), int(dilations[0]), int(dilations[1]),
                        int(pads_begin[0]), int(pads_begin[1]), act[0], act[1], act[2],
                        r0, r1, _threads(n_threads))
    return y


def grouped_pair_ok(group: int, cg: int, mg: int) -> bool:
    """Whether grouped_nhwc takes these groups in its pair layout (two groups of 4 outputs
    per vector, see native/grouped.c): mg 4, cg a multiple of 4, an even group count."""
    return mg == 4 and cg % 4 == 0 and group % 2 == 0


def grouped_nhwc(x: np.ndarray, wp: np.ndarray, bias: np.ndarray | None,
                 z: np.ndarray | None, y: np.ndarray, group: int, kernel: tuple[int, int],
                 strides, dilations, pads_begin, activation: str = "", params=(),
                 n_threads: int | None = None, rows: tuple[int, int] | None = None,
                 pair: bool = False) -> np.ndarray:
    """y[n, i, j, g*mg + k] = act(bias + z + sum over taps (a, b) and ci < cg of
    x[n, i*sh - pt + a*dh, j*sw - pl + b*dw, g*cg + ci] * W[g*mg + k, ci, a, b]) (taps outside
    x read zero) over C-contiguous float32 NHWC x [N, H, W, group*cg] and y, z
    [N, OH, OW, group*mg] (z may be y itself), with W repacked as wp: (group, kh, kw, cg, mg)
    or, `pair` (where grouped_pair_ok), (group/2, kh, kw, cg, 2, 4). Returns y. `rows`
    (r0, r1): only output rows r0..r1-1 of the N*OH (n, i) rows (n_threads 1 for a caller
    sharing them out)."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    arrays = [x, wp, y] + [a for a in (bias, z) if a is not None]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
        raise KernelError("grouped_nhwc needs C-contiguous float32 arrays")
    if x.ndim != 4 or y.ndim != 4 or not y.flags.writeable:
        raise KernelError(f"grouped_nhwc: x {x.shape}, y {y.shape}: need 4-D x and y "
                          "(writable)")
    n, h, w, c = x.shape
    m = y.shape[3]
    kh, kw = (int(k) for k in kernel)
    if group < 1 or c % group or m % group or y.shape[0] != n:
        raise KernelError(f"grouped_nhwc: x {x.shape}, y {y.shape} and group={group} "
                          "disagree")
    cg, mg = c // group, m // group
    if wp.size != m * cg * kh * kw:
        raise KernelError(f"grouped_nhwc: packed weights have {wp.size} values, "
                          f"{m * cg * kh * kw} needed")
    if pair and not grouped_pair_ok(group, cg, mg):
        raise KernelError(f"grouped_nhwc: the pair layout needs mg 4, cg a multiple of 4 and "
                          f"an even group count, got group={group} cg={cg} mg={mg}")
    if z is not None and np.may_share_memory(z, y) and z.ctypes.data != y.ctypes.data:
        raise KernelError("grouped_nhwc: z overlaps y without being y")
    act, r0, r1 = _nhwc_epilogue_args("grouped_nhwc", y, z, bias, activation, params, rows)
    _LIB.grouped_nhwc(x, wp, bias if bias is not None else x[:0],
                      z if z is not None else x[:0], y, bias is not None, z is not None,
                      bool(pair), n, h, w, c, y.shape[1], y.shape[2], m, group, cg, mg, kh, kw,
                      int(strides[0]), int(strides[1]), int(dilations[0]), int(dilations[1]),
                      int(pads_begin[0]), int(pads_begin[1]), act[0], act[1], act[2], r0, r1,
                      _threads(n_threads))
    return y


# Activations conv_epilogue applies (conv_epilogue.c's codes): the piecewise ones, which it
# computes exactly as the NumPy kernels do, and Swish [alpha] as the compiled SiLU does.
EPILOGUE_ACTS = {"": 0, "Relu": 1, "Clip": 2, "LeakyRelu": 3, "HardSwish": 4, "Swish": 5,
                 "Sigmoid": 6}


def epilogue_act_code(activation: str, params) -> tuple[int, float, float] | None:
    """(code, p0, p1) of an activation for conv_epilogue, None if it has none there."""
    return _act_code(EPILOGUE_ACTS, activation, params)


def conv_epilogue(y: np.ndarray, bias: np.ndarray | None, z: np.ndarray | None,
                  activation: str = "", params=(), n_threads: int = 1) -> np.ndarray:
    """y = act(y + bias + z) in place over a C-contiguous float32 y whose last axis is the
    channels (bias [C] or None; z y's shape, C-contiguous, or None; z may be y itself but
    not overlap it otherwise); act one of EPILOGUE_ACTS. Returns y."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    arrays = [y] + [a for a in (bias, z) if a is not None]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays) \
            or not y.flags.writeable:
        raise KernelError("conv_epilogue needs C-contiguous float32 arrays, y writable")
    cols = y.shape[-1] if y.ndim else 1
    rows = y.size // cols if cols else 0
    if bias is not None and bias.size != cols:
        raise KernelError(f"conv_epilogue: bias has {bias.size} values for {cols} channels")
    if z is not None and z.shape != y.shape:
        raise KernelError(f"conv_epilogue: z {z.shape} must match y {y.shape}")
    if z is not None and np.may_share_memory(z, y) and z.ctypes.data != y.ctypes.data:
        raise KernelError("conv_epilogue: z overlaps y without being y")
    act = epilogue_act_code(activation, params)
    if act is None:
        raise KernelError(f"conv_epilogue: activation {activation!r} is not one of "
                          f"{sorted(EPILOGUE_ACTS)}")
    _LIB.conv_epilogue(y, bias if bias is not None else y[:0], z if z is not None else y[:0],
                       bias is not None, z is not None, rows, cols, act[0], act[1], act[2],
                       _threads(n_threads))
    return y


def requantize(acc: np.ndarray, mult: np.ndarray, bias: np.ndarray | None, zero_point: int,
               out: np.ndarray, axis: int | None = None, n_threads: int = 1) -> np.ndarray:
    """out = saturate(rint(float32(acc + bias[c]) * mult[c]) + zero_point), NaN to the type's
    minimum, over an exact integer accumulator (C-contiguous float32 or float64) into an
    8-bit `out` of its shape; c indexes acc's `axis` (None: one mult, no bias). mult: float32,
    one value or one per channel; bias: int32, one per channel, or None. Returns out."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if acc.dtype not in (np.float32, np.float64) or not acc.flags.c_contiguous:
        raise KernelError(f"requantize: acc must be C-contiguous float32/float64, got "
                          f"{acc.dtype}")
    if out.dtype not in (np.int8, np.uint8) or out.shape != acc.shape \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise KernelError(f"requantize: out must be a writable C-contiguous 8-bit array of "
                          f"acc's shape {acc.shape}, got {out.dtype} {out.shape}")
    shape = acc.shape if acc.ndim else (1,)
    m = np.ascontiguousarray(mult, np.float32).reshape(-1)
    b = None if bias is None else np.ascontiguousarray(bias, np.int32).reshape(-1)
    per_col = False
    if axis is None or (m.size == 1 and b is None):
        # one multiplier: rows of the last axis, for the threads to share
        groups, cols = 1, max(1, shape[-1])
        rows = acc.size // cols
    elif -len(shape) <= axis < len(shape):
        ax = axis % len(shape)
        groups, inner = shape[ax], int(np.prod(shape[ax + 1:]))
        per_col = inner == 1  # the channels are the last axis (or followed by 1s)
        rows, cols = (acc.size // max(1, groups), groups) if per_col else \
            (int(np.prod(shape[:ax + 1])), inner)
    else:
        raise KernelError(f"requantize: axis {axis} outside acc's {acc.ndim} axes")
    if m.size != groups:
        raise KernelError(f"requantize: {m.size} multipliers for {groups} channels")
    if b is not None and b.size != groups:
        raise KernelError(f"requantize: bias has {b.size} values for {groups} channels")
    _LIB.requantize_8bit(acc, acc.dtype == np.float64, b if b is not None else m[:0],
                         b is not None, m, rows, cols, groups, per_col,
                         float(np.float32(zero_point)), out.dtype == np.int8,
                         out, _threads(n_threads))
    return out


def qconv_im2col(x: np.ndarray, image: int, c0: int, c1: int, kernel: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], begin: tuple[int, int],
                 out_hw: tuple[int, int], zero_point: int, cols: np.ndarray,
                 n_threads: int = 1) -> np.ndarray:
    """The im2col columns [(c1 - c0) kh kw, oh ow] of channels c0..c1-1 of image `image` of a
    C-contiguous 8-bit NCHW x, as float32 less `zero_point`, 0 in the padding (`begin`: the
    top and left pads). Writes and returns the C-contiguous float32 `cols`."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if x.dtype not in (np.int8, np.uint8) or x.ndim != 4 or not x.flags.c_contiguous:
        raise KernelError(f"qconv_im2col: x must be a C-contiguous 8-bit NCHW array, got "
                          f"{x.dtype} {x.shape}")
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = kernel, out_hw
    if not (0 <= image < n and 0 <= c0 <= c1 <= c):
        raise KernelError(f"qconv_im2col: image {image}, channels {c0}..{c1} outside {x.shape}")
    if cols.dtype != np.float32 or not cols.flags.c_contiguous or not cols.flags.writeable \
            or cols.size != (c1 - c0) * kh * kw * oh * ow:
        raise KernelError(f"qconv_im2col: cols must be a writable C-contiguous float32 array "
                          f"of {(c1 - c0) * kh * kw * oh * ow} values, got {cols.dtype} "
                          f"{cols.shape}")
    if min(*strides, *dilations, kh, kw) < 1 or min(begin) < 0:
        raise KernelError(f"qconv_im2col: bad geometry: kernel {kernel}, strides {strides}, "
                          f"dilations {dilations}, pads {begin}")
    _LIB.qconv_im2col(x.reshape(-1), (image * c + c0) * h * w, x.dtype == np.int8, c1 - c0,
                      h, w, kh, kw, strides[0], strides[1], dilations[0], dilations[1],
                      begin[0], begin[1], oh, ow, float(zero_point), cols, _threads(n_threads))
    return cols


def swish(x: np.ndarray, y: np.ndarray, alpha: float = 1.0,
          span: tuple[int, int] | None = None, n_threads: int = 1) -> np.ndarray:
    """y = x * sigmoid(alpha x) (SiLU for alpha 1) over C-contiguous float32 arrays of one
    size (y may be x); `span` (start, stop): only those flat elements, for a caller sharing
    the work out over its own threads; `n_threads` > 1: OpenMP threads over the span (large
    spans only). Returns y."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if (x.dtype != np.float32 or y.dtype != np.float32 or not x.flags.c_contiguous
            or not y.flags.c_contiguous or not y.flags.writeable):
        raise KernelError("swish needs C-contiguous float32 arrays, y writable")
    if x.size != y.size:
        raise KernelError(f"swish: x has {x.size} values, y {y.size}")
    lo, hi = span if span is not None else (0, x.size)
    if not 0 <= lo <= hi <= x.size:
        raise KernelError(f"swish: span {span} outside 0..{x.size}")
    _LIB.swish(x, y, lo, hi - lo, float(alpha), max(1, int(n_threads)))
    return y


def softmax_rows(s: np.ndarray, c: float, biases: list[tuple[np.ndarray, int, int, int]],
                 inv: np.ndarray) -> None:
    """The softmax rows of a C-contiguous float32 block of scores s [n, m, t] (softmax.c), in
    place: s = e^(c s + biases - row max), inv [n, m] float32 = 1 / each row's sum. Each of
    at most two biases is (base, offset, head stride, row stride): a C-contiguous float32
    array and where in it the block's (head, row) reads its t contiguous floats (strides in
    floats, 0 to broadcast)."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if (s.dtype != np.float32 or s.ndim != 3 or not s.flags.c_contiguous
            or not s.flags.writeable or inv.dtype != np.float32
            or inv.size != s.shape[0] * s.shape[1] or not inv.flags.c_contiguous
            or not inv.flags.writeable):
        raise KernelError("softmax_rows needs C-contiguous float32 scores [n, m, t] and a "
                          "writable float32 inv of n * m values")
    if len(biases) > 2 or any(b.dtype != np.float32 or not b.flags.c_contiguous
                              for b, *_ in biases):
        raise KernelError("softmax_rows takes at most two C-contiguous float32 biases")
    n, m, t = s.shape
    parts: list = []
    for k in range(2):
        if k < len(biases):
            b, off, hs, rs = biases[k]
            parts += [b, True, int(off), int(hs), int(rs)]
        else:
            parts += [_NO_BIAS, False, 0, 0, 0]
    _LIB.softmax_rows(s, n, m, t, float(c), *parts, inv)


# gelu.c's modes
GELU_ERF, GELU_TANH, GELU_PLAIN_ERF = range(3)
_NO_BIAS = np.empty(0, np.float32)  # (the buffer passed for "no bias": x may be 0-d)


def _gelu_call(x: np.ndarray, y: np.ndarray, bias: np.ndarray | None, mode: int,
               span: tuple[int, int] | None, n_threads: int, what: str) -> np.ndarray:
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if (not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray)
            or x.dtype != np.float32 or y.dtype != np.float32 or not x.flags.c_contiguous
            or not y.flags.c_contiguous or not y.flags.writeable):
        raise KernelError(f"{what} needs C-contiguous float32 arrays, y writable")
    if x.size != y.size:
        raise KernelError(f"{what}: x has {x.size} values, y {y.size}")
    # (y is x, or apart from it: the loop reads x[i] just before it writes y[i])
    if np.may_share_memory(x, y) and x.ctypes.data != y.ctypes.data:
        raise KernelError(f"{what}: y overlaps x without being x")
    cols = 1
    if bias is not None:
        cols = x.shape[-1] if x.ndim else 1
        if (bias.dtype != np.float32 or not bias.flags.c_contiguous or bias.size != cols
                or cols == 0):
            raise KernelError(f"{what}: bias must be {cols} C-contiguous float32 values (one "
                              f"per column of x {x.shape}), got {bias.dtype} {bias.shape}")
        if np.may_share_memory(bias, y):
            raise KernelError(f"{what}: bias overlaps y")
    lo, hi = span if span is not None else (0, x.size)
    if not 0 <= lo <= hi <= x.size:
        raise KernelError(f"{what}: span {span} outside 0..{x.size}")
    _LIB.gelu(x, y, bias if bias is not None else _NO_BIAS, bias is not None, cols, lo,
              hi - lo, mode, max(1, int(n_threads)))
    return y


def gelu(x: np.ndarray, y: np.ndarray, tanh: bool = False, bias: np.ndarray | None = None,
         span: tuple[int, int] | None = None, n_threads: int = 1) -> np.ndarray:
    """y = Gelu(x + bias) over C-contiguous float32 arrays of one size (y may be x, but not
    overlap it otherwise): the erf form x/2 (1 + erf(x / sqrt 2)) or, `tanh`, the tanh
    approximation; `bias` None or a row of x.shape[-1] float32 values added first (one
    pass). `span` (start, stop): only those flat elements, for a caller sharing the work out
    over its own threads; `n_threads` > 1: OpenMP threads over the span (large spans only).
    Returns y."""
    return _gelu_call(x, y, bias, GELU_TANH if tanh else GELU_ERF, span, n_threads, "gelu")


def erf(x: np.ndarray, y: np.ndarray, span: tuple[int, int] | None = None,
        n_threads: int = 1) -> np.ndarray:
    """y = erf(x) (the rational approximation the erf form of `gelu` uses) over
    C-contiguous float32 arrays of one size (y may be x); span and n_threads as `gelu`."""
    return _gelu_call(x, y, None, GELU_PLAIN_ERF, span, n_threads, "erf")


def layernorm(x: np.ndarray, y: np.ndarray, scale: np.ndarray | None,
              bias: np.ndarray | None, epsilon: float, mean: np.ndarray, inv: np.ndarray,
              rows: tuple[int, int] | None = None, n_threads: int = 1) -> np.ndarray:
    """LayerNormalization over the rows of C-contiguous float32 x and y [R, C] (y may be x):
    y = (x - mean) * inv * scale + bias, inv = 1 / sqrt(var + epsilon) (the two-pass variance,
    sums in double), scale and bias [C] float32 or None; mean and inv [R] float32 get each
    row's. `rows` (r0, r1): only those rows (for a caller sharing them out over its own
    threads); `n_threads` > 1: OpenMP threads over the rows (large arrays only). Returns y."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    arrays = [x, y, mean, inv] + [a for a in (scale, bias) if a is not None]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays) \
            or not (y.flags.writeable and mean.flags.writeable and inv.flags.writeable):
        raise KernelError("layernorm needs C-contiguous float32 arrays, y, mean, inv writable")
    if x.ndim != 2 or y.shape != x.shape or x.shape[1] == 0:
        raise KernelError(f"layernorm: x {x.shape}, y {y.shape}: need equal [rows, cols], "
                          "cols >= 1")
    n_rows, cols = x.shape
    for name, p in (("scale", scale), ("bias", bias)):
        if p is not None and p.size != cols:
            raise KernelError(f"layernorm: {name} has {p.size} values for {cols} columns")
    if mean.size != n_rows or inv.size != n_rows:
        raise KernelError(f"layernorm: mean and inv need {n_rows} values, got {mean.size} "
                          f"and {inv.size}")
    if np.may_share_memory(x, y) and x.ctypes.data != y.ctypes.data:
        raise KernelError("layernorm: y overlaps x without being x")
    r0, r1 = rows if rows is not None else (0, n_rows)
    if not 0 <= r0 <= r1 <= n_rows:
        raise KernelError(f"layernorm: rows {rows} outside 0..{n_rows}")
    _LIB.layernorm(x, y, scale if scale is not None else _NO_BIAS, scale is not None,
                   bias if bias is not None else _NO_BIAS, bias is not None, n_rows, cols,
                   float(epsilon), mean, inv, r0, r1, max(1, int(n_threads)))
    return y


_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


def cast_f16_isa() -> int:
    """The float16 conversion path this CPU runs: 2 AVX512F, 1 F16C, 0 scalar (the default
    path of `cast_f16`), or -1 without the extension."""
    return int(_LIB.cast_f16_isa()) if _LIB is not None else -1


def cast_f16(x: np.ndarray, y: np.ndarray, span: tuple[int, int] | None = None,
             n_threads: int = 1, isa: int = -1) -> np.ndarray:
    """y = x.astype(y.dtype), bit for bit, between C-contiguous float32 and float16 arrays of
    one size (either direction; NaN payloads as NumPy moves them, see native/cast.c). x and y
    must not overlap. `span` (start, stop): only those flat elements, for a caller sharing the
    work out over its own threads; `n_threads` > 1: OpenMP threads over the span (large spans
    only); `isa` -1 the best path the CPU has, else at most 0 scalar, 1 F16C, 2 AVX512F (for
    tests). Returns y."""
    if _LIB is None:
        raise KernelError(f"compiled kernels not available: {_REASON}")
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        raise KernelError("cast_f16 needs NumPy arrays")
    if (x.dtype, y.dtype) not in ((_F32, _F16), (_F16, _F32)):
        raise KernelError(f"cast_f16 converts float32 <-> float16, got {x.dtype} -> {y.dtype}")
    if not x.flags.c_contiguous or not y.flags.c_contiguous or not y.flags.writeable:
        raise KernelError("cast_f16 needs C-contiguous arrays, y writable")
    if x.size != y.size:
        raise KernelError(f"cast_f16: x has {x.size} values, y {y.size}")
    if x.size and np.may_share_memory(x, y):
        raise KernelError("cast_f16: y overlaps x")
    lo, hi = span if span is not None else (0, x.size)
    if not 0 <= lo <= hi <= x.size:
        raise KernelError(f"cast_f16: span {span} outside 0..{x.size}")
    _LIB.cast_f16(x, y, lo, hi - lo, x.dtype == _F32, int(isa), max(1, int(n_threads)))
    return y


@dataclass(frozen=True)
class Forest:
    """A flattened forest (module docstring) ready for `eval`."""

    nodes: np.ndarray
    members: np.ndarray
    roots: np.ndarray
    leaf_off: np.ndarray
    leaf_tgt: np.ndarray
    leaf_w: np.ndarray
    n_feat: int
    n_targets: int
    agg: int

    @property
    def mode_class(self) -> int:
        """1: every node BRANCH_LEQ, 2: every node BRANCH_LT, 0: mixed (a per-node switch)."""
        modes = self.nodes["mode"]
        if modes.size and (modes == LEQ).all():
            return 1
        if modes.size and (modes == LT).all():
            return 2
        return 0

    def eval(self, X: np.ndarray, n_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Scores [N, n_targets] (float64: the sum, or min/max, of the leaf weights reached
        per target; 0 where none) and `has` [N, n_targets] (whether any leaf gave a weight)."""
        if _LIB is None:
            raise KernelError(f"compiled kernels not available: {_REASON}")
        if X.ndim != 2 or X.shape[1] != self.n_feat:
            raise KernelError(f"tree ensemble: input shape {X.shape}, forest wants "
                              f"[N, {self.n_feat}]")
        if X.dtype != np.float64:
            X = X.astype(np.float32, copy=False)
        X = np.ascontiguousarray(X)
        n = X.shape[0]
        S = np.empty((n, self.n_targets), dtype=np.float64)
        H = np.empty((n, self.n_targets), dtype=np.uint8)
        _LIB.forest_eval(X, X.dtype == np.float64, n, self.n_feat, self.nodes, self.members,
                         self.roots, self.leaf_off, self.leaf_tgt, self.leaf_w, self.n_targets,
                         self.agg, self._mode_class, S, H, _threads(n_threads))
        return S, H.view(bool)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_mode_class", self.mode_class)
