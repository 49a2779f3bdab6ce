"""Operators: com.microsoft embedding and fused-MLP pieces (EmbedLayerNormalization,
RotaryEmbedding, GemmFastGelu, BiasSplitGelu).

EmbedLayerNormalization is what ONNX Runtime's transformer optimizer fuses every BERT embedding
into; the others come from its LLM and diffusion exporters. Semantics follow ContribOperators.md
and ORT's CPU kernels (float16 computes in float32); com.microsoft RotaryEmbedding is the ONNX
RotaryEmbedding-23 math (ops.transformer) with ORT's position_ids forms.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import normal
from opwarden.ops.contrib import _check_bias, _compute, _fast_gelu, _gelu
from opwarden.ops.transformer import RotaryEmbedding as OnnxRotaryEmbedding

MS = "com.microsoft"


# --------------------------------------------------------------------------------------------
# EmbedLayerNormalization
# --------------------------------------------------------------------------------------------


def _lookup(table: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    """table[ids] in float32, refusing ids outside the table (ORT: 'index out of range')."""
    if table.ndim != 2:
        raise KernelError(f"{what} must be 2-D (rows, hidden), got shape {table.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise KernelError(f"{what}: index {int(ids.min() if ids.min() < 0 else ids.max())} "
                          f"out of range [0, {table.shape[0]})")
    return _compute(table)[ids]


def _embed_position_ids(position_ids, batch: int, seq: int) -> np.ndarray:
    if position_ids is None:
        return np.broadcast_to(np.arange(seq), (batch, seq))
    pid = np.asarray(position_ids)
    if pid.shape not in ((batch, seq), (1, seq)):
        raise KernelError(f"position_ids must be ({batch}, {seq}) or (1, {seq}), got {pid.shape}")
    return np.broadcast_to(pid, (batch, seq))


@op("EmbedLayerNormalization", domain=MS, since=1,
    inputs=["input_ids: T1", "segment_ids?: T1", "word_embedding: T", "position_embedding: T",
            "segment_embedding?: T", "gamma: T", "beta: T", "mask?: T1", "position_ids?: T1"],
    outputs=["output: T", "mask_index?: T1", "embedding_sum?: T"],
    types={"T1": ["int32"], "T": ["float32", "float16"]},
    attrs={"epsilon": 1e-12, "mask_index_type": 1},
    contract=Contract(nan="propagate", allowed={"mask_index_type": one_of(0, 1)}))
def EmbedLayerNormalization(input_ids, segment_ids=None, word_embedding=None,
                            position_embedding=None, segment_embedding=None, gamma=None,
                            beta=None, mask=None, position_ids=None, *, epsilon=1e-12,
                            mask_index_type=1):
    """LayerNorm(word[ids] + position[pos] + segment[seg]) * gamma + beta; mask_index counts
    each row's 1s in `mask` (zeros without a mask) (com.microsoft EmbedLayerNormalization-1)."""
    if word_embedding is None or position_embedding is None or gamma is None or beta is None:
        raise KernelError("EmbedLayerNormalization needs word/position embeddings, gamma, beta")
    if input_ids.ndim != 2:
        raise KernelError(f"input_ids must be 2-D (batch, sequence), got {input_ids.shape}")
    batch, seq = input_ids.shape
    hidden = word_embedding.shape[-1]
    for name, t in (("position_embedding", position_embedding),
                    ("segment_embedding", segment_embedding)):
        if t is not None and (t.ndim != 2 or t.shape[1] != hidden):
            raise KernelError(f"{name} must be (rows, {hidden}), got shape {t.shape}")
    if (segment_ids is None) != (segment_embedding is None):
        raise KernelError("segment_ids and segment_embedding must be given together")
    s = _lookup(word_embedding, input_ids, "word_embedding")
    pos = _embed_position_ids(position_ids, batch, seq)
    s = s + _lookup(position_embedding, pos, "position_embedding")
    if segment_ids is not None:
        if segment_ids.shape != input_ids.shape:
            raise KernelError(f"segment_ids shape {segment_ids.shape} != input_ids "
                              f"{input_ids.shape}")
        s = s + _lookup(segment_embedding, segment_ids, "segment_embedding")
    _check_bias(gamma, s, "gamma")
    _check_bias(beta, s, "beta")
    mean = s.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(s - mean), axis=-1, keepdims=True)
    y = (s - mean) / np.sqrt(var + np.float32(epsilon)) * _compute(gamma) + _compute(beta)
    if mask is not None:
        if mask.shape != input_ids.shape:
            raise KernelError(f"mask shape {mask.shape} != input_ids shape {input_ids.shape}")
        mask_index = np.count_nonzero(mask == 1, axis=1).astype(np.int32)
    else:
        mask_index = np.zeros((batch,), np.int32)
    dt = word_embedding.dtype
    return y.astype(dt), mask_index, s.astype(dt)


@EmbedLayerNormalization.infer
def _embed_infer(ids, seg=None, word=None, *_, **__):
    dt = word.dtype if word is not None else None
    hidden = word.shape[1] if word is not None and word.shape is not None else None
    if ids.shape is None:
        return TensorFact(dt, None), TensorFact("int32", None), TensorFact(dt, None)
    b, s = ids.shape
    y = TensorFact(dt, (b, s, hidden))
    return y, TensorFact("int32", (b,)), y


@EmbedLayerNormalization.samples
def _embed_samples(rng):
    r = normal(rng)
    B, S, H, V = 2, 5, 8, 11
    i32 = np.int32
    ids = rng.integers(0, V, (B, S)).astype(i32)
    seg = rng.integers(0, 2, (B, S)).astype(i32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], i32)
    w = [r(V, H), r(S + 2, H)]
    yield Sample([ids, seg, w[0], w[1], r(2, H), r(H), r(H), mask], noutputs=3,
                 label="BERT: segments, mask, embedding sum", constants=(2, 3, 4, 5, 6))
    yield Sample([ids, None, w[0], w[1], None, r(H), r(H)], noutputs=2,
                 label="no segments, no mask", constants=(2, 3, 5, 6))
    yield Sample([ids, seg, w[0], w[1], r(2, H), r(H), r(H), None,
                  np.array([[4, 3, 2, 1, 0]], i32)], {"epsilon": 1e-5}, noutputs=3,
                 label="(1, S) position_ids")
    yield Sample([ids[:1, :1], None, w[0], w[1], None, r(H), r(H)], noutputs=1,
                 label="one token")
    h = np.float16
    yield Sample([ids, seg, w[0].astype(h), w[1].astype(h), r(2, H).astype(h),
                  r(H).astype(h), r(H).astype(h), mask], noutputs=3, label="float16")


# --------------------------------------------------------------------------------------------
# RotaryEmbedding (com.microsoft)
# --------------------------------------------------------------------------------------------


@op("RotaryEmbedding", domain=MS, since=1,
    inputs=["input: T", "position_ids: M", "cos_cache: T", "sin_cache: T"],
    outputs=["output: T"],
    types={"T": ["float32", "float16", "bfloat16"], "M": ["int64"]},
    attrs={"num_heads": 0, "rotary_embedding_dim": 0, "interleaved": 0,
           "is_packed_batching": 0, "scale": 1.0},
    contract=Contract(nan="propagate", allowed={
        "interleaved": one_of(0, 1), "is_packed_batching": one_of(0, 1)}))
def MsRotaryEmbedding(input, position_ids, cos_cache, sin_cache, *, num_heads=0,
                      rotary_embedding_dim=0, interleaved=0, is_packed_batching=0, scale=1.0):
    """RoPE on (B, S, N*H) or (B, N, S, H); position_ids (1,) is a start position for every
    row, (B, S) one per token (com.microsoft RotaryEmbedding-1; ORT's CPU kernel ignores
    `scale`)."""
    if input.ndim not in (3, 4):
        raise KernelError(f"input must be 3-D or 4-D, got shape {input.shape}")
    if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
        raise KernelError(f"cos_cache/sin_cache must be 2-D and alike, got {cos_cache.shape}, "
                          f"{sin_cache.shape}")
    batch, seq = input.shape[0], input.shape[1 if input.ndim == 3 else 2]
    pid = np.asarray(position_ids).astype(np.int64)
    if pid.size == 1:
        pid = np.broadcast_to(pid.reshape(-1)[0] + np.arange(seq), (batch, seq))
    elif pid.shape != (batch, seq):
        raise KernelError(f"position_ids must be (1,) or ({batch}, {seq}), got {pid.shape}")
    rot = int(rotary_embedding_dim)
    heads = int(num_heads)
    if input.ndim == 3 and not heads:
        if rot:
            raise KernelError("rotary_embedding_dim needs the num_heads attribute")
        head = 2 * cos_cache.shape[1]
        if head == 0 or input.shape[2] % head:
            raise KernelError(f"hidden size {input.shape[2]} is not a multiple of the head size "
                              f"{head} that cos_cache gives")
        heads = input.shape[2] // head
    # The caches' rows are bounded here so the error names this operator's inputs.
    if pid.size and (pid.min() < 0 or pid.max() >= cos_cache.shape[0]):
        raise KernelError(f"position_ids reach {int(pid.max())}, outside the "
                          f"{cos_cache.shape[0]} rows of cos_cache")
    y = OnnxRotaryEmbedding(_compute(input), _compute(cos_cache), _compute(sin_cache), pid,
                            interleaved=interleaved, num_heads=heads or None,
                            rotary_embedding_dim=rot)
    return y.astype(input.dtype)


@MsRotaryEmbedding.infer
def _ms_rotary_infer(x, *_, **__):
    return TensorFact(x.dtype, x.shape)


@MsRotaryEmbedding.samples
def _ms_rotary_samples(rng):
    r = normal(rng)
    B, S, N, H = 2, 3, 2, 8
    cos, sin = r(16, H // 2), r(16, H // 2)
    start = np.array([2], np.int64)
    yield Sample([r(B, S, N * H), start, cos, sin], label="3-D, start position",
                 constants=(2, 3))
    yield Sample([r(B, N, S, H), rng.integers(0, 16, (B, S)).astype(np.int64), cos, sin],
                 {"interleaved": 1}, label="4-D (B, N, S, H), per-token positions, interleaved")
    yield Sample([r(B, S, N * H), start, cos[:, :2], sin[:, :2]],
                 {"num_heads": N, "rotary_embedding_dim": 4}, label="partial rotation")
    yield Sample([r(1, 1, H), np.array([15], np.int64), cos, sin], label="last cache row")
    h = np.float16
    yield Sample([r(B, S, N * H).astype(h), start, cos.astype(h), sin.astype(h)],
                 label="float16")


# --------------------------------------------------------------------------------------------
# GemmFastGelu, BiasSplitGelu
# --------------------------------------------------------------------------------------------


@op("GemmFastGelu", domain=MS, since=1, inputs=["X: T", "W: T", "bias?: T"],
    outputs=["Y: T"], types={"T": ["float32", "float16", "bfloat16"]},
    contract=Contract(nan="propagate"))
def GemmFastGelu(X, W, bias=None):
    """FastGelu(X @ W + bias), MatMul batching (com.microsoft GemmFastGelu-1)."""
    if X.ndim < 1 or W.ndim != 2:
        raise KernelError(f"GemmFastGelu needs W 2-D (K, N), got X {X.shape}, W {W.shape}")
    if X.shape[-1] != W.shape[0]:
        raise KernelError(f"X's last dimension {X.shape[-1]} != W's rows {W.shape[0]}")
    y = _compute(X) @ _compute(W)
    if bias is not None:
        _check_bias(bias, y, "GemmFastGelu bias")
        y = y + _compute(bias)
    return _fast_gelu(y).astype(X.dtype)


@GemmFastGelu.infer
def _gemm_fast_gelu_infer(x, w, *_):
    if x.shape is None or w.shape is None:
        return TensorFact(x.dtype, None)
    return TensorFact(x.dtype, (*x.shape[:-1], w.shape[-1]))


@GemmFastGelu.samples
def _gemm_fast_gelu_samples(rng):
    r = normal(rng)
    yield Sample([r(2, 3, 8), r(8, 6), r(6)], label="3-D X, bias", constants=(1, 2))
    yield Sample([r(4, 8), r(8, 5)], label="2-D, no bias", constants=(1,))
    yield Sample([r(0, 8), r(8, 5), r(5)], label="no rows")
    yield Sample([r(3, 16).astype(np.float16), r(16, 4).astype(np.float16),
                  r(4).astype(np.float16)], label="float16")


@op("BiasSplitGelu", domain=MS, since=1, inputs=["X: T", "bias: T"], outputs=["Y: T"],
    types={"T": ["float32", "float16"]}, contract=Contract(nan="propagate"))
def BiasSplitGelu(X, bias):
    """(X + bias) split in halves on the last axis: left * Gelu(right), erf GELU
    (com.microsoft BiasSplitGelu-1)."""
    if X.ndim != 3:
        raise KernelError(f"BiasSplitGelu input must be 3-D (N, S, D), got shape {X.shape}")
    _check_bias(bias, X, "BiasSplitGelu bias")
    d = X.shape[-1]
    if d % 2:
        raise KernelError(f"BiasSplitGelu hidden size {d} must be even")
    x = _compute(X) + _compute(bias)
    return (x[..., : d // 2] * _gelu(x[..., d // 2:])).astype(X.dtype)


@BiasSplitGelu.infer
def _bias_split_gelu_infer(x, *_):
    if x.shape is None:
        return TensorFact(x.dtype, None)
    d = x.shape[-1]
    return TensorFact(x.dtype, (*x.shape[:-1], d // 2 if isinstance(d, int) else None))


@BiasSplitGelu.samples
def _bias_split_gelu_samples(rng):
    r = normal(rng)
    yield Sample([r(2, 4, 10), r(10)], label="(2, 4, 10)", constants=(1,))
    yield Sample([r(1, 1, 2), r(2)], label="one pair")
    yield Sample([r(1, 0, 6), r(6)], label="no positions")
    yield Sample([r(2, 3, 8).astype(np.float16), r(8).astype(np.float16)], label="float16")
