"""Operators: index family (gather, scatter, slice, selection and one-hot ops)."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import axis_index, ints
from opwarden.ops.grad import away_from_zero, differentiable, index_traced, int64

# Opset 16-17 spec allows none/add/mul only, but torch.onnx (TorchScript exporter) emits
# scatter_reduce(reduce="amax"/"amin") as reduction="max"/"min" at opset 16 and 17, and
# onnxruntime runs such models; accept them with the opset-18 meaning.
REDUCTIONS_16_LENIENT = one_of("none", "add", "mul", "max", "min")
REDUCTIONS_18 = one_of("none", "add", "mul", "max", "min")
# In-place ufunc for each scatter reduction (ufunc.at applies duplicates one after another).
_REDUCE_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


# ---------------------------------------------------------------------------------------------
# helpers


def _norm_indices(indices, dim, what: str) -> np.ndarray:
    """Indices as int64 with negatives wrapped; any outside [-dim, dim) is a KernelError.

    `dim` may be an int or an array broadcastable against `indices` (per-column dims).
    """
    idx = np.asarray(indices).astype(np.int64, copy=False)
    dim = np.asarray(dim, dtype=np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if np.any(bad):
        pos = tuple(int(p) for p in np.argwhere(bad)[0])
        value = int(idx[pos])
        bound = int(np.broadcast_to(dim, idx.shape)[pos])
        raise KernelError(
            f"{what}: index {value} at position {list(pos)} is out of range [-{bound}, {bound - 1}]"
        )
    return np.where(idx < 0, idx + dim, idx)


def _along_axis_index(idx: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """Full index tuple addressing data[..., idx[...] at `axis`, ...] elementwise."""
    grids = []
    for d, n in enumerate(idx.shape):
        if d == axis:
            grids.append(idx)
        else:
            shape = [1] * idx.ndim
            shape[d] = n
            grids.append(np.arange(n).reshape(shape))
    return tuple(grids)


# ---------------------------------------------------------------------------------------------
# Gather family


@op("Gather", since=1)
def Gather(data, indices, *, axis=0):
    """Take entries along `axis` at `indices`, negatives wrap (ONNX Gather-1/11/13)."""
    a = axis_index(axis, data.ndim)
    try:
        # np.take wraps a negative index once and raises on any outside [-dim, dim): ONNX's
        # rule, without the per-call wrapping arrays (shape subgraphs gather one dim at a time)
        return np.take(data, np.asarray(indices), axis=a)
    except IndexError:
        _norm_indices(indices, data.shape[a], "Gather input 'indices'")  # the clear error
        raise


@op("GatherElements", since=11)
def GatherElements(data, indices, *, axis=0):
    """out[i][j] = data[indices[i][j]][j] (for axis 0) (ONNX GatherElements-11/13)."""
    a = axis_index(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise KernelError(f"GatherElements: indices rank {indices.ndim} != data rank {data.ndim}")
    for d in range(data.ndim):
        if d != a and indices.shape[d] > data.shape[d]:
            raise KernelError(
                f"GatherElements: indices shape {indices.shape} exceeds data shape "
                f"{data.shape} on axis {d}"
            )
    idx = _norm_indices(indices, data.shape[a], "GatherElements input 'indices'")
    return data[_along_axis_index(idx, a)]


@op("GatherND", since=11)
def GatherND(data, indices, *, batch_dims=0):
    """Gather slices addressed by the last dim of `indices` after `batch_dims` shared leading
    dims (ONNX GatherND-11/12/13)."""
    b = int(batch_dims)
    if indices.ndim < 1 or indices.ndim <= b or data.ndim <= b:
        raise KernelError(
            f"GatherND: batch_dims {b} too large for data {data.shape}, indices {indices.shape}"
        )
    if data.shape[:b] != indices.shape[:b]:
        raise KernelError(
            f"GatherND: batch dims of data {data.shape} and indices {indices.shape} differ"
        )
    k = indices.shape[-1]
    if k > data.ndim - b:
        raise KernelError(f"GatherND: index tuples of length {k} exceed data rank {data.ndim - b}")
    nb = math.prod(data.shape[:b])
    d = data.reshape((nb,) + data.shape[b:])
    idx = indices.reshape(nb, math.prod(indices.shape[b:-1]), k)
    idx = _norm_indices(idx, np.asarray(data.shape[b : b + k]), "GatherND input 'indices'")
    # Broadcast batch ids to (nb, m) so that k == 0 (whole slices) also yields (nb, m, ...).
    batch = np.broadcast_to(np.arange(nb).reshape(nb, 1), idx.shape[:2])
    out = d[(batch,) + tuple(idx[..., j] for j in range(k))]
    return out.reshape(indices.shape[:-1] + data.shape[b + k :])


# ---------------------------------------------------------------------------------------------
# Scatter family


def _scatter_elements(data, indices, updates, axis: int, reduction: str) -> np.ndarray:
    a = axis_index(axis, data.ndim)
    if indices.shape != updates.shape:
        raise KernelError(
            f"ScatterElements: indices shape {indices.shape} != updates shape {updates.shape}"
        )
    if indices.ndim != data.ndim:
        raise KernelError(f"ScatterElements: indices rank {indices.ndim} != data rank {data.ndim}")
    for d in range(data.ndim):
        if d != a and indices.shape[d] > data.shape[d]:
            raise KernelError(
                f"ScatterElements: indices shape {indices.shape} exceeds data shape "
                f"{data.shape} on axis {d}"
            )
    idx = _norm_indices(indices, data.shape[a], "ScatterElements input 'indices'")
    out = data.copy()
    where = _along_axis_index(idx, a)
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCE_UFUNC[reduction].at(out, where, updates)
    return out


@op("Scatter", since=9)
def Scatter(data, indices, updates, *, axis=0):
    """Deprecated alias of ScatterElements without reduction (ONNX Scatter-9/11)."""
    return _scatter_elements(data, indices, updates, axis, "none")


@op("ScatterElements", since=11)
def ScatterElements_11(data, indices, updates, *, axis=0):
    """Copy of data with updates written at `indices` along `axis` (ONNX ScatterElements-11/13)."""
    return _scatter_elements(data, indices, updates, axis, "none")


@op("ScatterElements", since=16, contract=Contract(allowed={"reduction": REDUCTIONS_16_LENIENT}))
def ScatterElements_16(data, indices, updates, *, axis=0, reduction="none"):
    """ScatterElements with reduction none/add/mul (ONNX ScatterElements-16; max/min tolerated)."""
    return _scatter_elements(data, indices, updates, axis, reduction)


@op("ScatterElements", since=18, contract=Contract(allowed={"reduction": REDUCTIONS_18}))
def ScatterElements(data, indices, updates, *, axis=0, reduction="none"):
    """ScatterElements with reduction none/add/mul/max/min (ONNX ScatterElements-18)."""
    return _scatter_elements(data, indices, updates, axis, reduction)


def _scatter_nd(data, indices, updates, reduction: str) -> np.ndarray:
    if indices.ndim < 1:
        raise KernelError("ScatterND: indices must have rank >= 1")
    k = indices.shape[-1]
    if k > data.ndim:
        raise KernelError(f"ScatterND: index tuples of length {k} exceed data rank {data.ndim}")
    expect = indices.shape[:-1] + data.shape[k:]
    if updates.shape != expect:
        raise KernelError(f"ScatterND: updates shape {updates.shape} != expected {expect}")
    idx = indices.reshape(-1, k)
    idx = _norm_indices(idx, np.asarray(data.shape[:k]), "ScatterND input 'indices'")
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    where = tuple(idx[:, j] for j in range(k))
    out = data.copy()
    if reduction == "none":
        out[where] = upd
    else:
        _REDUCE_UFUNC[reduction].at(out, where, upd)
    return out


@op("ScatterND", since=11)
def ScatterND_11(data, indices, updates):
    """out = data with out[indices[i]] = updates[i] (ONNX ScatterND-11/13)."""
    return _scatter_nd(data, indices, updates, "none")


@op("ScatterND", since=16, contract=Contract(allowed={"reduction": REDUCTIONS_16_LENIENT}))
def ScatterND_16(data, indices, updates, *, reduction="none"):
    """ScatterND with reduction none/add/mul (ONNX ScatterND-16; max/min tolerated)."""
    return _scatter_nd(data, indices, updates, reduction)


@op("ScatterND", since=18, contract=Contract(allowed={"reduction": REDUCTIONS_18}))
def ScatterND(data, indices, updates, *, reduction="none"):
    """ScatterND with reduction none/add/mul/max/min (ONNX ScatterND-18)."""
    return _scatter_nd(data, indices, updates, reduction)


@op("TensorScatter", since=24, contract=Contract(allowed={"mode": one_of("linear", "circular")}))
def TensorScatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """Write `update` into a copy of the cache along the sequence `axis` at each batch entry's
    write index (ONNX TensorScatter-24)."""
    r = past_cache.ndim
    a = axis_index(axis, r, "TensorScatter axis")
    if a == 0:
        raise KernelError("TensorScatter: axis must not be the batch axis 0")
    if update.ndim != r or any(update.shape[d] != past_cache.shape[d] for d in range(r) if d != a):
        raise KernelError(
            f"TensorScatter: update shape {update.shape} incompatible with cache "
            f"{past_cache.shape} on axis {a}"
        )
    batch, max_len, seq = past_cache.shape[0], past_cache.shape[a], update.shape[a]
    if seq > max_len:
        raise KernelError(f"TensorScatter: update length {seq} exceeds cache length {max_len}")
    if write_indices is None:
        start = np.zeros(batch, dtype=np.int64)
    else:
        start = np.asarray(write_indices).astype(np.int64).reshape(-1)
        if start.shape != (batch,):
            raise KernelError(
                f"TensorScatter: write_indices shape {start.shape} != batch size ({batch},)"
            )
        if np.any(start < 0):
            raise KernelError(f"TensorScatter: write_indices {start.tolist()} must be >= 0")
    pos = start[:, None] + np.arange(seq)[None, :]
    if mode == "circular":
        pos = pos % max_len
    elif seq and np.any(pos >= max_len):
        b = int(np.argmax(pos.max(axis=1) >= max_len))
        raise KernelError(
            f"TensorScatter: input 'write_indices' value {int(start[b])} for batch {b} writes "
            f"past the cache length {max_len}"
        )
    out = past_cache.copy()
    # Move the sequence axis next to the batch axis; both are then addressed by (b, pos).
    out_v = np.moveaxis(out, a, 1)
    out_v[np.arange(batch)[:, None], pos] = np.moveaxis(update, a, 1)
    return out


# ---------------------------------------------------------------------------------------------
# Slice


def _slice(data: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    r = data.ndim
    if len(starts) != len(ends):
        raise KernelError(f"Slice: starts {starts} and ends {ends} differ in length")
    axes = list(range(len(starts))) if not axes else axes
    steps = [1] * len(starts) if not steps else steps
    if not len(axes) == len(steps) == len(starts):
        raise KernelError("Slice: starts, ends, axes and steps must have the same length")
    sl = [slice(None)] * r
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis_index(a, r, "Slice axis")
        if a in seen:
            raise KernelError(f"Slice: axis {a} repeated in axes {axes}")
        seen.add(a)
        if st == 0:
            raise KernelError(f"Slice: step for axis {a} must not be 0")
        dim = data.shape[a]
        if dim == 0:
            sl[a] = slice(0, 0)
            continue
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            sl[a] = slice(s, e, st)
        else:
            # Reverse slicing clamps start to [0, dim-1] and end to [-1, dim-1], where -1
            # means "through index 0" (Python's None, not its wrap-around -1).
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            sl[a] = slice(s, None if e < 0 else e, st)
    return data[tuple(sl)].copy()


@op("Slice", since=1)
def Slice_1(data, *, starts=None, ends=None, axes=None):
    """Slice by `starts`/`ends`/`axes` attributes, step 1 (ONNX Slice-1)."""
    return _slice(data, ints(starts, "starts"), ints(ends, "ends"), ints(axes, "axes"), None)


@op("Slice", since=10)
def Slice(data, starts, ends, axes=None, steps=None):
    """Slice by `starts`/`ends`/`axes`/`steps` inputs, clamped per spec (ONNX Slice-10/11/13)."""
    return _slice(
        data,
        ints(starts, "starts"),
        ints(ends, "ends"),
        ints(axes, "axes") if axes is not None else None,
        ints(steps, "steps") if steps is not None else None,
    )


# ---------------------------------------------------------------------------------------------
# Selection


@op("Compress", since=9)
def Compress(input, condition, *, axis=None):
    """Keep slices along `axis` (or of the flattened input) where condition is true
    (ONNX Compress-9/11)."""
    cond = np.asarray(condition).astype(np.bool_).reshape(-1)
    x = input.reshape(-1) if axis is None else input
    a = 0 if axis is None else axis_index(axis, input.ndim)
    dim = x.shape[a]
    if cond.size > dim:
        if np.any(cond[dim:]):
            raise KernelError(
                f"Compress: condition selects index {int(np.argmax(cond[dim:])) + dim}, "
                f"beyond dimension {dim}"
            )
        cond = cond[:dim]
    # A shorter condition selects only among the first len(condition) slices.
    keep = np.flatnonzero(cond)
    return np.take(x, keep, axis=a)


@op("NonZero", since=9, contract=Contract(nan="none"))
def NonZero(X):
    """Indices of non-zero elements, shape (rank, count), int64 (ONNX NonZero-9/13)."""
    x = np.asarray(X)
    if x.ndim == 0:
        # A scalar is treated as a one-element 1-D tensor (as onnxruntime does).
        x = x.reshape(1)
    return np.asarray(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


# ONNX allows only 0 and 1; ORT sorts only for 1, NumPy's truth test for any non-zero value.
@op("Unique", since=11, contract=Contract(allowed={"sorted": one_of(0, 1)}))
def Unique(X, *, axis=None, sorted=1):  # noqa: A002  (ONNX attribute name)
    """Unique values or slices with first indices, inverse indices and counts (ONNX Unique-11)."""
    if axis is None:
        x, a = X.reshape(-1), 0
    else:
        x, a = X, axis_index(axis, X.ndim)
    y, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=a
    )
    inverse = inverse.reshape(-1)
    if not sorted:
        # Reorder by first occurrence and remap inverse indices to the new positions.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=a)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    i64 = np.int64
    return y, first.astype(i64), inverse.astype(i64), counts.astype(i64)


@op("OneHot", since=9)
def OneHot(indices, depth, values, *, axis=-1):
    """One-hot encode `indices` into a new axis of size `depth`; negative indices count from
    depth, others outside [0, depth) give all off (ONNX OneHot-9/11)."""
    d = np.asarray(depth).reshape(-1)
    if d.size != 1:
        raise KernelError(f"OneHot: depth must hold one value, got shape {d.shape}")
    depth_n = int(d[0])
    if depth_n < 1:
        raise KernelError(f"OneHot: depth must be positive, got {depth_n}")
    vals = np.asarray(values).reshape(-1)
    if vals.size != 2:
        raise KernelError(f"OneHot: values must hold [off, on], got {vals.size} values")
    r = indices.ndim + 1
    a = axis_index(axis, r, "OneHot axis")
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth_n, idx)
    classes = np.arange(depth_n).reshape([depth_n if i == a else 1 for i in range(r)])
    hot = np.expand_dims(idx, a) == classes
    return np.where(hot, vals[1], vals[0]).astype(vals.dtype)


@op("ReverseSequence", since=10)
def ReverseSequence(input, sequence_lens, *, batch_axis=1, time_axis=0):
    """Reverse the first sequence_lens[b] time steps of each batch entry (ReverseSequence-10)."""
    if input.ndim < 2:
        raise KernelError(f"ReverseSequence: input must have rank >= 2, got {input.shape}")
    b_ax, t_ax = axis_index(batch_axis, input.ndim), axis_index(time_axis, input.ndim)
    if b_ax == t_ax:
        raise KernelError("ReverseSequence: batch_axis and time_axis must differ")
    x = np.moveaxis(input, (t_ax, b_ax), (0, 1))
    steps, batch = x.shape[0], x.shape[1]
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (batch,):
        raise KernelError(f"ReverseSequence: sequence_lens shape {lens.shape} != ({batch},)")
    if np.any((lens < 0) | (lens > steps)):
        bad = int(lens[np.argmax((lens < 0) | (lens > steps))])
        raise KernelError(f"ReverseSequence: sequence_lens value {bad} outside [0, {steps}]")
    t = np.arange(steps)[:, None]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # (time, batch)
    src = src.reshape(src.shape + (1,) * (x.ndim - 2))
    y = np.take_along_axis(x, np.broadcast_to(src, x.shape), axis=0)
    return np.moveaxis(y, (0, 1), (t_ax, b_ax)).copy()


# ---------------------------------------------------------------------------------------------
# Backward rules


def _selection_grad_cases(op_type: str, since: int) -> list[Sample]:
    r, i = away_from_zero, int64
    x = r(2, 3, 4)
    if op_type == "Slice":
        if since < 10:
            return [Sample([x], {"starts": [0, 1], "ends": [2, 3], "axes": [0, 2]})]
        return [Sample([x, i([1, 0]), i([3, 4]), i([1, 2]), i([1, 2])]),
                Sample([x, i([-1]), i([-100]), i([2]), i([-2])], label="negative step")]
    if op_type == "Gather":
        return [Sample([x, i([[2, 0], [2, 1]])], {"axis": 2}),
                Sample([x, i([1, -1])], {"axis": 0})]
    if op_type == "GatherElements":
        return [Sample([x, i(np.random.default_rng(0).integers(0, 3, (2, 2, 4)))], {"axis": 1})]
    if op_type == "GatherND":
        return [Sample([x, i([[0, 1], [1, 2]])])]
    if op_type == "ReverseSequence":
        return [Sample([r(4, 2, 3), i([3, 2])], {"batch_axis": 1, "time_axis": 0})]
    return [Sample([x, np.array([True, False, True])], {"axis": 1})]  # Compress


differentiable("Slice", "Gather", "GatherElements", "GatherND", "ReverseSequence", "Compress",
               cases=_selection_grad_cases)(index_traced((0,)))
