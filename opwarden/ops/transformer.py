"""Operators: transformer family (Attention, RotaryEmbedding, LinearAttention)."""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, one_of, such_that
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import op

# softmax_precision values the spec allows (ONNX element type codes).
_SOFTMAX_PRECISIONS = (1, 10, 11, 16)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b accumulated in float32 (float64 for doubles), rounded back to a's dtype.

    Elementwise steps stay in the tensor's own dtype, as the spec's function body would run them;
    only the matmul accumulates wider, as every real kernel does.
    """
    acc = np.float64 if a.dtype == np.float64 else np.float32
    return np.ascontiguousarray((a.astype(acc) @ b.astype(acc)).astype(a.dtype))


def _attention_workspace(q, k, v, *rest, **attrs) -> int:
    """Scratch for the score matrix (batch, heads, q_len, total_len) in float32."""
    if len(q) == 4:
        b, h, sq = q[0], q[1], q[2]
    else:
        b, sq, h = q[0], q[1], attrs.get("q_num_heads") or 1
    total = k[-2] if len(k) == 4 else k[1]
    past = rest[1] if len(rest) > 1 and rest[1] else None
    if past:
        total += past[2]
    return int(b * h * sq * total * 4 * 2)


def _split_heads(x: np.ndarray, num_heads: int | None, what: str) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs pass through."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise KernelError(f"{what} must be 3-D or 4-D, got shape {x.shape}")
    if not num_heads:
        raise KernelError(f"3-D {what} needs the q_num_heads/kv_num_heads attributes")
    b, s, hidden = x.shape
    if hidden % num_heads:
        raise KernelError(f"{what} hidden size {hidden} is not a multiple of {num_heads} heads")
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def _split_mask(attn_mask: np.ndarray, total: int, dtype: np.dtype):
    """(additive float bias or None, boolean keep-set or None) for `attn_mask`.

    Boolean (and integer: nonzero = attend) masks give a keep-set; float masks are added to the
    scores. A mask shorter than `total` keys is padded with "masked out" (-inf).
    """
    short = total - attn_mask.shape[-1]
    if short < 0:
        raise KernelError(
            f"attn_mask last dimension {attn_mask.shape[-1]} exceeds total sequence length {total}"
        )
    pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, short)]
    if attn_mask.dtype == np.bool_ or attn_mask.dtype.kind in "iu":
        return None, np.pad(attn_mask.astype(bool), pad, constant_values=False)
    return np.pad(attn_mask.astype(dtype), pad, constant_values=-np.inf), None


def _allowed_keys(batch, sq, total, offset, *, is_causal, nonpad, left, right) -> np.ndarray | None:
    """Boolean (B, 1, Sq, total) set of keys each query may see, or None if all are allowed.

    `offset` (shape (B,)) is the count of valid keys before the query block, so the query at
    in-block index i has absolute position p = i + offset (bottom-right alignment).
    """
    if not (is_causal or nonpad is not None or left >= 0 or right >= 0):
        return None
    i = np.arange(sq).reshape(1, sq, 1)
    j = np.arange(total).reshape(1, 1, total)
    p = i + offset.reshape(-1, 1, 1)
    ok = np.ones((batch, sq, total), dtype=bool)
    if is_causal:
        ok &= j <= p
    if left >= 0:
        ok &= j >= p - left
    if right >= 0:
        ok &= j <= p + right
    if nonpad is not None:
        ok &= j < nonpad.reshape(-1, 1, 1)
    return ok[:, None]


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax on the last axis; a row whose every entry is -inf becomes zeros (not NaN)."""
    zero, one = scores.dtype.type(0), scores.dtype.type(1)
    m = np.max(scores, axis=-1, keepdims=True)
    dead = np.isneginf(m)
    e = np.exp(scores - np.where(dead, zero, m))
    s = np.sum(e, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = e / np.where(dead, one, s)
    return np.where(dead, zero, p)


def _attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, *, is_causal,
               kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap,
               softmax_precision, left_window_size=-1, right_window_size=-1):
    """Shared body of Attention-23/24/25; returns (Y, present_key, present_value, qk_output)."""
    out_dtype = Q.dtype
    three_d = Q.ndim == 3
    q = _split_heads(Q, q_num_heads, "Q")
    k = _split_heads(K, kv_num_heads, "K")
    v = _split_heads(V, kv_num_heads, "V")
    if (past_key is None) != (past_value is None):
        raise KernelError("past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        k = np.concatenate([past_key, k], axis=2)
        v = np.concatenate([past_value, v], axis=2)
    present_key, present_value = k.copy(), v.copy()

    batch, hq, sq, head = q.shape
    hkv, total = k.shape[1], k.shape[2]
    if hq % hkv:
        raise KernelError(f"q_num_heads {hq} is not a multiple of kv_num_heads {hkv}")
    if k.shape[-1] != head:
        raise KernelError(f"Q head size {head} != K head size {k.shape[-1]}")
    if v.shape[2] != total:
        raise KernelError(f"K has {total} positions but V has {v.shape[2]}")

    cdt = np.dtype(out_dtype)
    # GQA: query head h reads key/value head h // group (each kv head serves a contiguous group).
    group = hq // hkv
    kc = np.repeat(k.astype(cdt), group, axis=1)
    vc = np.repeat(v.astype(cdt), group, axis=1)
    s = float(scale) if scale is not None else 1.0 / np.sqrt(head)
    root = cdt.type(np.sqrt(s))
    scores = _matmul(q.astype(cdt) * root, np.swapaxes(kc, -1, -2) * root)
    qk = [scores]  # the four observable stages for qk_matmul_output_mode 0..2
    if softcap and softcap > 0:
        c = cdt.type(softcap)
        scores = c * np.tanh(scores / c)
    qk.append(scores)

    bias, keep = (None, None) if attn_mask is None else _split_mask(attn_mask, total, cdt)
    if past_key is not None or nonpad_kv_seqlen is None:
        offset = np.full((batch,), past_len, dtype=np.int64)
    else:
        offset = nonpad_kv_seqlen.astype(np.int64).reshape(-1) - sq
    allowed = _allowed_keys(
        batch, sq, total, offset, is_causal=bool(is_causal),
        nonpad=nonpad_kv_seqlen, left=left_window_size, right=right_window_size,
    )
    if allowed is not None:
        keep = allowed if keep is None else keep & allowed
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        # Equivalent to adding -inf, but a disallowed key also stays out when its score is NaN.
        scores = np.where(keep, scores, cdt.type(-np.inf))
    qk.append(scores)

    if softmax_precision is not None:
        sdt = np_dtype(int(softmax_precision))
        probs = _softmax_rows(scores.astype(sdt)).astype(cdt)
    else:
        probs = _softmax_rows(scores)
    qk.append(probs)
    y = _matmul(probs, vc)

    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, hq * vc.shape[-1])
    mode = int(qk_matmul_output_mode)
    return (
        y.astype(out_dtype),
        present_key,
        present_value,
        qk[mode].astype(out_dtype),
    )


_ATTN_ALLOWED = {
    "qk_matmul_output_mode": one_of(0, 1, 2, 3),
    "softmax_precision": one_of(*_SOFTMAX_PRECISIONS),
    "is_causal": one_of(0, 1),
    "softcap": such_that(lambda c: c >= 0, "a non-negative float"),
}
_ATTN_CONTRACT = Contract(nan="propagate", workspace_bytes=_attention_workspace,
                          allowed=_ATTN_ALLOWED)


@op("Attention", since=23, contract=_ATTN_CONTRACT)
def Attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, *, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
              softcap=0.0, softmax_precision=None):
    """Scaled dot-product attention with GQA, masks and an internal KV cache (ONNX Attention-23)."""
    return _attention(
        Q, K, V, attn_mask, past_key, past_value, None, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision,
    )


@op("Attention", since=24, contract=_ATTN_CONTRACT)
def Attention_24(Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None):
    """Attention-23 plus `nonpad_kv_seqlen` for an external KV cache (ONNX Attention-24)."""
    return _attention(
        Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision,
    )


@op("Attention", since=25, contract=_ATTN_CONTRACT)
def Attention_25(Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 left_window_size=-1, right_window_size=-1):
    """Attention-24 plus sliding-window bounds (ONNX Attention-25)."""
    return _attention(
        Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision, left_window_size=left_window_size,
        right_window_size=right_window_size,
    )


@op("RotaryEmbedding", since=23, contract=Contract(
    nan="propagate", allowed={"interleaved": one_of(0, 1)}))
def RotaryEmbedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                    num_heads=None, rotary_embedding_dim=0):
    """Rotary position embedding, half-split or interleaved pairs (ONNX RotaryEmbedding-23)."""
    if X.ndim == 4:
        # (B, H, S, D) -> (B, S, H, D): the caches index (batch, position).
        x = X.transpose(0, 2, 1, 3)
    elif X.ndim == 3:
        if not num_heads:
            raise KernelError("RotaryEmbedding with a 3-D input needs the num_heads attribute")
        b, s, hidden = X.shape
        if hidden % num_heads:
            raise KernelError(f"hidden size {hidden} is not a multiple of num_heads={num_heads}")
        x = X.reshape(b, s, num_heads, hidden // num_heads)
    else:
        raise KernelError(f"RotaryEmbedding input must be 3-D or 4-D, got shape {X.shape}")
    head = x.shape[-1]
    rot = int(rotary_embedding_dim) or head
    if rot % 2 or rot > head:
        raise KernelError(f"rotary_embedding_dim {rot} must be even and at most head size {head}")
    if position_ids is not None:
        if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= len(cos_cache)):
            raise KernelError(f"position_ids out of range [0, {len(cos_cache)})")
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != rot // 2 or sin.shape[-1] != rot // 2:
        raise KernelError(
            f"cos/sin cache last dimension {cos.shape[-1]} != rotary_embedding_dim/2 = {rot // 2}"
        )
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    part = x[..., :rot]
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    else:
        x1, x2 = part[..., : rot // 2], part[..., rot // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    y = np.concatenate([rotated.astype(X.dtype), x[..., rot:]], axis=-1)
    return y.reshape(X.shape) if X.ndim == 3 else y.transpose(0, 2, 1, 3)


def _per_head(x: np.ndarray | None, b: int, t: int, heads: int, width: int, what: str):
    """Unpack a (B, T, H*W) / (B, T, H) / (B, T, 1) gate to (B, T, H, W or 1) in float32."""
    if x is None:
        return None
    x = x.astype(np.float32)
    last = x.shape[-1]
    if last == heads * width and width != 1:
        return x.reshape(b, t, heads, width)
    if last in (heads, 1):
        return np.broadcast_to(x.reshape(b, t, last, 1), (b, t, heads, 1))
    raise KernelError(f"{what} last dimension {last} fits neither {heads}*{width} nor {heads}")


@op("LinearAttention", since=27, contract=Contract(
    nan="propagate",
    allowed={"update_rule": one_of("linear", "gated", "delta", "gated_delta")}))
def LinearAttention(query, key, value, past_state=None, decay=None, beta=None, *,
                    chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                    update_rule=None):
    """Recurrent linear attention, linear/gated/delta/gated-delta (ONNX LinearAttention-27)."""
    rule = update_rule or "gated_delta"
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise KernelError(
            f"q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads "
            f"({kv_num_heads})"
        )
    b, t, _ = query.shape
    dk = query.shape[-1] // q_num_heads
    dv = value.shape[-1] // kv_num_heads
    if key.shape[-1] != kv_num_heads * dk:
        raise KernelError(f"key width {key.shape[-1]} != kv_num_heads*d_k = {kv_num_heads * dk}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated and decay is None:
        raise KernelError(f"update_rule {rule!r} needs the decay input")
    if delta and beta is None:
        raise KernelError(f"update_rule {rule!r} needs the beta input")
    q = query.astype(np.float32).reshape(b, t, q_num_heads, dk)
    k = key.astype(np.float32).reshape(b, t, kv_num_heads, dk)
    v = value.astype(np.float32).reshape(b, t, kv_num_heads, dv)
    g = _per_head(decay, b, t, kv_num_heads, dk, "decay") if gated else None
    bt = _per_head(beta, b, t, kv_num_heads, 1, "beta") if delta else None
    state = (np.zeros((b, kv_num_heads, dk, dv), np.float32) if past_state is None
             else past_state.astype(np.float32))
    s = np.float32(scale if scale else 1.0 / np.sqrt(dk))
    group = q_num_heads // kv_num_heads
    out = np.empty((b, t, q_num_heads, dv), np.float32)
    for i in range(t):
        kt, vt = k[:, i], v[:, i]  # (B, H_kv, d)
        if gated:
            # Decay multiplies the state's key rows (per key dimension or per head).
            state = np.exp(g[:, i])[..., None] * state
        if delta:
            predicted = np.einsum("bhkv,bhk->bhv", state, kt)
            vt = bt[:, i] * (vt - predicted)
        state = state + kt[..., :, None] * vt[..., None, :]
        # Query head h reads kv head h // group.
        out[:, i] = s * np.einsum("bhk,bhkv->bhv", q[:, i], np.repeat(state, group, axis=1))
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return (out.reshape(b, t, q_num_heads * dv).astype(query.dtype), state.astype(state_dtype))


def _run_modifier(fn, x: np.ndarray, what: str) -> np.ndarray:
    """Apply a score_mod / prob_mod subgraph (the runtime binds it to a callable)."""
    if not callable(fn):
        raise KernelError(f"{what} must be a bound subgraph, got {type(fn).__name__}")
    res = fn(x)
    y = np.asarray(res[0] if isinstance(res, (list, tuple)) else res)
    if y.shape != x.shape:
        raise KernelError(f"{what} changed the shape {x.shape} to {y.shape}")
    return y.astype(x.dtype, copy=False)


@op("FlexAttention", domain="ai.onnx.preview", since=1,
    inputs=["Q: T1", "K: T1", "V: T1"], outputs=["Y: T1"],
    types={"T1": ["bfloat16", "float16", "float32", "float64"]},
    attrs={"scale": ("FLOAT", None), "softmax_precision": ("INT", None),
           "score_mod": ("GRAPH", None), "prob_mod": ("GRAPH", None)},
    contract=Contract(nan="propagate",
                      allowed={"softmax_precision": one_of(*_SOFTMAX_PRECISIONS)}))
def FlexAttention(Q, K, V, *, scale=None, softmax_precision=None, score_mod=None,
                  prob_mod=None):
    """Attention with score/probability modifier subgraphs (ONNX preview FlexAttention-1)."""
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        if x.ndim != 4:
            raise KernelError(f"FlexAttention {name} must be rank 4, got shape {x.shape}")
    hq, hkv = Q.shape[1], K.shape[1]
    if hq % hkv:
        raise KernelError(f"q_num_heads {hq} is not a multiple of kv_num_heads {hkv}")
    if softmax_precision is not None:
        sdt = np_dtype(int(softmax_precision))
    else:
        sdt = np.dtype(np.float64 if Q.dtype == np.float64 else np.float32)
    group = hq // hkv
    k = np.repeat(K, group, axis=1).astype(sdt)
    v = np.repeat(V, group, axis=1)
    s = sdt.type(scale if scale is not None else 1.0 / np.sqrt(Q.shape[-1]))
    scores = (Q.astype(sdt) @ np.swapaxes(k, -1, -2)) * s
    if score_mod is not None:
        scores = _run_modifier(score_mod, scores, "score_mod")
    probs = _softmax_rows(scores)
    if prob_mod is not None:
        probs = _run_modifier(prob_mod, probs, "prob_mod")
    return _matmul(probs.astype(Q.dtype), v)
