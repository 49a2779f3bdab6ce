"""Operators: contrib family (domain com.microsoft, as ONNX Runtime documents them).

onnx.defs does not know these operators, so each declares its schema here. Semantics follow
ONNX Runtime's ContribOperators.md; half-precision inputs compute in float32, as ORT does.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import REGISTRY, OpDef, Sample, op
from opwarden.ops.common import broadcast_shapes, work_float
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
_SLN_SCHEMA = SimplifiedLayerNormalization.custom_schema
assert _SLN_SCHEMA is not None  # declared by @op above
REGISTRY.add(OpDef("SimplifiedLayerNormalization", "", 1, SimplifiedLayerNormalization.reference,
                   SimplifiedLayerNormalization.contract,
                   dataclasses.replace(_SLN_SCHEMA, domain="")))


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
# Shape rules and boundary samples (`opwarden check` runs every check on these)
# --------------------------------------------------------------------------------------------


def _same_as_first(x, *_, **__):
    return TensorFact(x.dtype, x.shape)


for _elementwise in (Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd):
    _elementwise.infer(_same_as_first)


def _fused_fact(shape, trans: int, trans_batch: int):
    """_fused_operand's layout flags applied to a fact shape."""
    if shape is None or len(shape) < 2:
        return shape
    s = tuple(shape)
    if trans_batch and len(s) > 2:
        s = (*s[1:-1], s[0], s[-1])
    return (*s[:-2], s[-1], s[-2]) if trans else s


@FusedMatMul.infer
def _fused_matmul_infer(a, b, *, transA=0, transB=0, transBatchA=0, transBatchB=0, **_):
    sa, sb = _fused_fact(a.shape, transA, transBatchA), _fused_fact(b.shape, transB, transBatchB)
    if sa is None or sb is None or not sa or not sb:
        return TensorFact(a.dtype, None)
    if len(sb) == 1:
        return TensorFact(a.dtype, sa[:-1])
    if len(sa) == 1:
        return TensorFact(a.dtype, (*sb[:-2], sb[-1]))
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    return TensorFact(a.dtype, None if batch is None else (*batch, sa[-2], sb[-1]))


def _stat_dtype(dt) -> str:
    return "float64" if dt is not None and np.dtype(dt) == np.float64 else "float32"


def _skip_norm_infer(x, *_, **__):
    stat = None if x.shape is None else (*x.shape[:-1], 1)
    u = _stat_dtype(x.dtype)
    return (TensorFact(x.dtype, x.shape), TensorFact(u, stat), TensorFact(u, stat),
            TensorFact(x.dtype, x.shape))


SkipLayerNormalization.infer(_skip_norm_infer)
SkipSimplifiedLayerNormalization.infer(_skip_norm_infer)


@SimplifiedLayerNormalization.infer
def _simplified_infer(x, scale, *, axis=-1, stash_type=1, **_):
    u = "float64" if stash_type == 11 else _stat_dtype(x.dtype)
    if x.shape is None:
        return TensorFact(scale.dtype, None), TensorFact(u, None)
    rank = len(x.shape)
    a = axis % rank if -rank <= axis < rank else rank
    return (TensorFact(scale.dtype, broadcast_shapes(x.shape, scale.shape)),
            TensorFact(u, (*x.shape[:a], *(1,) * (rank - a))))


@ContribAttention.infer
def _attention_infer(inp, weights, bias=None, mask=None, past=None, *_, num_heads=None,
                     qkv_hidden_sizes=None, **__):
    if inp.shape is None or weights.shape is None or len(inp.shape) != 3 or not num_heads:
        return TensorFact(inp.dtype, None), TensorFact(inp.dtype, None)
    b, s, _ = inp.shape
    width = weights.shape[-1]
    if qkv_hidden_sizes:
        qh, vh = int(qkv_hidden_sizes[0]), int(qkv_hidden_sizes[2])
    elif isinstance(width, int):
        qh = vh = width // 3
    else:
        return TensorFact(inp.dtype, None), TensorFact(inp.dtype, None)
    out = TensorFact(inp.dtype, (b, s, vh))
    if qh != vh:
        return out, TensorFact(inp.dtype, None)
    past_len = 0
    if past is not None:
        if past.shape is None or len(past.shape) != 5:
            return out, TensorFact(inp.dtype, None)
        past_len = past.shape[3]
    total = s + past_len if isinstance(s, int) and isinstance(past_len, int) else None
    return out, TensorFact(inp.dtype, (2, b, num_heads, total, qh // num_heads))


def _float_cases(rng, *shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@QuickGelu.samples
def _quick_gelu_samples(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32) * 4
    x.flat[:6] = [0.0, -0.0, 60.0, -60.0, 1e30, -1e30]  # exp(-|z|) never overflows
    for alpha in (1.702, 1.0, -0.5):
        yield Sample([x], {"alpha": alpha}, label=f"alpha {alpha}")
    yield Sample([x.clip(-60000, 60000).astype(np.float16)], label="float16")
    yield Sample([x[:0]], label="empty")


@BiasGelu.samples
def _bias_gelu_samples(rng):
    for dt in (np.float32, np.float16):
        a, b = _float_cases(rng, (2, 3, 8), (8,), dtype=dt)
        yield Sample([a, b], label=f"{np.dtype(dt).name} (2, 3, 8) + (8,)", constants=(1,))
    a, b = _float_cases(rng, (0, 8), (8,))
    yield Sample([a, b], label="empty")


@BiasAdd.samples
def _bias_add_samples(rng):
    for dt in (np.float32, np.float16):
        x, bias, skip = _float_cases(rng, (2, 3, 8), (8,), (2, 3, 8), dtype=dt)
        yield Sample([x, bias, skip], label=np.dtype(dt).name, constants=(1,))
    x, bias, skip = _float_cases(rng, (1, 1, 4), (4,), (1, 1, 4))
    yield Sample([x, bias, skip], label="one token")
    x, bias, skip = _float_cases(rng, (2, 0, 4), (4,), (2, 0, 4))
    yield Sample([x, bias, skip], label="empty")


@FusedMatMul.samples
def _fused_matmul_samples(rng):
    a, b = _float_cases(rng, (2, 3, 4), (2, 4, 5))
    yield Sample([a, b], {"alpha": 0.5}, label="batched, alpha")
    yield Sample([a.transpose(0, 2, 1).copy(), b.transpose(0, 2, 1).copy()],
                 {"transA": 1, "transB": 1}, label="transA, transB")
    yield Sample([a.transpose(1, 0, 2).copy(), b], {"transBatchA": 1}, label="transBatchA")
    yield Sample([a, b.transpose(2, 0, 1).copy()], {"transBatchB": 1, "transB": 1},
                 label="transBatchB + transB")
    a2, b2 = _float_cases(rng, (3, 4), (4,))
    yield Sample([a2, b2], label="matrix @ vector")
    yield Sample([a2.astype(np.float16), rng.standard_normal((4, 2)).astype(np.float16)],
                 label="float16")
    yield Sample([a2[:0], rng.standard_normal((4, 2)).astype(np.float32)], label="empty")


def _skip_norm_samples(rng, with_beta: bool):
    H = 8
    for dt in (np.float32, np.float16):
        x, skip, gamma, beta, bias = _float_cases(rng, (2, 3, H), (2, 3, H), (H,), (H,), (H,),
                                                  dtype=dt)
        full = [x, skip, gamma, beta, bias] if with_beta else [x, skip, gamma, bias]
        yield Sample(full, noutputs=4, label=f"{np.dtype(dt).name} every input and output",
                     constants=tuple(range(2, len(full))))
    x, skip, gamma = _float_cases(rng, (2, 3, H), (3, H), (H,))
    yield Sample([x, skip, gamma], {"epsilon": 1e-5}, label="2-D skip broadcast over batch")
    x, skip, gamma = _float_cases(rng, (4, H), (4, H), (H,))
    yield Sample([x, skip, gamma], noutputs=2, label="2-D input")
    x, skip, gamma = _float_cases(rng, (0, 2, H), (0, 2, H), (H,))
    yield Sample([x, skip, gamma], label="empty")


SkipLayerNormalization.samples(lambda rng: _skip_norm_samples(rng, True))
SkipSimplifiedLayerNormalization.samples(lambda rng: _skip_norm_samples(rng, False))


@ContribAttention.samples
def _attention_samples(rng):
    B, S, H, N = 2, 4, 8, 2
    x, w, bias = _float_cases(rng, (B, S, H), (H, 3 * H), (3 * H,))
    heads = {"num_heads": N}
    yield Sample([x, w, bias], heads, label="no mask", constants=(1, 2))
    yield Sample([x, w, bias, np.array([4, 2], np.int32)], heads,
                 label="1-D mask_index (key lengths)")
    yield Sample([x, w, bias, np.array([[1, 1, 1, 0], [1, 0, 1, 1]], np.int32)], heads,
                 label="2-D raw mask")
    past = rng.standard_normal((2, B, N, 3, H // N)).astype(np.float32)
    yield Sample([x, w, bias, None, past], {**heads, "unidirectional": 1}, noutputs=2,
                 label="unidirectional with past")
    yield Sample([x, rng.standard_normal((H, 2 * H)).astype(np.float32)],
                 {**heads, "qkv_hidden_sizes": [H // 2, H // 2, H], "scale": 0.3},
                 label="qkv_hidden_sizes, scale")
    yield Sample([x.astype(np.float16), w.astype(np.float16), bias.astype(np.float16)], heads,
                 label="float16")
