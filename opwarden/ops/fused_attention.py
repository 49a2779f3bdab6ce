"""Fused operator (domain "opwarden"): SoftmaxAttention, the core of scaled dot-product attention
as exporters spell it out, created by the `attention_fusion` pass.

softmax(scale(Q @ Kt) + bias) @ V over the last axis, with Q (..., S, H), Kt (..., H, T) (the
keys already transposed, as the exported graphs hold them), V (..., T, Hv) and an optional bias
and mask (a position bias, a padding mask: added in that order) broadcast against the scores
(..., S, T). `scale` is the
scalar the graph multiplied the scores by (`divide` = 1: divided by). The reference calls the
reference kernels of the nodes it replaces in their order, so a fused graph agrees with the
unfused one bit for bit; the fast variant (kernels/cpu/attention.py) never writes the score
matrix whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.ops import elementwise as _ew
from opwarden.ops.base import Sample, op, shape_size
from opwarden.ops.common import broadcast_shapes, normal
from opwarden.ops.linalg import MatMul, Softmax

DOMAIN = "opwarden"
FLOATS = ["float16", "float32", "float64", "bfloat16"]


@op(
    "SoftmaxAttention",
    domain=DOMAIN,
    since=1,
    inputs=["Q: T", "Kt: T", "V: T", "bias?: T", "mask?: T"],
    outputs=["Y: T"],
    types={"T": FLOATS},
    attrs={"scale": 1.0, "divide": 0},
    contract=Contract(nan="propagate", broadcast="multidirectional",
                      allowed={"divide": one_of(0, 1)}),
)
def SoftmaxAttention(Q, Kt, V, bias=None, mask=None, *, scale=1.0, divide=0):
    """Softmax(scale(Q @ Kt) [+ bias] [+ mask], axis=-1) @ V, each step the reference of the
    node it replaces (scale: Mul by the scalar, or Div when `divide`)."""
    s = MatMul(Q, Kt)
    c = np.asarray(scale, dtype=s.dtype)
    if divide:
        s = _ew.Div(s, c)
    elif float(scale) != 1.0:
        s = _ew.Mul(s, c)
    for b in (bias, mask):
        if b is not None:
            s = _ew.Add(s, b)
    return MatMul(Softmax(s, axis=-1), V)


@SoftmaxAttention.infer
def _softmax_attention_infer(q, kt, v, bias=None, mask=None, **_):
    if (q.shape is None or kt.shape is None or v.shape is None or len(q.shape) < 2
            or len(kt.shape) < 2 or len(v.shape) < 2):
        return TensorFact(q.dtype, None)
    batch = broadcast_shapes(q.shape[:-2], kt.shape[:-2])
    rows = q.shape[-2]
    for b in (bias, mask):
        if batch is not None and b is not None:
            if b.shape is None:
                return TensorFact(q.dtype, None)
            scores = broadcast_shapes((*batch, rows, kt.shape[-1]), b.shape)
            batch, rows = (None, rows) if scores is None else (scores[:-2], scores[-2])
    if batch is not None:
        batch = broadcast_shapes(batch, v.shape[:-2])
    return TensorFact(q.dtype, None if batch is None else (*batch, rows, v.shape[-1]))


@SoftmaxAttention.flops
def _softmax_attention_flops(ins, outs):
    """The two products: 2*S*T*H for the scores, 2*S*T*Hv for the output, per batch entry."""
    if len(ins) < 3 or not outs:
        return None
    q, kt = ins[0], ins[1]
    if not isinstance(q, (list, tuple)) or not isinstance(kt, (list, tuple)) or len(q) < 2:
        return None
    t, h, hv = kt[-1], q[-1], outs[0][-1] if outs[0] else None
    if not all(isinstance(d, int) and d > 0 for d in (t, h, hv)):
        return None
    rows = shape_size(outs[0]) // hv  # batch entries x S
    return 2.0 * rows * t * (h + hv)


@SoftmaxAttention.samples
def _softmax_attention_samples(rng: Any):
    r = normal(rng)
    S = Sample
    yield S([r(2, 3, 5, 8), r(2, 3, 8, 7), r(2, 3, 7, 4)], {"scale": 0.35}, label="scale")
    mask = np.where(rng.random((2, 1, 1, 7)) < 0.3, -10000.0, 0.0).astype(np.float32)
    yield S([r(2, 3, 5, 8), r(2, 3, 8, 7), r(2, 3, 7, 4), mask],
            {"scale": 8.0 ** 0.5, "divide": 1}, label="divide, padding mask")
    yield S([r(1, 4, 6, 8), r(1, 4, 8, 6), r(1, 4, 6, 8), r(1, 4, 6, 6)], {},
            label="position bias, no scale")
    yield S([r(2, 4, 6, 8), r(2, 4, 8, 6), r(2, 4, 6, 8), r(1, 4, 6, 6), mask[:, :, :, :6]],
            {"scale": 0.5}, label="position bias and padding mask")
    yield S([r(1, 2, 1, 8), r(1, 2, 8, 6), r(1, 2, 6, 8), r(3, 1, 4, 6)], {},
            label="bias widens batch and rows")
    yield S([r(1, 2, 300, 16), r(1, 2, 16, 300), r(1, 2, 300, 16)], {"scale": 0.25},
            label="300 x 300, row blocks")
    yield S([r(2, 1, 16), r(2, 16, 40), r(2, 40, 16), r(2, 1, 40)], {"scale": 0.25},
            label="one query row (decode), rank 3")
    neg = np.full((1, 1, 3, 5), -np.inf, np.float32)
    neg[..., 0] = 0.0
    yield S([r(1, 2, 3, 4), r(1, 2, 4, 5), r(1, 2, 5, 4), neg], {}, label="-inf mask")
    d = normal(rng, np.float64)
    yield S([d(1, 2, 4, 8), d(1, 2, 8, 4), d(1, 2, 4, 8)], {"scale": 0.5}, label="float64")


__all__ = ["SoftmaxAttention"]
