"""How `opwarden compare` judges one value of ours against the peer's.

Tensors agree when dtype and shape are equal and, for floats, every element satisfies
``|ours - theirs| <= atol + rtol * |theirs|`` with NaN where the peer has NaN and the same
infinities; integers, booleans and strings must be equal. Sequences agree element by element,
optionals when both are empty or both hold agreeing values. The relative error is reported
over the elements where ``|theirs| > atol`` (elsewhere a relative error says nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def verdict(status: str, detail: str = "", max_abs: float | None = None,
            max_rel: float | None = None, shape: Any = None, dtype: str | None = None,
            where: Any = None) -> dict[str, Any]:
    """One comparison result (status: "agree" or "diverge")."""
    return {"status": status, "detail": detail, "max_abs": max_abs, "max_rel": max_rel,
            "shape": shape, "dtype": dtype, "where": where}


def describe(x: Any) -> tuple[Any, str | None]:
    """(shape, dtype) of a value for the report; sequences as [len] of their first element."""
    if isinstance(x, np.ndarray):
        return list(x.shape), _dtype(x)
    if isinstance(x, (list, tuple)):
        inner = describe(x[0])[1] if x else None
        return [len(x)], f"seq({inner or '?'})"
    if x is None:
        return None, "optional(empty)"
    arr = np.asarray(x)
    return list(arr.shape), _dtype(arr)


def _dtype(a: np.ndarray) -> str:
    return "string" if a.dtype.kind in "USO" else str(a.dtype)


def compare_value(ours: Any, theirs: Any, atol: float, rtol: float) -> dict[str, Any]:
    """The verdict on one value (see the module doc)."""
    if ours is None or theirs is None:
        if ours is None and theirs is None:
            return verdict("agree", "both empty optionals", dtype="optional(empty)")
        side = "ours" if ours is None else "the peer's"
        return verdict("diverge", f"{side} is an empty optional, the other is not",
                       *(None, None), *describe(theirs if ours is None else ours))
    if isinstance(theirs, (list, tuple)) or isinstance(ours, (list, tuple)):
        return _compare_sequence(ours, theirs, atol, rtol)
    if isinstance(theirs, dict) or isinstance(ours, dict):
        same = isinstance(ours, dict) and isinstance(theirs, dict) and ours.keys() == theirs.keys()
        ok = same and all(np.array_equal(np.asarray(ours[k]), np.asarray(theirs[k]))
                          for k in theirs)
        return verdict("agree" if ok else "diverge", "" if ok else "maps differ", dtype="map")
    return compare_arrays(np.asarray(ours), np.asarray(theirs), atol, rtol)


def _compare_sequence(ours: Any, theirs: Any, atol: float, rtol: float) -> dict[str, Any]:
    shape, dtype = describe(theirs)
    if not isinstance(ours, (list, tuple)) or not isinstance(theirs, (list, tuple)):
        return verdict("diverge", "one side is a sequence, the other is not", shape=shape,
                       dtype=dtype)
    if len(ours) != len(theirs):
        return verdict("diverge", f"sequence length {len(ours)} vs {len(theirs)}",
                       shape=shape, dtype=dtype)
    worst = verdict("agree", f"{len(theirs)} elements", 0.0, 0.0, shape, dtype)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        v = compare_value(a, b, atol, rtol)
        for k in ("max_abs", "max_rel"):
            if v[k] is not None:
                worst[k] = max(worst[k] or 0.0, v[k])
        if v["status"] != "agree" and worst["status"] == "agree":
            worst.update(status=v["status"], detail=f"element {i}: {v['detail']}",
                         where=[i, *(v["where"] or [])])
    return worst


def compare_arrays(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """Verdict on two arrays (ours `a`, the peer's `b`)."""
    shape, dtype = list(b.shape), _dtype(b)
    if _dtype(a) != dtype:
        return verdict("diverge", f"dtype {_dtype(a)} vs {dtype}", shape=shape, dtype=dtype)
    if a.shape != b.shape:
        return verdict("diverge", f"shape {list(a.shape)} vs {shape}", shape=shape, dtype=dtype)
    if a.size == 0:
        return verdict("agree", "empty", 0.0, 0.0, shape, dtype)
    if b.dtype.kind in "USOb" or (b.dtype.kind in "iu"):
        return _compare_exact(a, b, shape, dtype)
    return _compare_floats(a, b, atol, rtol, shape, dtype)


def _compare_exact(a: np.ndarray, b: np.ndarray, shape: list[int], dtype: str) -> dict[str, Any]:
    bad = a != b
    if b.dtype.kind in "iu":
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = float(diff.max())
    else:
        max_abs = float(bad.any())
    if not bad.any():
        return verdict("agree", "", max_abs, 0.0, shape, dtype)
    idx = [int(i) for i in np.unravel_index(int(np.argmax(bad)), b.shape)]
    return verdict("diverge", f"{int(bad.sum())} of {b.size} elements differ; first at "
                   f"{idx}: ours {_item(a[tuple(idx)])} vs {_item(b[tuple(idx)])}",
                   max_abs, None, shape, dtype, idx)


def _compare_floats(a: np.ndarray, b: np.ndarray, atol: float, rtol: float,
                    shape: list[int], dtype: str) -> dict[str, Any]:
    x = a.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
    y = b.astype(x.dtype)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    finite = np.isfinite(x) & np.isfinite(y)
    with np.errstate(all="ignore"):
        diff = np.where(finite, np.abs(x - y), 0.0)
        allowed = atol + rtol * np.abs(y)
        bad = (nan_x != nan_y) | (~finite & ~nan_x & ~nan_y & (x != y)) | (diff > allowed)
        big = np.abs(y) > atol
        rel = np.where(finite & big, diff / np.where(big, np.abs(y), 1.0), 0.0)
    max_abs, max_rel = float(diff.max()), float(rel.max())
    if not bad.any():
        return verdict("agree", "", max_abs, max_rel, shape, dtype)
    excess = np.where(bad, np.where(finite, diff - allowed, np.inf), -np.inf)
    idx = [int(i) for i in np.unravel_index(int(np.argmax(excess)), b.shape)]
    detail = (f"{int(bad.sum())} of {b.size} elements outside atol+rtol*|ref|; worst at {idx}: "
              f"ours {_item(a[tuple(idx)])} vs {_item(b[tuple(idx)])}")
    if (nan_x != nan_y).any():
        detail += f"; NaN in {int((nan_x & ~nan_y).sum())} places the peer has none, " \
                  f"missing in {int((nan_y & ~nan_x).sum())}"
    return verdict("diverge", detail, max_abs, max_rel, shape, dtype, idx)


def _item(v: Any) -> str:
    v = v.item() if hasattr(v, "item") else v
    return f"{v:.6g}" if isinstance(v, float) else repr(v)
