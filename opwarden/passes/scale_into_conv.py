"""`scale_into_conv` (level 2): a positive per-channel scale before a Relu moves into the
convolutions reading the Relu.

relu(x * s + t) = s * relu(x + t / s) for s > 0, and a per-input-channel s commutes with a
group-1 convolution's zero padding, so it becomes part of each reader's weights and the
multiply's pass over the tensor goes. The Mul/Add pair is what `bn_to_affine` writes for a
BatchNormalization that does not follow a convolution (DenseNet's BatchNorm + Relu before
each 1x1 convolution).
"""

from __future__ import annotations

import numpy as np

from opwarden.passes.match import FLOAT, channel_vector, is_std
from opwarden.passes.rewrite import PassResult, Rewriter


def _positive_channels(k: np.ndarray | None, rank: int, m: int) -> np.ndarray | None:
    """k as a length-m vector when it is a finite per-channel constant of an NC... tensor of
    `rank` (shape (m, 1, ..) or (1, m, 1, ..)) with every entry > 0, else None."""
    if k is None or rank < 3:
        return None
    c = channel_vector(k, rank, m)
    if c is None or not np.all(np.isfinite(c)) or not np.all(c > 0):
        return None
    return c


def scale_into_conv(rw: Rewriter) -> PassResult:
    """relu(x * s + t) read only by group-1 convolutions with constant weights, s a positive
    per-channel constant: relu(x * s + t) = s * relu(x + t / s), and s moves into each
    convolution's weights along their input channels (zero padding commutes with it). The
    multiply's pass over the tensor disappears."""
    res = PassResult()
    for mul in rw.graph.nodes:
        if not is_std(mul, "Mul") or id(mul) in rw.removed or mul.outputs[0] is None:
            continue
        x, sv = mul.inputs[0], mul.inputs[1]
        if rw.const(x) is not None:
            x, sv = sv, x
        rank = x.fact.ndim if x is not None else None
        if rank is None or rank < 3 or x.fact.dtype not in FLOAT:
            continue
        m = x.fact.shape[1]
        if not isinstance(m, int) or tuple(mul.outputs[0].fact.shape or ()) != tuple(x.fact.shape):
            continue
        s = _positive_channels(rw.const(sv), rank, m)
        add = rw.single_use(mul.outputs[0])
        if s is None or not is_std(add, "Add"):
            continue
        j = 0 if add.inputs[0] is mul.outputs[0] else 1
        tv = add.inputs[1 - j]
        tk = rw.const(tv)
        t = None if tk is None else channel_vector(tk, rank, m)
        relu = rw.single_use(add.outputs[0])
        if t is None or not is_std(relu, "Relu") or relu.outputs[0] is None:
            continue
        y = relu.outputs[0]
        if id(y) in rw.outputs or not y.uses or not rw.local_uses(y):
            continue
        convs = [n for n, i in y.uses]
        if not all(
            i == 0 and is_std(n, "Conv") and int(n.attrs.get("group", 1)) == 1
            and (w := rw.const(n.inputs[1])) is not None and w.ndim == rank and w.shape[1] == m
            for n, i in y.uses
        ):
            continue
        dt = np.dtype(x.fact.dtype)
        cshape = (m,) + (1,) * (rank - 2)
        rw.set_input(add, j, x)
        rw.set_input(add, 1 - j, rw.new_const(f"{add.name}_shift", (t / s).astype(dt)
                                              .reshape(cshape)))
        rw.remove(mul)
        rw.absorb(add, [mul])
        wshape = (1, m) + (1,) * (rank - 2)
        for n in convs:
            w = rw.const(n.inputs[1])
            rw.set_input(n, 1, rw.new_const(f"{n.name}_W_scaled",
                                            (w * s.reshape(wshape)).astype(w.dtype)))
            rw.absorb(n, [mul])
        res.details["Mul"] += 1
        res.details["convolutions"] += len(convs)
        res.changes += 1
    return res
