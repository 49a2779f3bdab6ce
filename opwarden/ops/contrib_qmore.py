"""Operators: more quantized com.microsoft operators of ORT's tools: QLinearWhere (the
quantizer's Where), NhwcMaxPool (written into a saved ORT-optimized QDQ model) and
QEmbedLayerNormalization (``quantize_dynamic`` of an optimizer-fused BERT).

Each reference follows ORT's CPU kernel step for step, so results agree bit for bit:

- QLinearWhere requantizes each selected value through a 256-entry table built from its
  input's dequantized values (MLAS QuantizeLinear: rint(v / z_scale) + z_zero_point,
  saturated), or copies it when its scale and zero point equal the output's.
- NhwcMaxPool: MaxPool over channels-last 8-bit data (max is exact in any order).
- QEmbedLayerNormalization dequantizes every weight as float32((q - zp)) * scale and computes
  the layer norm in float32 with ORT's sequential sums: mean = sum / hidden, the centred
  values' squares summed again, y = a / sqrt(var + epsilon) * gamma + beta.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import broadcast_shapes
from opwarden.ops.contrib_quant import (
    F32,
    MS,
    Q8,
    _all_values,
    _q8,
    _qparams,
    _quantize_table,
    scalar_param,
)
from opwarden.ops.pool import _maxpool, pool_geometry

# ---------------------------------------------------------------------------------------------
# QLinearWhere
# ---------------------------------------------------------------------------------------------


def _requantize_table(scale, zero_point, z_scale, z_zero_point, dtype) -> np.ndarray | None:
    """The table taking an input's 8-bit values to the output's quantization, or None when
    the two quantizations are the same (ORT then copies)."""
    if scale == z_scale and zero_point == z_zero_point:
        return None
    with np.errstate(all="ignore"):
        deq = (F32(scale) * (_all_values(dtype).astype(np.int32) - zero_point).astype(F32))
        return _quantize_table(deq.astype(F32), z_scale, z_zero_point, dtype)


@op("QLinearWhere", domain=MS, since=1,
    inputs=["condition: B", "X: T", "x_scale: TF", "x_zero_point: T", "Y: T", "y_scale: TF",
            "y_zero_point: T", "z_scale: TF", "z_zero_point: T"],
    outputs=["Z: T"], types={"B": ["bool"], "TF": ["float32"], "T": Q8},
    contract=Contract(nan="none", overflow="saturate", broadcast="multidirectional"))
def QLinearWhere(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
                 z_zero_point):
    """Where(condition, X, Y) of quantized X and Y, each requantized to (z_scale,
    z_zero_point), with multidirectional broadcasting (com.microsoft QLinearWhere-1)."""
    what = "QLinearWhere"
    dt = np.asarray(z_zero_point).dtype
    for name, v in (("X", X), ("Y", Y), ("x_zero_point", x_zero_point),
                    ("y_zero_point", y_zero_point)):
        if np.asarray(v).dtype != dt:
            raise KernelError(f"{what}: {name} has type {np.asarray(v).dtype}, expected {dt} "
                              "(the type of z_zero_point)")
    if condition.dtype != np.bool_:
        raise KernelError(f"{what}: condition must be bool, got {condition.dtype}")
    zs = F32(scalar_param(z_scale, what, "z_scale"))
    zz = int(scalar_param(z_zero_point, what, "z_zero_point", dt))
    picked = []
    for name, v, s, z in (("x", X, x_scale, x_zero_point), ("y", Y, y_scale, y_zero_point)):
        table = _requantize_table(F32(scalar_param(s, what, f"{name}_scale")),
                                  int(scalar_param(z, what, f"{name}_zero_point", dt)), zs, zz,
                                  dt)
        picked.append(v if table is None else table[np.asarray(v).view(np.uint8)])
    try:
        return np.where(condition, picked[0], picked[1]).astype(dt)
    except ValueError:
        raise KernelError(f"{what}: condition {condition.shape}, X {X.shape} and Y {Y.shape} "
                          "do not broadcast") from None


@QLinearWhere.infer
def _qlinear_where_infer(cond, x, xs, xz, y, *rest, **_):
    dt = rest[-1].dtype if rest and rest[-1] is not None else x.dtype
    return TensorFact(dt, broadcast_shapes(cond.shape, x.shape, y.shape))


@QLinearWhere.samples
def _qlinear_where_samples(rng):
    for dt in (np.uint8, np.int8):
        name = np.dtype(dt).name
        for cshape, xshape, yshape, label in (((2, 3, 4), (2, 3, 4), (2, 3, 4), "same shape"),
                                              ((3, 1), (1, 4), (3, 4), "broadcast"),
                                              ((), (5,), (5,), "scalar condition"),
                                              ((4,), (), (4,), "scalar X"),
                                              ((2, 0), (2, 1), (1, 0), "empty")):
            cond = np.asarray(rng.random(cshape) < 0.5)
            yield Sample([cond, _q8(rng, dt, xshape), *_qparams(rng, dt),
                          _q8(rng, dt, yshape), *_qparams(rng, dt), *_qparams(rng, dt)],
                         label=f"{name} {label}")
        full = _all_values(dt).reshape(4, 64)
        zs, zz = _qparams(rng, dt, 0.05)
        yield Sample([rng.random((4, 64)) < 0.5, full, zs, zz, full[::-1].copy(),
                      *_qparams(rng, dt, 0.2), zs, zz],
                     label=f"{name} every value, X copied (same quantization as Z)")
        yield Sample([rng.random((4, 64)) < 0.5, full, *_qparams(rng, dt, 0.5), full,
                      *_qparams(rng, dt, 0.5), *_qparams(rng, dt, 0.01)],
                     label=f"{name} saturating")


# ---------------------------------------------------------------------------------------------
# NhwcMaxPool
# ---------------------------------------------------------------------------------------------


@op("NhwcMaxPool", domain=MS, since=1, inputs=["x: T"], outputs=["y: T"], types={"T": Q8},
    attrs={"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": ("INTS", None),
           "kernel_shape": "INTS", "pads": ("INTS", None), "strides": ("INTS", None)},
    contract=Contract(nan="none", allowed={
        "auto_pad": one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"),
        "ceil_mode": one_of(0, 1)}))
def NhwcMaxPool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                pads=None, strides=None):
    """MaxPool of channels-last (N, *spatial, C) 8-bit data (com.microsoft NhwcMaxPool-1)."""
    if x.ndim < 3:
        raise KernelError(f"NhwcMaxPool: x must be (N, *spatial, C), got shape {x.shape}")
    y = _maxpool(np.moveaxis(x, -1, 1), auto_pad=auto_pad, ceil_mode=ceil_mode,
                 dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides)
    return np.ascontiguousarray(np.moveaxis(y, 1, -1))


@NhwcMaxPool.infer
def _nhwc_maxpool_infer(x, *, kernel_shape=None, strides=None, dilations=None, pads=None,
                        auto_pad="NOTSET", ceil_mode=0, **_):
    if not x.static or not kernel_shape:
        return TensorFact(x.dtype, None)
    s = tuple(x.shape)
    *_, out, _extra = pool_geometry((s[0], s[-1], *s[1:-1]), kernel_shape, strides, dilations,
                                    pads, auto_pad, ceil_mode)
    return TensorFact(x.dtype, (s[0], *out, s[-1]))


@NhwcMaxPool.samples
def _nhwc_maxpool_samples(rng):
    for dt in (np.uint8, np.int8):
        name = np.dtype(dt).name
        yield Sample([_q8(rng, dt, (1, 6, 6, 3))], {"kernel_shape": [3, 3]}, label=f"{name} 3x3")
        yield Sample([_q8(rng, dt, (2, 7, 5, 4))],
                     {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
                     label=f"{name} strided, padded")
    yield Sample([_q8(rng, np.uint8, (1, 7, 7, 2))],
                 {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, label="ceil_mode")
    yield Sample([_q8(rng, np.int8, (1, 5, 5, 2))],
                 {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, label="SAME_UPPER")
    yield Sample([_q8(rng, np.uint8, (1, 8, 8, 2))],
                 {"kernel_shape": [2, 2], "dilations": [2, 2]}, label="dilations")
    yield Sample([_q8(rng, np.int8, (1, 9, 3))], {"kernel_shape": [3]}, label="1-D")


# ---------------------------------------------------------------------------------------------
# QEmbedLayerNormalization
# ---------------------------------------------------------------------------------------------

_QEMBED_Q = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")


def _seq_sum(v: np.ndarray) -> np.ndarray:
    """float32 sum over the last axis added left to right, as ORT's loop adds (keepdims)."""
    if v.shape[-1] == 0:
        return np.zeros((*v.shape[:-1], 1), F32)
    return np.cumsum(v, axis=-1, dtype=F32)[..., -1:]


def _dequant_weight(q, scale, zp, dt, what: str, name: str) -> np.ndarray:
    if q.dtype != dt:
        raise KernelError(f"{what}: {name} has type {q.dtype}, expected {dt} (the type of "
                          "word_embedding)")
    s = F32(scalar_param(scale, what, f"{name}_scale", F32))
    z = int(scalar_param(zp, what, f"{name}_zero_point", dt))
    return ((q.astype(np.int32) - z).astype(F32) * s).astype(F32)


def _qembed_rows(table: np.ndarray, ids: np.ndarray, hidden: int, what: str, name: str):
    if table.ndim != 2 or table.shape[1] != hidden:
        raise KernelError(f"{what}: {name} must be (rows, {hidden}), got shape {table.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise KernelError(f"{what}: {name} index out of range [0, {table.shape[0]})")
    return table[ids]


@op("QEmbedLayerNormalization", domain=MS, since=1,
    inputs=["input_ids: T1", "segment_ids?: T1", "word_embedding_quant: T2",
            "position_embedding_quant: T2", "segment_embedding?: T2", "gamma_quant: T2",
            "beta_quant: T2", "mask?: T1", "word_embedding_scale: T",
            "position_embedding_scale: T", "segment_embedding_scale?: T", "gamma_scale: T",
            "beta_scale: T", "word_embedding_zero_point: T2",
            "position_embedding_zero_point: T2", "segment_embedding_zero_point?: T2",
            "gamma_zero_point: T2", "beta_zero_point: T2"],
    outputs=["layernorm_out: T", "mask_index_out: T1"],
    types={"T1": ["int32"], "T2": Q8, "T": ["float32"]}, attrs={"epsilon": 1e-12},
    contract=Contract(nan="propagate"))
def QEmbedLayerNormalization(input_ids, segment_ids, word_embedding_quant,
                             position_embedding_quant, segment_embedding, gamma_quant,
                             beta_quant, mask, word_embedding_scale, position_embedding_scale,
                             segment_embedding_scale, gamma_scale, beta_scale,
                             word_embedding_zero_point, position_embedding_zero_point,
                             segment_embedding_zero_point, gamma_zero_point, beta_zero_point,
                             *, epsilon=1e-12):
    """EmbedLayerNormalization with 8-bit per-tensor quantized embeddings, gamma and beta;
    positions are 0..S-1 (com.microsoft QEmbedLayerNormalization-1)."""
    what = "QEmbedLayerNormalization"
    if input_ids.ndim != 2:
        raise KernelError(f"{what}: input_ids must be (batch, sequence), got {input_ids.shape}")
    if (segment_ids is None) != (segment_embedding is None):
        raise KernelError(f"{what}: segment_ids and segment_embedding must be given together")
    dt = word_embedding_quant.dtype
    qs = (word_embedding_quant, position_embedding_quant, segment_embedding, gamma_quant,
          beta_quant)
    scales = (word_embedding_scale, position_embedding_scale, segment_embedding_scale,
              gamma_scale, beta_scale)
    zps = (word_embedding_zero_point, position_embedding_zero_point,
           segment_embedding_zero_point, gamma_zero_point, beta_zero_point)
    w, p, seg, gamma, beta = (None if q is None else _dequant_weight(q, s, z, dt, what, n)
                              for q, s, z, n in zip(qs, scales, zps, _QEMBED_Q))
    batch, seq = input_ids.shape
    hidden = w.shape[-1] if w.ndim == 2 else -1
    for name, v in (("gamma", gamma), ("beta", beta)):
        if v.shape != (hidden,):
            raise KernelError(f"{what}: {name} must have shape ({hidden},), got {v.shape}")
    total = _qembed_rows(w, input_ids, hidden, what, "word_embedding")
    total = total + _qembed_rows(p, np.broadcast_to(np.arange(seq), (batch, seq)), hidden,
                                 what, "position_embedding")
    if seg is not None:
        if segment_ids.shape != input_ids.shape:
            raise KernelError(f"{what}: segment_ids shape {segment_ids.shape} != input_ids "
                              f"{input_ids.shape}")
        total = total + _qembed_rows(seg, segment_ids, hidden, what, "segment_embedding")
    n = F32(hidden)
    a = (total - _seq_sum(total) / n).astype(F32)
    e = np.sqrt(_seq_sum(a * a) / n + F32(epsilon)).astype(F32)
    y = ((a / e) * gamma + beta).astype(F32)
    if mask is not None and mask.shape != input_ids.shape:
        raise KernelError(f"{what}: mask shape {mask.shape} != input_ids {input_ids.shape}")
    count = np.zeros(batch, np.int32) if mask is None else np.count_nonzero(mask == 1, axis=1)
    return y, count.astype(np.int32)


@QEmbedLayerNormalization.infer
def _qembed_infer(ids, seg=None, word=None, *_, **__):
    hidden = word.shape[1] if word is not None and word.shape is not None else None
    if ids.shape is None or len(ids.shape) != 2:
        return TensorFact("float32", None), TensorFact("int32", None)
    b, s = ids.shape
    return TensorFact("float32", (b, s, hidden)), TensorFact("int32", (b,))


def _quantized_weight(rng, dt, shape):
    q = _q8(rng, dt, shape)
    return [q, np.asarray(rng.uniform(0.005, 0.05), F32), np.asarray(_q8(rng, dt, ()), dt)]


@QEmbedLayerNormalization.samples
def _qembed_samples(rng):
    B, S, H, V = 2, 5, 8, 11
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg_ids = rng.integers(0, 2, (B, S)).astype(np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    for dt in (np.uint8, np.int8):
        word, pos, seg, gamma, beta = (_quantized_weight(rng, dt, s)
                                       for s in ((V, H), (S + 2, H), (2, H), (H,), (H,)))
        full = [ids, seg_ids, word[0], pos[0], seg[0], gamma[0], beta[0], mask, word[1],
                pos[1], seg[1], gamma[1], beta[1], word[2], pos[2], seg[2], gamma[2], beta[2]]
        consts = (2, 3, 4, 5, 6, *range(8, 18))
        yield Sample(full, noutputs=2, label=f"{np.dtype(dt).name} BERT: segments, mask",
                     constants=consts)
        bare = list(full)
        for i in (1, 4, 7, 10, 15):
            bare[i] = None
        yield Sample(bare, {"epsilon": 1e-5}, noutputs=2,
                     label=f"{np.dtype(dt).name} no segments, no mask")
    one = list(full)
    one[0], one[1], one[7] = ids[:1, :1], seg_ids[:1, :1], mask[:1, :1]
    yield Sample(one, noutputs=2, label="one token")
