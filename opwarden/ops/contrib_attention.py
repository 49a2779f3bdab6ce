"""Operators: com.microsoft attention (MultiHeadAttention, GroupQueryAttention).

What ONNX Runtime's transformer optimizer and its LLM exporters emit for encoders and decoders.
Semantics follow ONNX Runtime's ContribOperators.md and its CPU kernels: float16/bfloat16 compute
in float32; MultiHeadAttention masks by adding `mask_filter_value` (so a fully masked row is a
softmax over the raw scores, as in ORT); GroupQueryAttention masks by exclusion (masked keys get
probability 0) and writes its KV cache into a present buffer of max(past buffer, total) rows.
"""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import normal
from opwarden.ops.contrib import _mask_from_index

MS = "com.microsoft"
HALF_OR_FLOAT = ["float32", "float16", "bfloat16"]


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _bnsh(x: np.ndarray, heads: int, what: str) -> np.ndarray:
    """(B, S, N*H) -> (B, N, S, H)."""
    if x.ndim != 3:
        raise KernelError(f"{what} must be 3-D (batch, sequence, hidden), got shape {x.shape}")
    b, s, hidden = x.shape
    if hidden % heads:
        raise KernelError(f"{what} hidden size {hidden} is not a multiple of {heads} heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _merge(y: np.ndarray) -> np.ndarray:
    """(B, N, S, H) -> (B, S, N*H)."""
    b, n, s, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _given(fact) -> bool:
    """Whether a shape rule's input fact stands for a present input (the harness passes an
    empty fact for an omitted one, a session None)."""
    return fact is not None and (fact.dtype is not None or fact.shape is not None)


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# MultiHeadAttention
# --------------------------------------------------------------------------------------------


def _mha_qkv(query, key, value, bias, heads: int):
    """(q, k, v, kv_is_projected) in (B, N, S, H) compute dtype from the input forms ORT
    documents: separate 3-D Q/K/V, packed QKV (B, S, N, 3, H), packed KV (B, L, N, 2, H),
    or K/V already in (B, N, L, H) (cross attention over cached keys: no bias added to them)."""
    q3 = query
    if query.ndim == 5:
        if key is not None or value is not None:
            raise KernelError("packed QKV query (B, S, N, 3, H) takes no key or value input")
        if query.shape[2] != heads or query.shape[3] != 3:
            raise KernelError(f"packed QKV must be (B, S, {heads}, 3, H), got {query.shape}")
        b, s, n, _, h = query.shape
        q3, key, value = (query[:, :, :, i].reshape(b, s, n * h) for i in range(3))
    elif query.ndim != 3:
        raise KernelError(f"query must be 3-D or packed 5-D, got shape {query.shape}")
    if key is None:
        raise KernelError("MultiHeadAttention needs key (or a packed QKV query)")
    if key.ndim == 5:
        if value is not None:
            raise KernelError("packed KV key (B, L, N, 2, H) takes no value input")
        if key.shape[2] != heads or key.shape[3] != 2:
            raise KernelError(f"packed KV must be (B, L, {heads}, 2, H), got {key.shape}")
        b, L, n, _, h = key.shape
        key, value = (key[:, :, :, i].reshape(b, L, n * h) for i in range(2))
    if value is None:
        raise KernelError("MultiHeadAttention needs value when key is not packed KV")
    d = q3.shape[-1]
    q = _f32(q3)
    projected = key.ndim == 4
    if bias is not None:
        dv = value.shape[-1] * (value.shape[1] if value.ndim == 4 else 1)
        if bias.shape != (2 * d + dv,):
            raise KernelError(f"bias must be 1-D of length {2 * d + dv}, got shape {bias.shape}")
        bias = _f32(bias)
        q = q + bias[:d]
    if projected:
        if key.shape[1] != heads or value.ndim != 4 or value.shape[:3] != key.shape[:3]:
            raise KernelError(
                f"4-D key/value must both be (B, {heads}, L, H), got {key.shape}, {value.shape}")
        return _bnsh(q, heads, "query"), _f32(key), _f32(value), True
    if key.ndim != 3 or value.ndim != 3:
        raise KernelError(f"key/value must be 3-D, got shapes {key.shape}, {value.shape}")
    k, v = _f32(key), _f32(value)
    if bias is not None:
        k, v = k + bias[d:2 * d], v + bias[2 * d:]
    return _bnsh(q, heads, "query"), _bnsh(k, heads, "key"), _bnsh(v, heads, "value"), False


def _mha_mask(mask: np.ndarray, batch: int, seq: int, kv_len: int, total: int,
              filt: float) -> np.ndarray:
    """key_padding_mask as an additive (B, S, total) bias (0 or mask_filter_value)."""
    m = np.asarray(mask)
    if m.ndim == 1 and m.shape[0] == 3 * batch + 2:
        m = m[:batch]  # key lengths, then the query and key cumulative lengths (unused here)
    if m.ndim == 2 and m.shape == (batch, kv_len) and kv_len != total:
        raise KernelError(
            f"key_padding_mask (B, kv_sequence_length) = {m.shape} cannot mask {total} keys "
            "with a past; give (B, total_sequence_length)")
    if m.ndim not in (1, 2, 3):
        raise KernelError(f"key_padding_mask must be 1-D, 2-D or 3-D, got shape {m.shape}")
    if m.ndim == 1 and m.shape[0] != batch:
        raise KernelError(
            f"1-D key_padding_mask must have {batch} or {3 * batch + 2} entries, got {m.shape[0]}")
    return _mask_from_index(m, batch, seq, total - kv_len, total, filt)


def _mha_workspace(query, *rest, **attrs) -> int:
    """float32 copies of Q/K/V and one (B, N, S, L) score matrix, counted generously."""
    n = max(int(np.prod(query)), 1)
    key = rest[0] if rest and rest[0] else query
    kv = max(int(np.prod(key)), 1)
    heads = attrs.get("num_heads") or 1
    b, s = query[0], query[1]
    L = key[1] if len(key) in (3, 5) else key[2]
    past = rest[5] if len(rest) > 5 and rest[5] else None
    total = L + (past[2] if past else 0)
    return int(8 * (2 * n + 4 * kv + 3 * b * heads * s * total))


@op("MultiHeadAttention", domain=MS, since=1,
    inputs=["query: T", "key?: T", "value?: T", "bias?: T", "key_padding_mask?: M",
            "attention_bias?: T", "past_key?: T", "past_value?: T",
            "past_sequence_length?: M", "cache_indirection?: M"],
    outputs=["output: T", "present_key?: T", "present_value?: T", "qk?: QK"],
    types={"T": HALF_OR_FLOAT, "QK": HALF_OR_FLOAT, "M": ["int32"]},
    attrs={"num_heads": "INT", "scale": 0.0, "mask_filter_value": -10000.0,
           "unidirectional": 0},
    contract=Contract(nan="propagate", workspace_bytes=_mha_workspace, allowed={
        "unidirectional": one_of(0, 1),
        "num_heads": such_that(lambda n: int(n) > 0, "a positive integer")}))
def MultiHeadAttention(query, key=None, value=None, bias=None, key_padding_mask=None,
                       attention_bias=None, past_key=None, past_value=None,
                       past_sequence_length=None, cache_indirection=None, *, num_heads,
                       scale=0.0, mask_filter_value=-10000.0, unidirectional=0):
    """Multi-head self/cross attention with the projection bias, key padding mask, attention
    bias and a past/present KV cache (com.microsoft MultiHeadAttention-1)."""
    if past_sequence_length is not None or cache_indirection is not None:
        raise KernelError(
            "MultiHeadAttention: past_sequence_length / cache_indirection (shared KV buffer, "
            "beam search) are not supported; pass past_key/past_value of the past length")
    heads = int(num_heads)
    q, k, v, projected = _mha_qkv(query, key, value, bias, heads)
    batch, _, seq, head = q.shape
    if k.shape[0] != batch or k.shape[-1] != head:
        raise KernelError(f"key heads {k.shape} do not match query heads {q.shape}")
    if (past_key is None) != (past_value is None):
        raise KernelError("past_key and past_value must be given together")
    kv_len = k.shape[2]
    if past_key is not None:
        if projected:
            raise KernelError("past_key/past_value cannot be used with 4-D (B, N, L, H) key")
        want = (batch, heads, past_key.shape[2], head)
        if past_key.shape != want or past_value.shape[:3] != want[:3]:
            raise KernelError(f"past_key/past_value must be {want}, got "
                              f"{past_key.shape}, {past_value.shape}")
        k = np.concatenate([_f32(past_key), k], axis=2)
        v = np.concatenate([_f32(past_value), v], axis=2)
    total = k.shape[2]
    alpha = float(scale) if scale else 1.0 / math.sqrt(head)
    qk = (q @ np.swapaxes(k, -1, -2)) * np.float32(alpha)
    filt = float(mask_filter_value)
    if key_padding_mask is not None:
        qk = qk + _mha_mask(key_padding_mask, batch, seq, kv_len, total, filt)[:, None]
    if unidirectional:
        # Query i sees keys up to i + past length (top-left aligned, as ORT's CPU kernel).
        future = np.arange(total)[None, :] > np.arange(seq)[:, None] + (total - kv_len)
        qk = qk + np.where(future, filt, 0.0).astype(qk.dtype)
    if attention_bias is not None:
        ab = attention_bias
        if ab.ndim != 4 or ab.shape[2:] != (seq, total) or ab.shape[0] not in (1, batch) \
                or ab.shape[1] not in (1, heads):
            raise KernelError(f"attention_bias must be (B or 1, N or 1, {seq}, {total}), "
                              f"got {ab.shape}")
        qk = qk + _f32(ab)
    y = _merge(_softmax(qk) @ v).astype(query.dtype)
    dt = query.dtype
    return y, k.astype(dt), v.astype(dt), qk.astype(dt)


@MultiHeadAttention.infer
def _mha_infer(query, key=None, value=None, bias=None, mask=None, ab=None, past_key=None,
               past_value=None, *_, num_heads=1, **__):
    dt = query.dtype
    if query.shape is None:
        return TensorFact(dt, None)
    key, value, past_key = (f if _given(f) else None for f in (key, value, past_key))
    b, s = query.shape[0], query.shape[1]
    heads = int(num_heads)
    if query.ndim == 5:
        h = query.shape[4]
        d = dv = heads * h if isinstance(h, int) else None
        kv_len = s
    else:
        d = query.shape[2]
        h = d // heads if isinstance(d, int) else None
        kv_len, dv = None, None
        if key is not None and key.shape is not None:
            kv_len = key.shape[2] if key.ndim == 4 else key.shape[1]
            dv = d if key.ndim == 5 else None
        if value is not None and value.shape is not None:
            dv = (value.shape[2] if value.ndim == 3 else
                  value.shape[1] * value.shape[3] if all(
                      isinstance(x, int) for x in value.shape) else None)
    total = kv_len
    if past_key is not None and past_key.shape is not None and isinstance(kv_len, int) \
            and isinstance(past_key.shape[2], int):
        total = kv_len + past_key.shape[2]
    elif past_key is not None:
        total = None
    hv = dv // heads if isinstance(dv, int) else None
    return (TensorFact(dt, (b, s, dv)), TensorFact(dt, (b, heads, total, h)),
            TensorFact(dt, (b, heads, total, hv)), TensorFact(dt, (b, heads, s, total)))


@MultiHeadAttention.samples
def _mha_samples(rng):
    r = normal(rng)
    B, S, L, N, H = 2, 3, 5, 2, 4
    D = N * H
    i32 = np.int32
    a = {"num_heads": N}
    yield Sample([r(B, S, D), r(B, L, D), r(B, L, D)], a, noutputs=1, label="cross, 3-D")
    yield Sample([r(B, S, D), r(B, S, D), r(B, S, D), r(3 * D)], {**a, "unidirectional": 1},
                 noutputs=1, label="self, bias, causal")
    yield Sample([r(B, S, D), r(B, L, D), r(B, L, D), None, np.array([5, 2], i32)],
                 {**a, "scale": 0.3}, noutputs=1, label="1-D key lengths, scale")
    mask = (rng.random((B, L)) > 0.3).astype(i32)
    yield Sample([r(B, S, D), r(B, L, D), r(B, L, D), r(3 * D), mask, r(1, N, S, L)], a,
                 noutputs=1, label="2-D padding mask, attention bias")
    yield Sample([r(B, S, D), r(B, S, D), r(B, S, D), None, None, None, r(B, N, 4, H),
                  r(B, N, 4, H)], {**a, "unidirectional": 1}, noutputs=3,
                 label="past/present, causal")
    yield Sample([r(B, S, D), r(B, N, L, H), r(B, N, L, H), r(3 * D)], a, noutputs=1,
                 label="4-D projected key/value")
    yield Sample([r(B, S, N, 3, H)], a, noutputs=1, label="packed QKV")
    yield Sample([r(B, S, D), r(B, L, N, 2, H)], a, noutputs=1, label="packed KV")
    yield Sample([r(1, 1, D), r(1, 1, D), r(1, 1, D)], a, noutputs=1, label="one token")
    yield Sample([r(B, S, D).astype(np.float16), r(B, L, D).astype(np.float16),
                  r(B, L, D).astype(np.float16)], a, noutputs=1, label="float16")


# --------------------------------------------------------------------------------------------
# GroupQueryAttention
# --------------------------------------------------------------------------------------------


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: int) -> np.ndarray:
    """RoPE on (B, N, S, H) rows: cos/sin (B, S, R/2) per row, the first R = 2*(R/2) of H
    rotated as half-split (x1 = [:R/2], x2 = [R/2:R]) or interleaved (even, odd) pairs."""
    half = cos.shape[-1]
    rot = 2 * half
    if rot > x.shape[-1]:
        raise KernelError(f"rotary dimension {rot} exceeds head size {x.shape[-1]}")
    c, s = cos[:, None], sin[:, None]
    part = x[..., :rot]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half],
                                                                     part[..., half:])
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    if interleaved:
        out = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        out = np.concatenate([real, imag], axis=-1)
    return np.concatenate([out, x[..., rot:]], axis=-1)


def _gqa_split(query, key, value, heads: int, kv_heads: int):
    """(q, k, v) as (B, N, S, H) float32 from separate or packed (B, S, (N+2Nkv)*H) inputs."""
    if query.ndim != 3:
        raise KernelError(f"query must be 3-D (B, S, hidden), got shape {query.shape}")
    if key is None and value is None:
        d = query.shape[-1]
        if d % (heads + 2 * kv_heads):
            raise KernelError(f"packed QKV width {d} is not (num_heads + 2*kv_num_heads) * "
                              f"head_size with {heads} + 2*{kv_heads} heads")
        h = d // (heads + 2 * kv_heads)
        q3, key, value = (query[..., : heads * h], query[..., heads * h:(heads + kv_heads) * h],
                          query[..., (heads + kv_heads) * h:])
    elif key is None or value is None:
        raise KernelError("GroupQueryAttention needs both key and value, or neither (packed)")
    else:
        q3 = query
    q = _bnsh(_f32(q3), heads, "query")
    k = _bnsh(_f32(key), kv_heads, "key")
    v = _bnsh(_f32(value), kv_heads, "value")
    if k.shape[-1] != q.shape[-1] or v.shape != k.shape or k.shape[2] != q.shape[2]:
        raise KernelError(f"key/value heads {k.shape}, {v.shape} do not match query {q.shape} "
                          "(same head size and sequence length)")
    return q, k, v


def _gqa_lengths(seqlens_k, total_sequence_length, query_seqlens, batch, seq, past_buf):
    """(present rows, per-batch totals T, valid new rows Q, past rows P = T - Q)."""
    if seqlens_k is None or total_sequence_length is None:
        raise KernelError("GroupQueryAttention needs seqlens_k and total_sequence_length")
    sk = np.asarray(seqlens_k).reshape(-1).astype(np.int64)
    if sk.shape[0] != batch:
        raise KernelError(f"seqlens_k must have {batch} entries, got shape {seqlens_k.shape}")
    ts = np.asarray(total_sequence_length)
    if ts.size != 1:
        raise KernelError(f"total_sequence_length must be a scalar, got shape {ts.shape}")
    present = max(past_buf, int(ts.reshape(-1)[0]))
    t = sk + 1
    if (t < 1).any() or (t > present).any():
        raise KernelError(f"seqlens_k + 1 = {t.tolist()} must lie in [1, {present}]")
    if query_seqlens is None:
        q = np.minimum(t, seq)
    else:
        q = np.asarray(query_seqlens).reshape(-1).astype(np.int64)
        if q.shape[0] != batch or (q < 0).any() or (q > np.minimum(t, seq)).any():
            raise KernelError(f"query_seqlens {q.tolist()} must lie in [0, min(S, T)]")
    p = t - q
    if (p > past_buf).any():
        raise KernelError(f"past_key holds {past_buf} rows, but seqlens_k needs {p.tolist()} "
                          "cached rows before this step")
    return present, t, q, p


def _gqa_rotary(q, k, cos_cache, sin_cache, position_ids, p, interleaved, first_prompt):
    """q and the new k rotated at their absolute positions: position_ids (in a first prompt
    ORT reads only position_ids[0, 0], the start of every row), else P_b + s."""
    if cos_cache is None or sin_cache is None:
        raise KernelError("do_rotary=1 needs cos_cache and sin_cache")
    if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
        raise KernelError(f"cos_cache/sin_cache must be 2-D and alike, got {cos_cache.shape}, "
                          f"{sin_cache.shape}")
    batch, _, seq, _ = q.shape
    if position_ids is not None:
        pos = np.asarray(position_ids).astype(np.int64)
        if first_prompt and pos.size:
            pos = np.broadcast_to(pos.reshape(-1)[0] + np.arange(seq), (batch, seq))
        elif pos.shape != (batch, seq):
            pos = np.broadcast_to(pos.reshape(-1)[:1, None] + np.arange(seq), (batch, seq)) \
                if pos.size == 1 else None
        if pos is None:
            raise KernelError(f"position_ids must be ({batch}, {seq}), got {position_ids.shape}")
    else:
        pos = p[:, None] + np.arange(seq)[None, :]
    if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
        raise KernelError(f"rotary positions {pos.min()}..{pos.max()} outside the "
                          f"{cos_cache.shape[0]} rows of cos_cache")
    cos, sin = _f32(cos_cache)[pos], _f32(sin_cache)[pos]
    return rotate(q, cos, sin, interleaved), rotate(k, cos, sin, interleaved)


def _gqa_present(past, new, present_len, p, q, full_rows):
    """The present cache: past rows [0, P_b), then the new rows at [P_b, P_b + n); zeros
    elsewhere. n is S (ORT copies every row of the chunk) or Q_b with query_seqlens."""
    batch, kvh, seq, head = new.shape
    out = np.zeros((batch, kvh, present_len, head), new.dtype)
    for b in range(batch):
        pb = int(p[b])
        if pb:
            out[b, :, :pb] = past[b, :, :pb]
        n = min(seq if full_rows else int(q[b]), present_len - pb)
        out[b, :, pb:pb + n] = new[b, :, :n]
    return out


def _gqa_keep(batch, seq, present_len, t, p, causal, window):
    """(B, 1, S, present) keys each query row may read."""
    j = np.arange(present_len)[None, None, :]
    pos = (p[:, None] + np.arange(seq)[None, :])[:, :, None]
    # Rows past T_b (a right-padded prompt) read the T_b valid keys only, as ORT does.
    last = np.minimum(pos, t[:, None, None] - 1) if causal else t[:, None, None] - 1
    keep = np.broadcast_to(j <= last, (batch, seq, present_len))
    if window is not None and window > 0:
        keep = keep & (j > pos - window)  # the window holds `window` keys, the query's own last
    return keep[:, None]


def _gqa_softmax(scores, keep, sink):
    """Softmax over the kept keys (others 0); `sink` (N,) or 0.0 joins each row's
    denominator as one more logit (smooth softmax / head_sink)."""
    s = np.where(keep, scores, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.where(keep, np.exp(s - m), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        den = den + np.exp(sink - m)
    # A row with no key left reads nothing (0); NaN scores stay NaN.
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den == 0, 0.0, e / np.where(den == 0, 1.0, den)).astype(scores.dtype)


def _gqa_unsupported(k_scale, v_scale, q_norm_weight, k_norm_weight, past_key):
    if k_scale is not None or v_scale is not None or (
            past_key is not None and past_key.dtype.kind in "iu"):
        raise KernelError("GroupQueryAttention: quantized KV caches (k_scale/v_scale, int8/"
                          "uint8 past) are not supported")
    if q_norm_weight is not None or k_norm_weight is not None:
        raise KernelError("GroupQueryAttention: q_norm_weight/k_norm_weight are not supported "
                          "(ONNX Runtime's CPU kernel rejects them too)")


def _gqa_workspace(query, *rest, **attrs) -> int:
    """float32 Q/K/V, the present cache copies, the score matrix, counted generously."""
    b, s = query[0], query[1]
    heads = attrs.get("num_heads") or 1
    past = rest[2] if len(rest) > 2 and rest[2] else None
    total = s + (past[2] if past else 0)
    kv = 2 * b * (attrs.get("kv_num_heads") or 1) * total * max(query[2] // heads, 1)
    return int(8 * (3 * b * s * query[2] + 4 * kv + 4 * b * heads * s * total))


_GQA_ATTRS = {
    "num_heads": "INT", "kv_num_heads": "INT", "scale": 0.0, "softcap": 0.0, "do_rotary": 0,
    "rotary_interleaved": 0, "local_window_size": -1, "smooth_softmax": -1, "qk_output": 0,
    "causal": 1, "sliding_window_cache": 0, "k_quant_type": "NONE", "v_quant_type": "NONE",
    "kv_cache_bit_width": 0, "qk_norm_epsilon": 1e-6, "q_norm_epsilon": ("FLOAT", None),
    "k_norm_epsilon": ("FLOAT", None)}


@op("GroupQueryAttention", domain=MS, since=1,
    inputs=["query: T", "key?: T", "value?: T", "past_key?: T_CACHE", "past_value?: T_CACHE",
            "seqlens_k: M", "total_sequence_length: M", "cos_cache?: T", "sin_cache?: T",
            "position_ids?: tensor(int64)", "attention_bias?: T", "head_sink?: T",
            "k_scale?: T_KV_SCALE", "v_scale?: T_KV_SCALE", "q_norm_weight?: T",
            "k_norm_weight?: T", "query_seqlens?: M"],
    outputs=["output: T", "present_key?: T_CACHE", "present_value?: T_CACHE",
             "output_qk?: T"],
    types={"T": HALF_OR_FLOAT, "T_CACHE": HALF_OR_FLOAT, "T_KV_SCALE": ["float32"],
           "M": ["int32"]},
    attrs=_GQA_ATTRS,
    contract=Contract(nan="propagate", workspace_bytes=_gqa_workspace, allowed={
        "num_heads": such_that(lambda n: int(n) > 0, "a positive integer"),
        "kv_num_heads": such_that(lambda n: int(n) > 0, "a positive integer"),
        "do_rotary": one_of(0, 1), "rotary_interleaved": one_of(0, 1), "causal": one_of(0, 1),
        "qk_output": one_of(0, 1, 2), "smooth_softmax": one_of(-1, 0, 1),
        "sliding_window_cache": one_of(0), "k_quant_type": one_of("NONE"),
        "v_quant_type": one_of("NONE"),
        "softcap": such_that(lambda c: c >= 0, "a non-negative float")}))
def GroupQueryAttention(query, key=None, value=None, past_key=None, past_value=None,
                        seqlens_k=None, total_sequence_length=None, cos_cache=None,
                        sin_cache=None, position_ids=None, attention_bias=None, head_sink=None,
                        k_scale=None, v_scale=None, q_norm_weight=None, k_norm_weight=None,
                        query_seqlens=None, *, num_heads, kv_num_heads, scale=0.0, softcap=0.0,
                        do_rotary=0, rotary_interleaved=0, local_window_size=-1,
                        smooth_softmax=-1, qk_output=0, causal=1, sliding_window_cache=0,
                        k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0,
                        qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None):
    """Grouped-query attention over a KV cache addressed by seqlens_k, with rotary, local
    window, softcap, attention bias and head sinks (com.microsoft GroupQueryAttention-1)."""
    _gqa_unsupported(k_scale, v_scale, q_norm_weight, k_norm_weight, past_key)
    heads, kvh = int(num_heads), int(kv_num_heads)
    if heads % kvh:
        raise KernelError(f"num_heads {heads} is not a multiple of kv_num_heads {kvh}")
    if not causal and local_window_size not in (-1, None):
        raise KernelError("local_window_size must be -1 when causal is 0")
    q, k, v = _gqa_split(query, key, value, heads, kvh)
    batch, _, seq, head = q.shape
    if (past_key is None) != (past_value is None):
        raise KernelError("past_key and past_value must be given together")
    past_buf = 0
    if past_key is not None:
        want = (batch, kvh, past_key.shape[2], head)
        if past_key.shape != want or past_value.shape != want:
            raise KernelError(f"past_key/past_value must be {want}, got {past_key.shape}, "
                              f"{past_value.shape}")
        past_buf = past_key.shape[2]
    present_len, t, qv, p = _gqa_lengths(seqlens_k, total_sequence_length, query_seqlens,
                                         batch, seq, past_buf)
    if do_rotary:
        first = query_seqlens is None and seq == int(np.asarray(total_sequence_length).flat[0])
        q, k = _gqa_rotary(q, k, cos_cache, sin_cache, position_ids, p, rotary_interleaved,
                           first)
    full = query_seqlens is None
    pk = None if past_key is None else _f32(past_key)
    pv = None if past_value is None else _f32(past_value)
    present_k = _gqa_present(pk, k, present_len, p, qv, full)
    present_v = _gqa_present(pv, v, present_len, p, qv, full)
    group = heads // kvh
    kk, vv = np.repeat(present_k, group, axis=1), np.repeat(present_v, group, axis=1)
    alpha = float(scale) if scale else 1.0 / math.sqrt(head)
    scores = (q @ np.swapaxes(kk, -1, -2)) * np.float32(alpha)
    if softcap and softcap > 0:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    if attention_bias is not None:
        scores = scores + _gqa_bias(attention_bias, batch, heads, seq, present_len)
    qk_raw = scores
    keep = _gqa_keep(batch, seq, present_len, t, p, causal, local_window_size)
    sink = None
    if head_sink is not None:
        if head_sink.shape != (heads,):
            raise KernelError(f"head_sink must be ({heads},), got shape {head_sink.shape}")
        sink = _f32(head_sink).reshape(1, heads, 1, 1)
    elif smooth_softmax == 1:
        sink = np.zeros((1, 1, 1, 1), scores.dtype)
    probs = _gqa_softmax(scores, keep, sink)
    y = _merge(probs @ vv)
    dt = query.dtype
    qk = (np.where(keep, qk_raw, 0.0) if qk_output == 1 else probs).astype(dt)
    cache_dt = dt if past_key is None else past_key.dtype
    return y.astype(dt), present_k.astype(cache_dt), present_v.astype(cache_dt), qk


def _gqa_bias(bias, batch, heads, seq, present_len):
    """attention_bias (B|1, N|1, S, total) over the present rows (columns beyond it: none)."""
    if bias.ndim != 4 or bias.shape[0] not in (1, batch) or bias.shape[1] not in (1, heads) \
            or bias.shape[2] != seq:
        raise KernelError(f"attention_bias must be (B or 1, N or 1, {seq}, total), got "
                          f"{bias.shape}")
    b = _f32(bias)[..., :present_len]
    if b.shape[-1] < present_len:
        b = np.pad(b, [(0, 0)] * 3 + [(0, present_len - b.shape[-1])])
    return b


@GroupQueryAttention.infer
def _gqa_infer(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
               total=None, *_, num_heads=1, kv_num_heads=1, **__):
    dt = query.dtype
    if query.shape is None:
        return TensorFact(dt, None)
    b, s, d = query.shape
    heads, kvh = int(num_heads), int(kv_num_heads)
    key, past_key = (f if _given(f) else None for f in (key, past_key))
    if not isinstance(d, int):
        return TensorFact(dt, (b, s, None))
    h = d // (heads + 2 * kvh) if key is None else d // heads
    # present rows are max(past buffer, total_sequence_length): a value, not a shape
    cache = TensorFact(past_key.dtype if past_key is not None else dt, (b, kvh, None, h))
    return TensorFact(dt, (b, s, heads * h)), cache, cache, TensorFact(dt, (b, heads, s, None))


@GroupQueryAttention.samples
def _gqa_samples(rng):
    r = normal(rng)
    B, S, N, KV, H = 2, 3, 4, 2, 16
    i32 = np.int32
    a = {"num_heads": N, "kv_num_heads": KV}
    lens, tot = np.array([2, 2], i32), np.array(3, i32)
    yield Sample([r(B, S, N * H), r(B, S, KV * H), r(B, S, KV * H), None, None, lens, tot],
                 a, noutputs=3, label="prompt, no past")
    yield Sample([r(B, S, (N + 2 * KV) * H), None, None, None, None, np.array([2, 1], i32),
                  tot], {**a, "local_window_size": 1}, noutputs=3,
                 label="packed, right-padded prompt, local window")
    yield Sample([r(B, 1, N * H), r(B, 1, KV * H), r(B, 1, KV * H), r(B, KV, 6, H),
                  r(B, KV, 6, H), np.array([5, 3], i32), np.array(6, i32)],
                 {**a, "softcap": 2.0}, noutputs=3, label="decode over a past buffer, softcap")
    cos, sin = r(32, H // 2), r(32, H // 2)
    yield Sample([r(1, S, N * H), r(1, S, KV * H), r(1, S, KV * H), r(1, KV, 5, H),
                  r(1, KV, 5, H), np.array([7], i32), np.array(8, i32), cos, sin],
                 {**a, "do_rotary": 1, "rotary_interleaved": 1}, noutputs=3,
                 label="subsequent prompt, interleaved rotary")
    yield Sample([r(B, S, N * H), r(B, S, KV * H), r(B, S, KV * H), None, None, lens, tot,
                  None, None, None, r(B, N, S, 3), r(N)], {**a, "causal": 0}, noutputs=4,
                 label="non-causal, attention bias, head sink, probabilities out")
    yield Sample([r(B, S, N * H).astype(np.float16), r(B, S, KV * H).astype(np.float16),
                  r(B, S, KV * H).astype(np.float16), None, None, lens, tot], a, noutputs=3,
                 label="float16")
