"""TopK by selection rather than a full sort, for the last axis.

The reference sorts every row (a stable argsort, O(n log n)); here one partition per row picks
k candidates and only those are sorted (by value, ties by ascending index, the spec's rule).
Where an element equal to the k-th value was left out (ties straddling the k-th place), that
row is sorted in full as the reference does. Inputs holding NaN, k above a quarter of the row,
and other axes go to the reference kernel.
"""

from __future__ import annotations

import numpy as np

from opwarden.ops.base import REGISTRY
from opwarden.ops.reduce import topk_k as _k_value
from opwarden.ops.reduce import topk_reference as _sorted

# Above this share of the row the selection saves little over sorting everything.
MAX_K_SHARE = 0.25


def _select(x2: np.ndarray, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 indices) of the k largest (smallest) of each row of a 2-D x2, ordered by
    value, ties by ascending index."""
    kth = x2.shape[1] - k if largest else k - 1
    part = np.argpartition(x2, kth, axis=1)
    idx = part[:, kth:] if largest else part[:, :k]
    vals = np.take_along_axis(x2, idx, axis=1)
    # An element equal to the k-th value may have been left out for a chosen one of higher
    # index: count the k-th value's copies in the whole row against those chosen.
    thr = np.take_along_axis(x2, part[:, kth:kth + 1], axis=1)
    eq = x2 == thr
    chosen = vals == thr
    ties = np.empty(0, np.intp)
    if np.count_nonzero(eq) != np.count_nonzero(chosen):
        ties = np.flatnonzero(np.add.reduce(eq, axis=1, dtype=np.int32)
                              != np.add.reduce(chosen, axis=1, dtype=np.int32))
    # The chosen in ascending index order, then the reference's stable sort of those k: equal
    # values keep that order, as the spec's tie rule wants.
    idx = np.sort(idx, axis=1)
    vals, order = _sorted(np.take_along_axis(x2, idx, axis=1), k, 1, largest)
    idx = np.take_along_axis(idx, order, axis=1).astype(np.int64, copy=False)
    if ties.size:  # an equal value left out of the row: the reference sorts it in full
        vals[ties], idx[ties] = _sorted(x2[ties], k, 1, largest)
    return vals, idx


def _topk(X, k: int, axis: int, largest: bool):
    """(values, indices) by selection, or None where the reference must run."""
    x = np.asarray(X)
    n = x.shape[-1] if x.ndim else 0
    if (x.ndim == 0 or axis not in (-1, x.ndim - 1) or not 0 < k <= n * MAX_K_SHARE
            or (x.dtype.kind == "f" and np.isnan(x).any())):
        return None
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    vals, idx = _select(x2, k, largest)
    shape = x.shape[:-1] + (k,)
    return vals.reshape(shape), idx.reshape(shape)


def register() -> None:
    """TopK-1/10/11 variants for numeric dtypes (largest and smallest)."""
    kw = {"device": "cpu", "dtypes": ["float32", "float64", "int32", "int64"], "priority": 10}
    for opdef in REGISTRY.versions("TopK"):
        ref = opdef.reference
        if opdef.since == 1:
            def topk(X, *, axis=-1, k=None, _ref=ref):
                got = None if k is None else _topk(X, int(k), axis, True)
                return got if got is not None else _ref(X, axis=axis, k=k)
        elif opdef.since == 10:
            def topk(X, K, *, axis=-1, _ref=ref):
                got = _topk(X, _k_value(K), axis, True)
                return got if got is not None else _ref(X, K, axis=axis)
        else:
            def topk(X, K, *, axis=-1, largest=1, sorted=1, _ref=ref):  # noqa: A002 - spec name
                got = _topk(X, _k_value(K), axis, bool(largest))
                return got if got is not None else _ref(X, K, axis=axis, largest=largest,
                                                        sorted=sorted)
        opdef.kernel(name="topk.cpu.select", **kw)(topk)
