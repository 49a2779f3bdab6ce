"""Scratch of the reference kernels: what they hold beyond their outputs, from the actual inputs.

A reference kernel is plain NumPy, and NumPy builds temporaries: Resize resamples one axis at a
time through intermediates that may be far larger than input and output (a 4x4000 image to
4000x4 passes through 4000x4000), OneHot builds its mask and a copy, TopK sorts every index,
float16 MatMul/Einsum compute in float32 copies, Erf and exact Gelu go through a Python float
per element, the recurrent ops and the FFTs hold work copies, Cast and the quantizers go through
float64 and int64 copies, the string ops through Python objects per item (those rules live in
`plan.scratch_rules`). The memory limit (`plan.limits`) counts these with the outputs before the
kernel runs, so `outputs + scratch > limit` is refused, not run.

`SCRATCH` maps a default-domain op_type to f(*inputs, **attrs) -> bytes its reference kernel
holds at its peak beyond its outputs (never negative); a key "op_type-since" overrides the
plain one for the version defined at `since` (DFT-17's axis attribute defaults to 1, DFT-20's
axis input to -2). The rules read shapes and dtypes, the values only of small inputs that set
sizes (sizes, scales, depth, K, repeats, Range's bounds) and the strings of the string ops;
they allocate nothing of size. Each is an upper bound of what tracemalloc measures for the
reference kernel, within a small factor (tests/memory/test_limits_workspace.py checks both).

Reference kernels whose temporaries stay within a fraction of their outputs or inputs have no
rule (their outputs are counted already): Pad (constant: none; reflect/edge/wrap: under a fifth
of the output), CenterCropPad, Expand, ConstantOfShape, Concat, Where (broadcasts without
materializing), MatMul and Einsum of two operands in float32/float64 (BLAS or c_einsum, no
copies), ScatterND, Compress, Trilu, MaxUnpool and RoiAlign (under a third and two thirds of
their inputs and outputs). GridSample declares its own (`Contract.workspace_bytes`). Loop and
Scan count their own accumulated and stacked outputs (ops.control), and the nodes of their
bodies are checked by these same rules.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.dtypes import np_dtype_of
from opwarden.errors import MemoryLimitError, describe_bytes
from opwarden.plan.lifetimes import resolve_shape, takes_workspace, tensor_bytes
from opwarden.plan.scratch_rules import RULES

# float16/bfloat16 kernels compute in float32 copies (ops.linalg, ops.reduce, ops.image)
_HALF = frozenset({"float16", "bfloat16"})


def _arr(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _n(x: Any) -> int:
    return int(np.size(x)) if _arr(x) else 0


def _values(x: Any) -> list | None:
    """A small size-setting input's values (None: absent or too large to be one)."""
    if not _arr(x) or x.size > 64 or x.dtype.kind not in "biuf":
        return None
    return x.reshape(-1).tolist()


def _prod(dims: Any) -> int:
    return math.prod(int(d) for d in dims)


# -- Resize / Upsample ---------------------------------------------------------------------


def _work_size(dt: np.dtype, interp: bool) -> int:
    """Itemsize Resize interpolates in: float64 for float64 and integers, else float32."""
    if not interp:
        return dt.itemsize
    return 8 if dt == np.float64 or dt.kind in "iub" else 4


def _taps(mode: str, scale: float, antialias: bool) -> int:
    radius = 1 if mode == "linear" else 2
    f = min(scale, 1.0) if antialias else 1.0
    start = int(np.floor(-radius / f)) + 1
    return 2 - 2 * start


def _resize_geometry(x: np.ndarray, roi: Any, scales: Any, sizes: Any, axes: Any,
                     policy: str) -> tuple[list[int], list[float]] | None:
    """(output shape, per-axis scales) of Resize-11+, None where the kernel would refuse."""
    r = x.ndim
    ax = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    sc = None if scales is None or not np.size(scales) else _values(scales)
    sz = None if sizes is None or not np.size(sizes) else _values(sizes)
    if (sc is None) == (sz is None) or any(not 0 <= a < r for a in ax):
        return None
    out, full = list(x.shape), [1.0] * r
    if sc is not None:
        if len(sc) != len(ax) or min(sc) <= 0:
            return None
        for a, s in zip(ax, sc):
            full[a] = float(s)
            out[a] = int(np.floor(np.float32(x.shape[a]) * np.float32(s)))
        return out, full
    if sz is None or len(sz) != len(ax):
        return None
    ratios = [int(s) / x.shape[a] if x.shape[a] else 1.0 for a, s in zip(ax, sz)]
    if policy != "stretch":
        common = min(ratios) if policy == "not_larger" else max(ratios)
        ratios = [common] * len(ax)
        sz = [int(np.floor(common * x.shape[a] + 0.5)) for a in ax]
    for a, s, q in zip(ax, sz, ratios):
        out[a], full[a] = int(s), q
    return out, full


def _resample(x: np.ndarray, out: list[int], scales: list[float], mode: str, crop: bool,
              antialias: bool) -> int:
    """Peak scratch of the separable resampling (ops.image._resize_nd), axis by axis."""
    if any(d < 0 for d in out) or len(out) != x.ndim:
        return 0
    interp = mode != "nearest"
    ws = _work_size(x.dtype, interp)
    cur = list(x.shape)
    held = x.size * ws if interp else 0  # the working copy (nearest takes from X itself)
    peak = held
    for axis, (n_in, n_out) in enumerate(zip(x.shape, out)):
        if n_in == n_out and scales[axis] == 1.0 and not crop:
            continue
        cur[axis] = n_out
        new = _prod(cur) * ws
        if not interp:
            step, tables = new, 0
        else:
            k = _taps(mode, scales[axis], antialias)
            # a running sum, the previous tap's term, a gather and its weighted term
            step = new * (2 if k == 1 else 3 if k == 2 else 4)
            tables = n_out * k * 8 * 4  # index and weight tables and their intermediates
        peak = max(peak, held + step + tables)
        held = new
    out_bytes = _prod(out) * x.dtype.itemsize
    if crop:
        peak = max(peak, held * 2 + _prod(out) * (x.ndim + 1))  # outside masks and np.where
    if interp and (x.dtype.kind in "iu" or ws != x.dtype.itemsize):
        # rounded and clipped (integers) then cast back
        peak = max(peak, held * (3 if x.dtype.kind in "iu" else 1) + out_bytes)
    return max(peak - out_bytes, 0)


def _resize(x: Any, *rest: Any, mode: str = "nearest", antialias: int = 0, axes: Any = None,
            keep_aspect_ratio_policy: str = "stretch",
            coordinate_transformation_mode: str = "half_pixel", scales: Any = None,
            **_: Any) -> int:
    if not _arr(x):
        return 0
    if mode == "bilinear":
        mode = "linear"
    if len(rest) <= 1:  # Resize-10 / Upsample-9 (X, scales), Upsample-7 (scales attribute)
        sc = _values(rest[0]) if rest else (list(scales) if scales is not None else None)
        if sc is None or len(sc) != x.ndim or min(sc) <= 0:
            return 0
        out = [int(np.floor(np.float32(n) * np.float32(s))) for n, s in zip(x.shape, sc)]
        return _resample(x, out, [float(s) for s in sc], mode, False, False)
    roi, scl, sizes = (list(rest) + [None, None, None])[:3]
    geo = _resize_geometry(x, roi, scl, sizes, axes, keep_aspect_ratio_policy)
    if geo is None:
        return 0
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    return _resample(x, geo[0], geo[1], mode, crop, bool(antialias))


# -- size-setting operators ------------------------------------------------------------------


def _one_hot(indices: Any, depth: Any, values: Any, **_: Any) -> int:
    d, v = _values(depth), values if _arr(values) else None
    if not d or v is None or not _arr(indices):
        return 0
    n = indices.size * max(int(d[0]), 0)
    # the boolean mask and np.where's result before it is cast into the output; int64 indices
    return n * (1 + v.dtype.itemsize) + 16 * indices.size


def _range(start: Any, limit: Any, delta: Any, *_: Any, stash_type: int = 1, **__: Any) -> int:
    try:
        s, e, d = (float(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
    except (TypeError, ValueError, IndexError):
        return 0
    if d == 0 or not np.isfinite([s, e, d]).all():
        return 0
    n = max(math.ceil((e - s) / d), 0)
    half = stash_type == 1 and np.asarray(start).dtype.name in _HALF
    return n * (12 if half else 8)  # an int64 arange, and its product with delta


def _nonzero(x: Any, **_: Any) -> int:
    # np.nonzero's per-axis index arrays, stacked into the output
    return max(np.ndim(x), 1) * int(np.count_nonzero(x)) * 8 if _arr(x) else 0


def _tile(x: Any, repeats: Any = None, *rest: Any, **_: Any) -> int:
    # np.tile repeats one axis at a time; each intermediate lives until the next is made
    reps = _values(repeats) if not rest else None
    if reps is None or not _arr(x) or len(reps) != x.ndim or min(reps, default=0) < 0:
        return 0
    cur, prev, peak = x.size, 0, 0
    for r in reps:
        if r == 1:
            continue
        cur *= int(r)
        peak = max(peak, prev + cur * x.dtype.itemsize)
        prev = cur * x.dtype.itemsize
    return max(peak - prev, 0)


def _cum_sum(x: Any, axis: Any = None, *, exclusive: int = 0, reverse: int = 0,
             **_: Any) -> int:
    if not _arr(x):
        return 0
    isz = x.dtype.itemsize
    wsz = 4 if x.dtype.name in _HALF else isz
    n = x.size
    copy = n * wsz if wsz != isz else 0  # the working copy, held to the end
    y = n * wsz
    peak = copy + y * (3 if exclusive else 1)  # the shifted copy: a slice and a concatenation
    if reverse or wsz != isz:
        peak = max(peak, copy + y + n * isz)
    return max(peak - n * isz, 0)


def _top_k(x: Any, k_in: Any = None, *, axis: int = -1, k: Any = None, **_: Any) -> int:
    if not _arr(x) or x.ndim == 0:
        return 0
    n = x.size
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        return 0
    kv = _values(k_in) if k_in is not None else ([k] if k is not None else None)
    kk = min(max(int(kv[0]), 0), x.shape[ax]) if kv else x.shape[ax]
    rows = n // x.shape[ax] if x.shape[ax] else 0
    temps = 16 * n  # the stable argsort's order and its reversal, int64
    if ax != x.ndim - 1:
        temps += n * x.dtype.itemsize  # sorting along an inner axis copies it
    if x.dtype.name in _HALF:
        temps += 4 * n
    return temps + 8 * rows * kk  # the first k of the order, before they are cast


def _unique(x: Any, *, axis: Any = None, **_: Any) -> int:
    if not _arr(x):
        return 0
    # np.unique's sort order, sorted copy, mask, and the cumulative index arrays
    n, isz = x.size, x.dtype.itemsize
    return n * (25 + isz) + (n * isz if axis is not None else 0)


def _indices(data: Any, indices: Any, *_: Any, **__: Any) -> int:
    # the int64 indices with negatives wrapped, the range masks, the broadcast index grids
    return 16 * _n(indices)


# -- float16 / bfloat16 products ---------------------------------------------------------------


def _matmul(a: Any, b: Any, **_: Any) -> int:
    if not (_arr(a) and _arr(b)) or a.dtype.name not in _HALF or a.ndim < 1 or b.ndim < 1:
        return 0
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return 0
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    y = _prod(batch) * m * n
    # float32 copies of both operands and the float32 product, then the cast output
    return max(4 * (a.size + b.size + y), 4 * y + a.dtype.itemsize * y) - a.dtype.itemsize * y


def _einsum_sizes(eq: str, shapes: list[tuple[int, ...]]) -> tuple[int, int] | None:
    """(output elements, largest operand or output elements) of an einsum equation."""
    lhs, _, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return None
    dims: dict[str, int] = {}
    ell: tuple[int, ...] = ()
    for t, shp in zip(terms, shapes):
        letters = t.replace("...", "")
        k = len(shp) - len(letters)
        if k < 0 or (k and "..." not in t):
            return None
        before = t.index("...") if "..." in t else len(t)
        ell = np.broadcast_shapes(ell, tuple(shp[before:before + k]))
        for c, d in zip(letters, list(shp[:before]) + list(shp[before + k:])):
            dims[c] = max(dims.get(c, 1), int(d))
    if "->" not in eq:
        rhs = "".join(sorted(c for c in dims if lhs.count(c) == 1))
    out = _prod(ell) * _prod(dims.get(c, 1) for c in rhs.replace("...", ""))
    return out, max([out] + [_prod(s) for s in shapes])


def _einsum(*inputs: Any, equation: str | None = None, **_: Any) -> int:
    if not equation or not inputs or not all(_arr(x) for x in inputs):
        return 0
    try:
        got = _einsum_sizes(equation, [x.shape for x in inputs])
    except (ValueError, TypeError):
        return 0
    if got is None:
        return 0
    out, biggest = got
    isz = inputs[0].dtype.itemsize
    half = inputs[0].dtype.name in _HALF
    wsz = 4 if half else isz
    # operands past two are contracted pairwise through intermediates no larger than the
    # largest operand or output (numpy's greedy path); float16 computes in float32 copies
    temps = max(len(inputs) - 2, 0) * biggest * wsz
    if half:
        temps += 4 * sum(x.size for x in inputs) + 4 * out
    return temps


# op_type -> f(*inputs, **attrs) -> bytes the reference kernel holds beyond its outputs
SCRATCH: dict[str, Callable[..., int]] = {
    "Resize": _resize,
    "Upsample": _resize,
    "OneHot": _one_hot,
    "Range": _range,
    "NonZero": _nonzero,
    "Tile": _tile,
    "CumSum": _cum_sum,
    "CumProd": _cum_sum,
    "TopK": _top_k,
    "Unique": _unique,
    "Gather": _indices,
    "GatherElements": _indices,
    "GatherND": _indices,
    "ScatterElements": _indices,
    "Scatter": _indices,
    "MatMul": _matmul,
    "Einsum": _einsum,
    **RULES,  # Erf, Gelu, RNN/GRU/LSTM, DFT/STFT (plan.scratch_rules)
}


# -- the rule of a placed node, and the check when a plan is made -------------------------

_KERNEL_ONLY = ("out", "workspace", "noutputs")


def scratch_rule(placement: Any) -> Callable[..., int] | None:
    """f(*inputs, **kwargs) -> bytes this placed node's kernel holds beyond its outputs; None
    when it declares none (most nodes: the check then costs nothing more).

    The variant's own declaration (`Variant.workspace_bytes`) first; for a reference kernel in
    the default domain the measured rule of `plan.scratch.SCRATCH`; else the contract's.
    """
    var, node = placement.variant, placement.node
    if var.workspace_bytes is None and var.reference and node.domain == "" and (
            var.layout != "NHWC"):
        rule = SCRATCH.get(f"{node.op_type}-{var.op.since}", SCRATCH.get(node.op_type))
        if rule is not None:
            return _no_kernel_kwargs(rule)
    declared = var.workspace_bytes if var.workspace_bytes is not None else (
        var.op.contract.workspace_bytes)
    if not callable(declared) and not declared:
        return None

    def workspace(*args: Any, **kw: Any) -> int:
        shapes = [tuple(a.shape) if isinstance(a, np.ndarray) else () for a in args]
        return var.workspace(shapes, {k: v for k, v in kw.items() if k not in _KERNEL_ONLY})

    return workspace


def _no_kernel_kwargs(rule: Callable[..., int]) -> Callable[..., int]:
    def scratch(*args: Any, **kw: Any) -> int:
        return rule(*args, **{k: v for k, v in kw.items() if k not in _KERNEL_ONLY})

    return scratch


def describe_need(out: int, ws: int) -> str:
    if not ws:
        return f"its outputs would take {describe_bytes(out)}"
    return (f"its outputs would take {describe_bytes(out)} and its kernel's scratch "
            f"{describe_bytes(ws)}, {describe_bytes(out + ws)} together")


def _placeholder(v: Any, shape: tuple[int, ...]) -> Any:
    """An input for a scratch rule at plan time: the constant itself, or an array of the
    value's shape and dtype that allocates nothing (the rules read values only of constants:
    a node with a size-setting input from data is checked as it runs)."""
    if v.const is not None:
        return v.const
    try:
        dt = np_dtype_of(v.fact.dtype)
    except (KeyError, TypeError):
        return None
    return np.broadcast_to(np.zeros((), dt), shape)


def _plan_scratch(placement: Any, scratch: Callable[..., int], kwargs: dict[str, Any],
                  dims: dict[str, int]) -> tuple[int, int] | None:
    """(output bytes, scratch bytes) of a node for these bound dims; None if some size is
    open."""
    node = placement.node
    args: list[Any] = []
    for v in node.inputs:
        if v is None:
            args.append(None)
            continue
        shape = resolve_shape(v.fact.shape, dims) if v.kind == "tensor" else None
        if shape is None:
            return None
        args.append(_placeholder(v, shape))
    out = 0
    for v in node.outputs:
        tb = tensor_bytes(v.fact, dims) if v is not None and v.kind == "tensor" else None
        out += tb[0] if tb else 0
    try:
        ws = max(int(scratch(*args, **kwargs)), 0)
    except Exception:  # noqa: BLE001 - a rule that cannot evaluate counts nothing
        ws = 0
    return out, ws


def static_over(placement: Any, scratch: Callable[..., int], limit: int) -> bool:
    got = _plan_scratch(placement, scratch, dict(placement.kwargs), {})
    return got is not None and sum(got) > limit


# program -> [(step, its scratch rule)] for the steps whose scratch only the plan checks
_PLANNED_SCRATCH: weakref.WeakKeyDictionary[Any, list[tuple[Any, Callable[..., int]]]] = (
    weakref.WeakKeyDictionary())


def check_scratch(program: Any, dims: dict[str, int], limit: int) -> None:
    """Refuse, when a plan is made for these dims, a node whose outputs and kernel scratch
    together exceed the limit, for the nodes not checked as they run (their sizes are fixed by
    the plan). Kernels given a planned `workspace=` have it in the plan already."""
    steps = _PLANNED_SCRATCH.get(program)
    if steps is None:
        steps = []
        for st in program.steps:
            if getattr(st.fn, "refuse", None) is not None or takes_workspace(st.fn):
                continue
            rule = scratch_rule(st.placement) if not st.placement.node.subgraphs() else None
            if rule is not None:
                steps.append((st, rule))
        _PLANNED_SCRATCH[program] = steps
    where = f" (input dims {dims})" if dims else ""
    for st, rule in steps:
        got = _plan_scratch(st.placement, rule, st.kwargs, dims)
        if got is not None and sum(got) > limit:
            raise MemoryLimitError(
                f"node {st.placement.node.label}: {describe_need(*got)}{where}, more than "
                f"the memory limit of {describe_bytes(limit)} "
                "(SessionOptions.memory_limit_bytes); refused before allocating"
            )
