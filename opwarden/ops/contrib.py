"""Operators: contrib family (domain com.microsoft, as ONNX Runtime documents them).

onnx.defs does not know these operators, so each declares its schema here. Semantics follow
ONNX Runtime's ContribOperators.md; half-precision inputs compute in float32, as ORT does.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os

import numpy as np

from opwarden.blas import blas_thread_count
from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import REGISTRY, OpDef, op
from opwarden.ops.common import work_float
from opwarden.ops.elementwise import erf

MS = "com.microsoft"
FLOATS = ["float32", "float16", "float64", "bfloat16"]
_ELEMENTWISE = Contract(may_alias=((0, 0),), nan="propagate")


def _compute(x: np.ndarray) -> np.ndarray:
    """x copied into its compute dtype (see common.work_float)."""
    return x.astype(work_float(x.dtype))


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU x/2 * (1 + erf(x/sqrt 2)) in x's (wide) dtype."""
    return x * (0.5 * (1.0 + erf(x / math.sqrt(2.0)).astype(x.dtype)))


def _fast_gelu(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _check_bias(bias: np.ndarray, x: np.ndarray, what: str) -> None:
    if bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise KernelError(f"{what} must be 1-D of length {x.shape[-1]}, got shape {bias.shape}")


# --------------------------------------------------------------------------------------------
# GELU family
# --------------------------------------------------------------------------------------------


@op("Gelu", domain=MS, since=1, inputs=["X: T"], outputs=["Y: T"], types={"T": FLOATS},
    contract=_ELEMENTWISE)
def Gelu(X):
    """x/2 * (1 + erf(x/sqrt 2)) (com.microsoft Gelu-1)."""
    return _gelu(_compute(X)).astype(X.dtype)


@op("BiasGelu", domain=MS, since=1, inputs=["A: T", "B: T"], outputs=["C: T"],
    types={"T": FLOATS}, contract=Contract(may_alias=((0, 0),), nan="propagate",
                                           broadcast="unidirectional"))
def BiasGelu(A, B):
    """Gelu(A + B) with B a bias over A's last axis (com.microsoft BiasGelu-1)."""
    _check_bias(B, A, "BiasGelu bias")
    return _gelu(_compute(A) + _compute(B)).astype(A.dtype)


@op("FastGelu", domain=MS, since=1, inputs=["X: T", "bias?: T"], outputs=["Y: T"],
    types={"T": FLOATS}, contract=_ELEMENTWISE)
def FastGelu(X, bias=None):
    """Tanh-approximated GELU of X (+ bias) (com.microsoft FastGelu-1)."""
    x = _compute(X)
    if bias is not None:
        _check_bias(bias, X, "FastGelu bias")
        x = x + _compute(bias)
    return _fast_gelu(x).astype(X.dtype)


@op("QuickGelu", domain=MS, since=1, inputs=["X: T"], outputs=["Y: T"], types={"T": FLOATS},
    attrs={"alpha": 1.702}, contract=_ELEMENTWISE)
def QuickGelu(X, *, alpha=1.702):
    """x * sigmoid(alpha * x) (com.microsoft QuickGelu-1)."""
    x = _compute(X)
    z = alpha * x
    # Split by sign so exp never overflows.
    e = np.exp(-np.abs(z))
    sig = np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (x * sig).astype(X.dtype)


@op("BiasAdd", domain=MS, since=1, inputs=["X: T", "bias: T", "skip: T"], outputs=["Y: T"],
    types={"T": ["float32", "float16"]}, contract=Contract(may_alias=((0, 0),)))
def BiasAdd(X, bias, skip):
    """X + bias + skip for (N, S, C) activations and a (C,) bias (com.microsoft BiasAdd-1)."""
    if X.ndim != 3:
        raise KernelError(f"BiasAdd input must be 3-D (N, S, C), got shape {X.shape}")
    _check_bias(bias, X, "BiasAdd bias")
    if skip.shape != X.shape:
        raise KernelError(f"BiasAdd skip shape {skip.shape} != input shape {X.shape}")
    return (_compute(X) + _compute(bias) + _compute(skip)).astype(X.dtype)


# --------------------------------------------------------------------------------------------
# MatMul variants
# --------------------------------------------------------------------------------------------


def _fused_operand(x: np.ndarray, trans: int, trans_batch: int) -> np.ndarray:
    """Apply FusedMatMul's layout flags to one operand.

    transBatch moves the leading dimension to just before the last one (so a [K, B, M]
    operand is read as [B, K, M]); trans then swaps the two trailing dimensions.
    """
    if x.ndim == 1:
        return x
    if trans_batch and x.ndim > 2:
        perm = list(range(1, x.ndim - 1)) + [0, x.ndim - 1]
        x = x.transpose(perm)
    if trans:
        x = np.swapaxes(x, -1, -2)
    return x


@op("FusedMatMul", domain=MS, since=1, inputs=["A: T", "B: T"], outputs=["Y: T"],
    types={"T": FLOATS},
    attrs={"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0},
    contract=Contract(nan="propagate", allowed={
        "transA": one_of(0, 1), "transB": one_of(0, 1),
        "transBatchA": one_of(0, 1), "transBatchB": one_of(0, 1)}))
def FusedMatMul(A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """alpha * op(A) @ op(B), batched like MatMul (com.microsoft FusedMatMul-1)."""
    a = _fused_operand(_compute(A), transA, transBatchA)
    b = _fused_operand(_compute(B), transB, transBatchB)
    try:
        y = np.matmul(a, b)
    except ValueError as e:
        raise KernelError(f"FusedMatMul shapes {a.shape} and {b.shape} do not match: {e}") from e
    return np.asarray(alpha * y).astype(A.dtype)


def _dynamic_quant_uint8(a: np.ndarray) -> tuple[np.ndarray, np.float32, np.int32]:
    """Asymmetric uint8 quantization of `a` (float32), its range widened to include 0.

    Bit for bit ORT's GetQuantizationParameter + MlasQuantizeLinear: the scale is
    (max - min) / 255 and the zero point 0 - min / scale, both in float32, the zero point
    clamped to [0, 255] then rounded half to even; values are a / scale (a division),
    rounded half to even, plus the zero point, saturated to [0, 255].
    """
    f32 = np.float32
    lo = min(f32(a.min()) if a.size else f32(0), f32(0))
    hi = max(f32(a.max()) if a.size else f32(0), f32(0))
    scale = f32(1) if hi == lo else f32(f32(hi - lo) / f32(255))
    zp = np.int32(np.rint(min(max(f32(f32(0) - f32(lo / scale)), f32(0)), f32(255))))
    q = np.clip(np.rint(a / scale) + zp, 0, 255).astype(np.int32)
    return q, scale, zp


@op("DynamicQuantizeMatMul", domain=MS, since=1,
    inputs=["A: T1", "B: T2", "b_scale: T1", "b_zero_point?: T2", "bias?: T1"],
    outputs=["Y: T1"], types={"T1": ["float32"], "T2": ["int8", "uint8"]},
    contract=Contract(nan="propagate"))
def DynamicQuantizeMatMul(A, B, b_scale, b_zero_point=None, bias=None):
    """A quantized to uint8 on the fly, integer MatMul with B, then rescale
    (com.microsoft DynamicQuantizeMatMul-1)."""
    qa, sa, za = _dynamic_quant_uint8(A.astype(np.float32))
    n = B.shape[-1]
    bs = np.asarray(b_scale, dtype=np.float32)
    if bs.size not in (1, n):
        raise KernelError(f"b_scale must be a scalar or have {n} entries, got shape {bs.shape}")
    zb = np.zeros((), np.int32) if b_zero_point is None else b_zero_point.astype(np.int32)
    if zb.size not in (1, n):
        raise KernelError(f"b_zero_point must be a scalar or have {n} entries, got {zb.shape}")
    acc = np.matmul((qa - za).astype(np.int64), (B.astype(np.int32) - zb).astype(np.int64))
    y = acc.astype(np.float32) * (sa * bs)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Normalizations
# --------------------------------------------------------------------------------------------

_NORM_CONTRACT = Contract(nan="propagate")


def _skip_sum(input, skip, bias, what: str) -> np.ndarray:
    """input + skip (+ bias) in the compute dtype, checking the shapes ORT accepts."""
    if input.ndim not in (2, 3):
        raise KernelError(f"{what} input must be 2-D or 3-D, got shape {input.shape}")
    if skip.shape[-1] != input.shape[-1]:
        raise KernelError(f"{what} skip shape {skip.shape} does not match input {input.shape}")
    try:
        s = _compute(input) + _compute(skip)
    except ValueError as e:
        raise KernelError(f"{what} skip shape {skip.shape} not broadcastable to input") from e
    if s.shape != input.shape:
        raise KernelError(f"{what} skip shape {skip.shape} not broadcastable to {input.shape}")
    if bias is not None:
        _check_bias(bias, input, f"{what} bias")
        s = s + _compute(bias)
    return s


@op("SkipLayerNormalization", domain=MS, since=1,
    inputs=["input: T", "skip: T", "gamma: T", "beta?: T", "bias?: T"],
    outputs=["output: T", "mean?: U", "inv_std_var?: U", "input_skip_bias_sum?: T"],
    types={"T": ["float32", "float16", "float64", "bfloat16"], "U": ["float32", "float64"]},
    attrs={"epsilon": 1e-12}, contract=_NORM_CONTRACT)
def SkipLayerNormalization(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    """LayerNorm(input + skip + bias) * gamma + beta over the last axis
    (com.microsoft SkipLayerNormalization-1)."""
    s = _skip_sum(input, skip, bias, "SkipLayerNormalization")
    _check_bias(gamma, input, "SkipLayerNormalization gamma")
    mean = s.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(s - mean), axis=-1, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + epsilon)
    y = (s - mean) * inv_std * _compute(gamma)
    if beta is not None:
        _check_bias(beta, input, "SkipLayerNormalization beta")
        y = y + _compute(beta)
    u = np.float64 if input.dtype == np.float64 else np.float32
    return y.astype(input.dtype), mean.astype(u), inv_std.astype(u), s.astype(input.dtype)


@op("SkipSimplifiedLayerNormalization", domain=MS, since=1,
    inputs=["input: T", "skip: T", "gamma: T", "bias?: T"],
    outputs=["output: T", "mean?: U", "inv_std_var?: U", "input_skip_bias_sum?: T"],
    types={"T": ["float32", "float16", "float64", "bfloat16"], "U": ["float32", "float64"]},
    attrs={"epsilon": 1e-12}, contract=_NORM_CONTRACT)
def SkipSimplifiedLayerNormalization(input, skip, gamma, bias=None, *, epsilon=1e-12):
    """RMSNorm(input + skip + bias) * gamma over the last axis
    (com.microsoft SkipSimplifiedLayerNormalization-1). `mean` is reported as zeros."""
    s = _skip_sum(input, skip, bias, "SkipSimplifiedLayerNormalization")
    _check_bias(gamma, input, "SkipSimplifiedLayerNormalization gamma")
    inv_rms = 1.0 / np.sqrt(np.mean(np.square(s), axis=-1, keepdims=True) + epsilon)
    y = s * inv_rms * _compute(gamma)
    u = np.float64 if input.dtype == np.float64 else np.float32
    mean = np.zeros(inv_rms.shape, dtype=u)  # RMS normalization subtracts no mean
    return y.astype(input.dtype), mean, inv_rms.astype(u), s.astype(input.dtype)


@op("SimplifiedLayerNormalization", domain=MS, since=1,
    inputs=["X: T", "scale: V"], outputs=["Y: V", "inv_std_var?: U"],
    types={"T": ["float32", "float16", "float64", "bfloat16"],
           "V": ["float32", "float16", "float64", "bfloat16"], "U": ["float32", "float64"]},
    attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1},
    contract=Contract(nan="propagate", allowed={"stash_type": one_of(1, 11)}))
def SimplifiedLayerNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """RMS normalization over axes [axis, rank) times scale
    (SimplifiedLayerNormalization-1; ORT also registers it in the default domain)."""
    if not -X.ndim <= axis < X.ndim:
        raise KernelError(f"axis {axis} out of range for rank {X.ndim}")
    axis = axis % X.ndim
    u = np.float64 if stash_type == 11 or X.dtype == np.float64 else np.float32
    x = X.astype(u)
    axes = tuple(range(axis, X.ndim))
    inv_rms = 1.0 / np.sqrt(np.mean(np.square(x), axis=axes, keepdims=True) + epsilon)
    try:
        y = x * inv_rms * scale.astype(u)
    except ValueError as e:
        raise KernelError(f"scale shape {scale.shape} does not broadcast to {X.shape}") from e
    return y.astype(scale.dtype), inv_rms.astype(u)


# ORT's optimizer writes SimplifiedLayerNormalization in the default domain (ORT registers it
# only there), so the same operator is registered there too, under its own schema.
REGISTRY.add(OpDef("SimplifiedLayerNormalization", "", 1, SimplifiedLayerNormalization.reference,
                   SimplifiedLayerNormalization.contract,
                   dataclasses.replace(SimplifiedLayerNormalization.custom_schema, domain="")))


# --------------------------------------------------------------------------------------------
# Attention (packed QKV projection, BERT-style masks)
# --------------------------------------------------------------------------------------------


def _mask_from_index(mask_index: np.ndarray, batch: int, seq: int, past: int, total: int,
                     filt: float) -> np.ndarray:
    """ORT's mask_index forms as an additive (B, S, total) bias of 0 / mask_filter_value.

    1-D (B): key end positions (right padding); 1-D (2B): end then start positions;
    2-D (B, total): raw 0/1 mask; 3-D (B, S, total): raw per-query mask;
    4-D (B, 1, max, max): Megatron-style causal mask, sliced at the past/current window.
    """
    m = np.asarray(mask_index)
    j = np.arange(total)
    if m.ndim == 1:
        if m.shape[0] not in (batch, 2 * batch):
            raise KernelError(f"1-D mask_index must have {batch} or {2 * batch} entries")
        keep = j[None, :] < m[:batch, None]
        if m.shape[0] == 2 * batch:
            keep &= j[None, :] >= m[batch:, None]
        keep = np.broadcast_to(keep[:, None, :], (batch, seq, total))
    elif m.ndim == 2:
        if m.shape != (batch, total):
            raise KernelError(f"2-D mask_index must be {(batch, total)}, got {m.shape}")
        keep = np.broadcast_to((m > 0)[:, None, :], (batch, seq, total))
    elif m.ndim == 3:
        if m.shape != (batch, seq, total):
            raise KernelError(f"3-D mask_index must be {(batch, seq, total)}, got {m.shape}")
        keep = m > 0
    elif m.ndim == 4:
        if m.shape[0] != batch or m.shape[2] < total or m.shape[3] < total:
            raise KernelError(f"4-D mask_index shape {m.shape} too small for {total} positions")
        keep = m[:, 0, past:past + seq, :total] > 0
    else:
        raise KernelError(f"mask_index must be 1-D to 4-D, got shape {m.shape}")
    return np.where(keep, 0.0, filt).astype(np.float32)


def _contrib_attention_workspace(inp, weights, *rest, **attrs) -> int:
    """Scratch: the packed QKV projection plus one (B, N, S, S) score matrix, float32."""
    b, s = inp[0], inp[1]
    heads = attrs.get("num_heads") or 1
    return int(4 * (b * s * weights[-1] + b * heads * s * s))


@op("Attention", domain=MS, since=1,
    inputs=["input: T", "weights: T", "bias?: T", "mask_index?: M", "past?: T",
            "attention_bias?: T", "past_sequence_length?: M"],
    outputs=["output: T", "present?: T"],
    types={"T": ["float32", "float16"], "M": ["int32"]},
    attrs={"num_heads": "INT", "unidirectional": 0, "qkv_hidden_sizes": ("INTS", None),
           "mask_filter_value": -10000.0, "scale": 0.0, "do_rotary": 0,
           "rotary_embedding_dim": 0, "past_present_share_buffer": 0},
    contract=Contract(nan="propagate", workspace_bytes=_contrib_attention_workspace, allowed={
        "unidirectional": one_of(0, 1), "do_rotary": one_of(0),
        "past_present_share_buffer": one_of(0)}))
def ContribAttention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                     past_sequence_length=None, *, num_heads=None, unidirectional=0,
                     qkv_hidden_sizes=None, mask_filter_value=-10000.0, scale=0.0, do_rotary=0,
                     rotary_embedding_dim=0, past_present_share_buffer=0):
    """Multi-head self-attention with a packed QKV projection (com.microsoft Attention-1)."""
    if input.ndim != 3:
        raise KernelError(f"Attention input must be (B, S, hidden), got shape {input.shape}")
    if not num_heads:
        raise KernelError("Attention needs the num_heads attribute")
    batch, seq, _ = input.shape
    width = weights.shape[1]
    if qkv_hidden_sizes:
        qh, kh, vh = (int(v) for v in qkv_hidden_sizes)
    else:
        qh = kh = vh = width // 3
    if qh != kh or qh + kh + vh != width or qh % num_heads or vh % num_heads:
        raise KernelError(
            f"weights width {width} does not split into Q/K/V sizes {(qh, kh, vh)} "
            f"divisible by num_heads={num_heads}"
        )
    if weights.shape[0] != input.shape[-1]:
        raise KernelError(f"weights rows {weights.shape[0]} != input hidden {input.shape[-1]}")
    qkv = _compute(input) @ _compute(weights)
    if bias is not None:
        _check_bias(bias, qkv, "Attention bias")
        qkv = qkv + _compute(bias)
    return attention_from_qkv(qkv, (qh, kh, vh), num_heads, mask_index, past, attention_bias,
                              unidirectional, mask_filter_value, scale, input.dtype)


def attention_from_qkv(qkv, sizes, num_heads, mask_index=None, past=None, attention_bias=None,
                       unidirectional=0, mask_filter_value=-10000.0, scale=0.0, dtype=None):
    """com.microsoft Attention after its projection: qkv (B, S, qh+kh+vh) in the compute
    dtype, split into heads, past keys/values prepended, masked softmax, merged heads.
    Returns (output, present) in `dtype` (QAttention shares it)."""
    batch, seq = qkv.shape[0], qkv.shape[1]
    qh, kh, vh = sizes
    dtype = dtype or qkv.dtype
    head, vhead = qh // num_heads, vh // num_heads

    def heads(x, size):  # (B, S, N*H) -> (B, N, S, H)
        return x.reshape(batch, seq, num_heads, size).transpose(0, 2, 1, 3)

    q = heads(qkv[..., :qh], head)
    k = heads(qkv[..., qh:qh + kh], head)
    v = heads(qkv[..., qh + kh:], vhead)
    past_len = 0
    if past is not None:
        if past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != batch:
            raise KernelError(f"past must be (2, B, N, P, H), got shape {past.shape}")
        past_len = past.shape[3]
        k = np.concatenate([_compute(past[0]), k], axis=2)
        v = np.concatenate([_compute(past[1]), v], axis=2)
    total = past_len + seq

    s = float(scale) if scale else 1.0 / math.sqrt(head)
    scores = (q @ np.swapaxes(k, -1, -2)) * s
    filt = float(mask_filter_value)
    if mask_index is not None:
        scores = scores + _mask_from_index(mask_index, batch, seq, past_len, total, filt)[:, None]
    if unidirectional:
        # Keys after a query's own position get the filter value added (ORT adds, not sets).
        future = np.arange(total)[None, :] > (np.arange(seq)[:, None] + past_len)
        scores = scores + np.where(future, filt, 0.0).astype(scores.dtype)
    if attention_bias is not None:
        scores = scores + _compute(attention_bias)
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    probs = e / e.sum(axis=-1, keepdims=True)
    y = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, vh)
    present = np.stack([k, v]).astype(dtype) if vhead == head else None
    return y.astype(dtype), present


# --------------------------------------------------------------------------------------------
# Dynamically quantized LSTM
# --------------------------------------------------------------------------------------------


def _quant_matmul(a: np.ndarray, qw: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """a @ dequantize(qw) as ORT computes it: all of `a` quantized to uint8 with one scale,
    an exact integer product, then rescaled per column of qw (float32)."""
    qa, sa, za = _dynamic_quant_uint8(a)
    acc = (qa - za).astype(np.int64) @ (qw.astype(np.int64) - zp.astype(np.int64))
    return acc.astype(np.float32) * (sa * scale)


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical CPU cores, counted as ORT's default thread pool counts them (cpuinfo: distinct
    core ids per package); ORT's own fallback, half the logical CPUs, when sysfs is silent."""
    cores = set()
    for topo in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(f"{topo}/physical_package_id") as f1, open(f"{topo}/core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            continue
    return len(cores) or max(1, (os.cpu_count() or 2) // 2)


def ort_intra_threads() -> int:
    """The degree of parallelism ORT's CPU kernels would see in this process: the session's
    intra_op_num_threads (mirrored into the BLAS pool) capped at the physical cores, which is
    ORT's default."""
    return max(1, min(blas_thread_count(), physical_cores()))


def lstm_batch_chunk(batch: int, hidden: int, threads: int) -> int:
    """Rows of the batch that ORT's LSTM steps together (and so quantizes with one scale):
    the batch is split over the threads when it has more than 4 rows, or at least 2 rows and
    a hidden size of at most 256; otherwise the whole batch is one block."""
    if batch > 4 or (batch >= 2 and hidden <= 256):
        return -(-batch // max(1, threads))
    return max(batch, 1)


def _recurrent(prev: np.ndarray, qr, rs, rz, chunk: int) -> np.ndarray:
    """prev @ R with each block of `chunk` batch rows quantized on its own, as ORT's threads
    do."""
    return np.concatenate([_quant_matmul(prev[r:r + chunk], qr, rs, rz)
                           for r in range(0, prev.shape[0], chunk)]) if prev.shape[0] else \
        np.zeros((0, qr.shape[1]), np.float32)


def _per_column(v: np.ndarray, num_dir: int, cols: int, what: str) -> np.ndarray:
    """A scale / zero point given per direction ([D]) or per column ([D, cols]) as [D, 1|cols]."""
    v = np.asarray(v)
    if v.shape in ((num_dir,), (num_dir, 1)) or (num_dir == 1 and v.shape == ()):
        return v.reshape(num_dir, 1)
    if v.shape == (num_dir, cols):
        return v
    raise KernelError(f"{what} has shape {v.shape}; expected ({num_dir},) or ({num_dir}, {cols})")


def _qlstm_shapes(X, W, R, num_dir: int, hidden_size):
    if X.ndim != 3:
        raise KernelError(f"X must be [seq, batch, input], got shape {X.shape}")
    H = R.shape[1] if R.ndim == 3 else -1
    if hidden_size is not None and int(hidden_size) != H:
        raise KernelError(f"hidden_size={hidden_size} but R has shape {R.shape}")
    if W.shape != (num_dir, X.shape[2], 4 * H):
        raise KernelError(f"W has shape {W.shape}, expected {(num_dir, X.shape[2], 4 * H)}")
    if R.shape != (num_dir, H, 4 * H):
        raise KernelError(f"R has shape {R.shape}, expected {(num_dir, H, 4 * H)}")
    return H


def _f32_or_zeros(v, shape, what: str) -> np.ndarray:
    if v is None:
        return np.zeros(shape, np.float32)
    if v.shape != shape:
        raise KernelError(f"{what} has shape {v.shape}, expected {shape}")
    return v.astype(np.float32)


@op("DynamicQuantizeLSTM", domain=MS, since=1,
    inputs=["X: T", "W: T2", "R: T2", "B?: T", "sequence_lens?: T1", "initial_h?: T",
            "initial_c?: T", "P?: T", "W_scale: T", "W_zero_point: T2", "R_scale: T",
            "R_zero_point: T2"],
    outputs=["Y?: T", "Y_h?: T", "Y_c?: T"],
    types={"T": ["float32"], "T1": ["int32"], "T2": ["uint8", "int8"]},
    attrs={"activation_alpha": ("FLOATS", None), "activation_beta": ("FLOATS", None),
           "activations": ("STRINGS", None), "clip": ("FLOAT", None),
           "direction": "forward", "hidden_size": ("INT", None), "input_forget": 0},
    contract=Contract(nan="propagate", allowed={
        "direction": one_of("forward", "reverse", "bidirectional"),
        "input_forget": one_of(0, 1)}))
def DynamicQuantizeLSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                        P=None, W_scale=None, W_zero_point=None, R_scale=None,
                        R_zero_point=None, *, activation_alpha=None, activation_beta=None,
                        activations=None, clip=None, direction="forward", hidden_size=None,
                        input_forget=0):
    """LSTM (gates i|o|f|c) with int8/uint8 W [D, input, 4H] and R [D, H, 4H]; X and each
    step's hidden state are quantized to uint8 on the fly (com.microsoft DynamicQuantizeLSTM-1).

    As in ORT, the input projection quantizes X[:max(sequence_lens)] with one scale and each
    recurrent step quantizes the previous output per block of batch rows that one of ORT's
    threads steps (see lstm_batch_chunk), so results follow ORT's thread count.
    """
    return quantized_lstm(
        X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
        R_zero_point, activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        input_forget=input_forget, threads=ort_intra_threads())


def quantized_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point,
                   R_scale, R_zero_point, *, activation_alpha=None, activation_beta=None,
                   activations=None, clip=None, direction="forward", hidden_size=None,
                   input_forget=0, threads: int = 1):
    """DynamicQuantizeLSTM as ORT computes it with `threads` intra-op threads."""
    from opwarden.ops.rnn import _activation_list, _clipper, _seq_lens

    if W_scale is None or W_zero_point is None or R_scale is None or R_zero_point is None:
        raise KernelError("DynamicQuantizeLSTM needs W_scale, W_zero_point, R_scale, R_zero_point")
    num_dir = 2 if direction == "bidirectional" else 1
    H = _qlstm_shapes(X, W, R, num_dir, hidden_size)
    T, Bsz = X.shape[0], X.shape[1]
    lens = _seq_lens(sequence_lens, T, Bsz)
    quant = (_per_column(W_scale, num_dir, 4 * H, "W_scale").astype(np.float32),
             _per_column(W_zero_point, num_dir, 4 * H, "W_zero_point"),
             _per_column(R_scale, num_dir, 4 * H, "R_scale").astype(np.float32),
             _per_column(R_zero_point, num_dir, 4 * H, "R_zero_point"))
    b = _f32_or_zeros(B, (num_dir, 8 * H), "B")
    bias = b[:, :4 * H] + b[:, 4 * H:]
    p = _f32_or_zeros(P, (num_dir, 3 * H), "P")
    h0 = _f32_or_zeros(initial_h, (num_dir, Bsz, H), "initial_h")
    c0 = _f32_or_zeros(initial_c, (num_dir, Bsz, H), "initial_c")
    acts = _activation_list(activations, activation_alpha, activation_beta,
                            ["Sigmoid", "Tanh", "Tanh"], num_dir)
    chunk = lstm_batch_chunk(Bsz, H, threads)
    Y = np.zeros((T, num_dir, Bsz, H), np.float32)
    Y_h, Y_c = h0.copy(), c0.copy()
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        Y[:, d], Y_h[d], Y_c[d] = _qlstm_direction(
            X.astype(np.float32), W[d], R[d], [q[d] for q in quant], bias[d], p[d], h0[d], c0[d],
            lens, acts[d], _clipper(clip), input_forget, reverse, chunk)
    return Y, Y_h.astype(np.float32), Y_c.astype(np.float32)


def _qlstm_direction(x, w, r, quant, bias, p, h, c, lens, acts, cl, input_forget, reverse,
                     chunk):
    """One direction of quantized_lstm: (Y [T, B, H], final h, final c)."""
    from opwarden.ops.rnn import _reverse_index

    T, Bsz, H = x.shape[0], x.shape[1], r.shape[0]
    ws, wz, rs, rz = quant
    t_max = int(lens.max()) if lens.size else 0
    bidx = np.arange(Bsz)
    ridx = _reverse_index(lens, T) if reverse else None
    xd = x[ridx, bidx] if reverse else x
    # One quantization over every time step any sequence still uses.
    proj = _quant_matmul(xd[:t_max].reshape(-1, x.shape[2]), w, ws, wz)
    proj = proj.reshape(t_max, Bsz, 4 * H)
    f, g, hf = acts
    pi, po, pf = p[:H], p[H:2 * H], p[2 * H:]
    Yd = np.zeros((T, Bsz, H), np.float32)
    for t in range(t_max):
        active = (t < lens)[:, None]
        # The state quantized is last step's output row, which ORT zeroes for sequences
        # that had already ended then; it sets the range of its block's quantization scale.
        prev = h if t == 0 else np.where((t - 1 < lens)[:, None], h, 0.0)
        gates = proj[t] + _recurrent(prev.astype(np.float32), r, rs, rz, chunk) + bias
        i = f(cl(gates[:, :H] + pi * c))
        fg = 1 - i if input_forget else f(cl(gates[:, 2 * H:3 * H] + pf * c))
        c_new = fg * c + i * g(cl(gates[:, 3 * H:]))
        o = f(cl(gates[:, H:2 * H] + po * c_new))
        h_new = o * hf(c_new)
        h, c = np.where(active, h_new, h), np.where(active, c_new, c)
        Yd[t] = np.where(active, h_new, 0.0)
    return (Yd[ridx, bidx] if reverse else Yd), h, c
