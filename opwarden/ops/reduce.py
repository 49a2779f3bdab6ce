"""Operators: reduce family (Reduce*, ArgMax/ArgMin, TopK, CumSum/CumProd)."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.grad import away_from_zero, differentiable, fit, int64, positive

# Low-precision floats accumulate in float32 and round once at the end.
_WIDEN = {np.dtype(np.float16): np.dtype(np.float32)}
try:  # ml_dtypes registers bfloat16 with NumPy (imported via opwarden.dtypes)
    import ml_dtypes

    _WIDEN[np.dtype(ml_dtypes.bfloat16)] = np.dtype(np.float32)
except ImportError:  # pragma: no cover
    pass

REDUCE = Contract(nan="propagate", overflow="wrap", allowed={"keepdims": one_of(0, 1)})
REDUCE_IN = Contract(
    nan="propagate",
    overflow="wrap",
    allowed={"keepdims": one_of(0, 1), "noop_with_empty_axes": one_of(0, 1)},
)
# Log of a negative sum / zero creates NaN / -inf from finite inputs.
REDUCE_LOG = Contract(nan="produce", allowed={"keepdims": one_of(0, 1)})
REDUCE_LOG_IN = Contract(
    nan="produce", allowed={"keepdims": one_of(0, 1), "noop_with_empty_axes": one_of(0, 1)}
)


def _work_dtype(dt: np.dtype) -> np.dtype:
    return _WIDEN.get(np.dtype(dt), np.dtype(dt))


def _is_float(dt: np.dtype) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt in _WIDEN


def _norm_axes(axes, ndim: int) -> tuple[int, ...]:
    """Normalise (possibly negative) axes, rejecting out-of-range and repeated ones."""
    out = []
    for a in axes:
        a = int(a)
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise KernelError(f"axis {a} is out of range for a tensor of rank {ndim}")
        a = a + ndim if a < 0 else a
        if a in out:
            raise KernelError(f"axis {a} is repeated in axes {list(axes)}")
        out.append(a)
    if ndim == 0:
        return ()
    return tuple(sorted(out))


def _axes_from_attr(data: np.ndarray, axes) -> tuple[int, ...]:
    """Axes given as an attribute (Reduce*-1/11/13): missing or empty means every axis."""
    if axes is None or len(axes) == 0:
        return tuple(range(data.ndim))
    return _norm_axes(axes, data.ndim)


def _axes_from_input(data: np.ndarray, axes, noop_with_empty_axes: int) -> tuple[int, ...]:
    """Axes given as an optional input (ReduceSum-13, others-18).

    Missing or empty axes reduce everything, or nothing when noop_with_empty_axes is set
    (an empty tuple: the composite steps still run, the reduction is the identity).
    """
    if axes is None or np.asarray(axes).size == 0:
        return () if noop_with_empty_axes else tuple(range(data.ndim))
    axes = np.asarray(axes)
    if axes.dtype.kind not in "iu":
        raise KernelError(f"axes must be an integer tensor, got {axes.dtype}")
    return _norm_axes(axes.reshape(-1).tolist(), data.ndim)


def _finish(y, keepdims: int, axes: tuple[int, ...], dtype) -> np.ndarray:
    """Drop reduced axes unless keepdims, and cast to the output dtype."""
    y = np.asarray(y)
    if not keepdims and axes:
        y = np.squeeze(y, axis=axes)
    with np.errstate(invalid="ignore", over="ignore"):  # e.g. log(0) = -inf into an int type
        return np.asarray(y.astype(dtype, copy=False))


def _sum(x, axes):
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)


# Each kernel: (data with working dtype, axes) -> reduced array with keepdims=True.
def _k_sum(x, axes):
    return _sum(x, axes)


def _k_mean(x, axes):
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    s = _sum(x, axes)
    if x.dtype.kind in "iu":
        # Integer mean truncates toward zero (as a cast of the exact quotient would);
        # an empty set has no defined mean, we return 0.
        if n == 0:
            return np.zeros_like(s)
        if x.dtype.kind == "u":
            return s // x.dtype.type(n)
        q = np.abs(s) // n
        return np.where(s < 0, -q, q).astype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / x.dtype.type(n)  # 0/0 -> NaN for an empty float set


def _k_prod(x, axes):
    return np.prod(x, axis=axes, keepdims=True, dtype=x.dtype)


def _extreme_init(dt: np.dtype, largest: bool):
    """Identity of max (resp. min): -inf/+inf for floats, the type's bound for ints, bool."""
    if dt.kind == "b":
        return not largest
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return info.min if largest else info.max
    return -np.inf if largest else np.inf


def _k_max(x, axes):
    return np.max(x, axis=axes, keepdims=True, initial=_extreme_init(x.dtype, True))


def _k_min(x, axes):
    return np.min(x, axis=axes, keepdims=True, initial=_extreme_init(x.dtype, False))


def _k_l1(x, axes):
    return _sum(np.abs(x), axes)


def _k_sum_square(x, axes):
    return _sum(x * x, axes)


def _k_l2(x, axes):
    s = _sum(x * x, axes)
    if x.dtype.kind in "iu":
        # Integer types: the root of the integer sum, truncated back to the type.
        return np.sqrt(s.astype(np.float64))
    return np.sqrt(s)


def _k_log_sum(x, axes):
    s = _sum(x, axes)
    if x.dtype.kind in "iu":
        s = s.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(s)


def _k_log_sum_exp(x, axes):
    if x.dtype.kind in "iu":
        x = x.astype(np.float64)
    # Shift by the max for stability; an infinite or empty max (all -inf / empty set) shifts by 0.
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, x.dtype.type(0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.sum(np.exp(x - shift), axis=axes, keepdims=True)
        return np.log(s) + shift


def _reduce(kernel, data: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    data = np.asarray(data)
    x = data.astype(_work_dtype(data.dtype), copy=False)
    return _finish(kernel(x, axes), keepdims, axes, data.dtype)


def _define_reduce(name: str, kernel, attr_since: int, input_since: int, log: bool = False):
    """Register the attribute-axes and input-axes versions of one Reduce* operator."""
    c_attr, c_in = (REDUCE_LOG, REDUCE_LOG_IN) if log else (REDUCE, REDUCE_IN)

    def by_attr(data, *, axes=None, keepdims=1):
        return _reduce(kernel, data, _axes_from_attr(data, axes), keepdims)

    def by_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(kernel, data, _axes_from_input(data, axes, noop_with_empty_axes), keepdims)

    by_attr.__doc__ = f"{name} over the `axes` attribute (ONNX {name}-{attr_since})."
    by_input.__doc__ = f"{name} over the optional `axes` input (ONNX {name}-{input_since})."
    by_attr.__name__ = f"{name}_{attr_since}"
    by_input.__name__ = name
    return (
        op(name, since=attr_since, contract=c_attr)(by_attr),
        op(name, since=input_since, contract=c_in)(by_input),
    )


ReduceSum_1, ReduceSum = _define_reduce("ReduceSum", _k_sum, 1, 13)
ReduceMean_1, ReduceMean = _define_reduce("ReduceMean", _k_mean, 1, 18)
ReduceProd_1, ReduceProd = _define_reduce("ReduceProd", _k_prod, 1, 18)
ReduceMax_1, ReduceMax = _define_reduce("ReduceMax", _k_max, 1, 18)
ReduceMin_1, ReduceMin = _define_reduce("ReduceMin", _k_min, 1, 18)
ReduceL1_1, ReduceL1 = _define_reduce("ReduceL1", _k_l1, 1, 18)
ReduceL2_1, ReduceL2 = _define_reduce("ReduceL2", _k_l2, 1, 18)
ReduceSumSquare_1, ReduceSumSquare = _define_reduce("ReduceSumSquare", _k_sum_square, 1, 18)
ReduceLogSum_1, ReduceLogSum = _define_reduce("ReduceLogSum", _k_log_sum, 1, 18, log=True)
ReduceLogSumExp_1, ReduceLogSumExp = _define_reduce(
    "ReduceLogSumExp", _k_log_sum_exp, 1, 18, log=True
)


# ---------------------------------------------------------------- ArgMax / ArgMin

ARG_1 = Contract(nan="none", allowed={"keepdims": one_of(0, 1)})
ARG = Contract(nan="none", allowed={"keepdims": one_of(0, 1), "select_last_index": one_of(0, 1)})


def _arg(data, axis: int, keepdims: int, select_last_index: int, largest: bool) -> np.ndarray:
    data = np.asarray(data)
    if data.ndim == 0:
        raise KernelError("ArgMax/ArgMin need an input of rank >= 1")
    ax = _norm_axes([axis], data.ndim)[0]
    n = data.shape[ax]
    if n == 0:
        raise KernelError(f"cannot take ArgMax/ArgMin over the empty axis {ax}")
    x = data
    if x.dtype in _WIDEN:
        x = x.astype(np.float32)  # exact widening; NumPy's arg* on custom dtypes is unreliable
    fn = np.argmax if largest else np.argmin
    if select_last_index:
        # The last extreme index is the first one in the reversed axis.
        idx = (n - 1) - fn(np.flip(x, axis=ax), axis=ax)
    else:
        idx = fn(x, axis=ax)
    idx = np.asarray(idx, dtype=np.int64)
    if keepdims:
        idx = np.expand_dims(idx, ax)
    return idx


@op("ArgMax", since=1, contract=ARG_1)
def ArgMax_1(data, *, axis=0, keepdims=1):
    """Index of the first maximum along `axis` (ONNX ArgMax-1/11)."""
    return _arg(data, axis, keepdims, 0, True)


@op("ArgMax", since=12, contract=ARG)
def ArgMax(data, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the first (or last) maximum along `axis` (ONNX ArgMax-12/13)."""
    return _arg(data, axis, keepdims, select_last_index, True)


@op("ArgMin", since=1, contract=ARG_1)
def ArgMin_1(data, *, axis=0, keepdims=1):
    """Index of the first minimum along `axis` (ONNX ArgMin-1/11)."""
    return _arg(data, axis, keepdims, 0, False)


@op("ArgMin", since=12, contract=ARG)
def ArgMin(data, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the first (or last) minimum along `axis` (ONNX ArgMin-12/13)."""
    return _arg(data, axis, keepdims, select_last_index, False)


# ---------------------------------------------------------------- TopK


def _topk_workspace(x_shape, *_shapes, **_attrs) -> int:
    # Two int64 argsort index arrays the size of X.
    return 16 * int(np.prod(x_shape, dtype=np.int64))


TOPK_1 = Contract(nan="propagate", workspace_bytes=_topk_workspace)
TOPK = Contract(
    nan="propagate",
    workspace_bytes=_topk_workspace,
    allowed={"largest": one_of(0, 1), "sorted": one_of(0, 1)},
)


def topk_reference(X, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X)
    if X.ndim == 0:
        raise KernelError("TopK needs an input of rank >= 1")
    ax = _norm_axes([axis], X.ndim)[0]
    n = X.shape[ax]
    if not 0 <= k <= n:
        raise KernelError(f"TopK: k={k} is out of range for axis {ax} of size {n}")
    x = X.astype(np.float32) if X.dtype in _WIDEN else X
    if largest:
        # Descending with ties broken by the lower index: a stable ascending sort of the
        # reversed axis, read backwards, lists equal values in increasing original index.
        rev = np.argsort(np.flip(x, axis=ax), axis=ax, kind="stable")
        order = (n - 1) - np.flip(rev, axis=ax)
    else:
        order = np.argsort(x, axis=ax, kind="stable")
    idx = np.take(order, np.arange(k), axis=ax).astype(np.int64)
    values = np.take_along_axis(X, idx, axis=ax)
    return np.asarray(values), idx


def topk_k(K) -> int:
    K = np.asarray(K)
    if K.size != 1 or K.dtype.kind not in "iu":
        raise KernelError(f"TopK: K must be a single int64 value, got shape {K.shape} {K.dtype}")
    return int(K.reshape(-1)[0])


@op("TopK", since=1, contract=TOPK_1)
def TopK_1(X, *, axis=-1, k=None):
    """The k largest elements along `axis`, k an attribute (ONNX TopK-1)."""
    if k is None:
        raise KernelError("TopK-1 needs the attribute k")
    return topk_reference(X, int(k), axis, True)


@op("TopK", since=10, contract=TOPK_1)
def TopK_10(X, K, *, axis=-1):
    """The K largest elements along `axis`, K an input (ONNX TopK-10)."""
    return topk_reference(X, topk_k(K), axis, True)


@op("TopK", since=11, contract=TOPK)
def TopK(X, K, *, axis=-1, largest=1, sorted=1):
    """The K largest or smallest elements along `axis`, sorted (ONNX TopK-11/24).

    Unsorted output order is unspecified by the spec, so sorted order is returned either way.
    """
    return topk_reference(X, topk_k(K), axis, bool(largest))


def _topk_rows(rng):
    """Inputs reaching every path of the TopK kernels: a few of many (selection), ties across
    the k-th place, NaN, integers, k above a quarter of the row, another axis."""
    wide = rng.standard_normal((6, 400)).astype(np.float32)
    ties = rng.integers(0, 5, (5, 64)).astype(np.float32)  # many equal values
    nan = rng.standard_normal((3, 50)).astype(np.float32)
    nan[1, 7] = np.nan
    ints = rng.integers(-1000, 1000, (4, 200)).astype(np.int64)
    small = rng.standard_normal((3, 4, 9)).astype(np.float64)
    return [(wide, 7, -1, "a few of many"), (ties, 6, -1, "ties at the k-th place"),
            (nan, 3, -1, "NaN"), (ints, 5, -1, "int64"), (small, 7, -1, "k above n/4"),
            (small, 2, 1, "middle axis"), (wide, 0, -1, "k = 0")]


@TopK_1.samples
def _topk_1_samples(rng):
    for x, k, axis, label in _topk_rows(rng):
        if x.dtype == np.float32 or x.dtype == np.float64:
            yield Sample([x], {"k": k, "axis": axis}, label=label, noutputs=2)


@TopK_10.samples
def _topk_10_samples(rng):
    for x, k, axis, label in _topk_rows(rng):
        if x.dtype.kind == "f":
            yield Sample([x, np.array([k], np.int64)], {"axis": axis}, label=label, noutputs=2)


@TopK.samples
def _topk_samples(rng):
    for x, k, axis, label in _topk_rows(rng):
        for largest in (1, 0):
            yield Sample([x, np.array([k], np.int64)], {"axis": axis, "largest": largest},
                         label=f"{label}, largest={largest}", noutputs=2)


# ---------------------------------------------------------------- CumSum / CumProd

CUM = Contract(
    nan="propagate", overflow="wrap", allowed={"exclusive": one_of(0, 1), "reverse": one_of(0, 1)}
)


def _axis_value(x: np.ndarray, axis) -> int:
    a = np.asarray(axis)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise KernelError(f"axis must be a single int32/int64 value, got shape {a.shape}")
    if x.ndim == 0:
        raise KernelError("the input must have rank >= 1")
    return _norm_axes([int(a.reshape(-1)[0])], x.ndim)[0]


def _cumulate(x, axis, exclusive: int, reverse: int, ufunc) -> np.ndarray:
    x = np.asarray(x)
    ax = _axis_value(x, axis)
    w = x.astype(_work_dtype(x.dtype), copy=False)
    if reverse:
        w = np.flip(w, axis=ax)
    y = ufunc.accumulate(w, axis=ax, dtype=w.dtype)
    if exclusive:
        # Shift by one along the axis, filling the front with the operation's identity.
        ident = np.full_like(np.take(y, [0], axis=ax), ufunc.identity)
        y = np.concatenate([ident, np.take(y, np.arange(y.shape[ax] - 1), axis=ax)], axis=ax)
    if reverse:
        y = np.flip(y, axis=ax)
    return np.ascontiguousarray(y.astype(x.dtype, copy=False))


@op("CumSum", since=11, contract=CUM)
def CumSum(x, axis, *, exclusive=0, reverse=0):
    """Cumulative sum along `axis`, optionally exclusive and/or reversed (ONNX CumSum-11/14)."""
    return _cumulate(x, axis, exclusive, reverse, np.add)


@op("CumProd", since=26, contract=CUM)
def CumProd(x, axis, *, exclusive=0, reverse=0):
    """Cumulative product along `axis`, optionally exclusive and/or reversed (ONNX CumProd-26)."""
    return _cumulate(x, axis, exclusive, reverse, np.multiply)


# ---------------------------------------------------------------- backward rules


def _grad_axes(ctx, attrs) -> tuple[int, ...] | None:
    """The reduced axes (normalised), or None for 'no-op' (noop_with_empty_axes)."""
    X = np.asarray(ctx.inputs[0])
    if len(ctx.inputs) > 1 and ctx.inputs[1] is not None:
        axes = [int(a) for a in np.asarray(ctx.inputs[1]).reshape(-1)]
    else:
        a = attrs.get("axes")
        axes = [int(v) for v in a] if a is not None else []
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return tuple(range(X.ndim))
    return tuple(sorted(a + X.ndim if a < 0 else a for a in axes))


def _local_grad(kind, x, y, g, axes, cnt, shape):
    """d(reduction)/dx times the upstream g (both in the kept-dims shape)."""
    if kind == "sum":
        return np.broadcast_to(g, shape)
    if kind == "mean":
        return np.broadcast_to(g / max(cnt, 1), shape)
    if kind in ("max", "min"):
        mask = x == y
        n = mask.sum(axis=axes, keepdims=True) if axes else 1
        return g * mask / np.maximum(n, 1)
    if kind == "prod":
        zero = x == 0
        nz = zero.sum(axis=axes, keepdims=True) if axes else zero.astype(int)
        others = np.prod(np.where(zero, 1, x), axis=axes, keepdims=True) if axes else 1
        return np.where(zero, np.where(nz == 1, others, 0), y / np.where(zero, 1, x)) * g
    if kind == "sumsquare":
        return 2 * x * g
    if kind == "l1":
        return np.sign(x) * g
    if kind == "l2":
        return np.where(y != 0, x / np.where(y != 0, y, 1), 0) * g
    if kind == "logsum":
        return np.broadcast_to(g / np.exp(y), shape)
    return np.exp(x - y) * g  # logsumexp


def _reduction_grad(kind: str):
    def rule(ctx, dY, **attrs):
        X = np.asarray(ctx.inputs[0])
        Y = np.asarray(ctx.outputs[0])
        axes = _grad_axes(ctx, attrs)
        if axes is None:
            # no reduction: these reductions act elementwise on each value
            axes = ()
        kshape = tuple(1 if i in axes else n for i, n in enumerate(X.shape))
        g = np.asarray(dY).reshape(kshape)
        y = Y.reshape(kshape)
        x = X.astype(Y.dtype)
        cnt = math.prod(X.shape[i] for i in axes)
        with np.errstate(divide="ignore", invalid="ignore"):
            return fit(ctx, _local_grad(kind, x, y, g, axes, cnt, X.shape))

    return rule


def _reduce_grad_cases(op_type: str, since: int) -> list[Sample]:
    positive_only = op_type in ("ReduceLogSum", "ReduceProd", "ReduceL2", "ReduceL1")
    x = positive(2, 3, 4) if positive_only else away_from_zero(2, 3, 4)
    if op_type == "ReduceProd":
        x = x * np.array([1, -1, 1, -1])
    axes_in = since >= (13 if op_type == "ReduceSum" else 18)
    if axes_in:
        return [
            Sample([x, int64([1])]),
            Sample([x, int64([0, -1])], {"keepdims": 0}),
            Sample([x], label="all axes"),
        ]
    return [Sample([x], {"axes": [1]}), Sample([x], {"axes": [0, 2], "keepdims": 0}),
            Sample([x])]


for _name, _kind in (
    ("ReduceSum", "sum"), ("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"),
    ("ReduceProd", "prod"), ("ReduceSumSquare", "sumsquare"), ("ReduceL1", "l1"),
    ("ReduceL2", "l2"), ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp"),
):
    differentiable(_name, cases=_reduce_grad_cases)(_reduction_grad(_kind))


def _cumsum_grad_cases(op_type: str, since: int) -> list[Sample]:
    return [Sample([away_from_zero(3, 4), int64(1)], {"exclusive": e, "reverse": r},
                   label=f"e{e}r{r}")
            for e in (0, 1) for r in (0, 1)]


@differentiable("CumSum", cases=_cumsum_grad_cases)
def _cumsum_grad(ctx, dY, **attrs):
    axis = int(np.asarray(ctx.inputs[1]).reshape(-1)[0])
    ax = axis + dY.ndim if axis < 0 else axis
    # The adjoint of a running sum runs the other way.
    if attrs.get("reverse", 0):
        g = np.cumsum(dY, axis=ax)
    else:
        g = np.flip(np.cumsum(np.flip(dY, ax), axis=ax), ax)
    if attrs.get("exclusive", 0):
        g = g - dY
    return fit(ctx, g, None)
