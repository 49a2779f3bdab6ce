"""What the ops files use to declare backward rules and their gradcheck cases.

A backward rule has the shape ``rule(ctx, *dYs, **attrs) -> tuple`` with one entry per input
of ``ctx.inputs`` (None where the input is absent or not differentiable); dYs has one entry per
forward output (zeros for a float output nothing downstream uses, None for non-float outputs).
``ctx`` is an ``opwarden.autograd.GradContext`` (inputs, outputs, attrs, op): the protocol and
the checked call live in autograd/, above the operators; the rules live beside their operator
in its ops file, attached with `differentiable` (or ``OpDef.grad``) to every version whose
semantics they cover.

Pure data-movement operators (Reshape, Slice, Gather, Pad, Concat, Split, ...) share one rule,
`index_traced`: the forward reference kernel runs again on arrays of element *indices*, which
tells exactly which input element every output element came from; the gradient is a
scatter-add of dY.

Gradcheck cases (``OpDef.grad_cases_fn``, read by `grad_cases`): small float64 inputs away
from kinks (no ties, no values at 0 for Relu and friends), made by ``f(op_type, since)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opwarden.ops.base import REGISTRY, OpDef, Sample

Rule = Callable[..., tuple]
CaseMaker = Callable[[str, int], list[Sample]]


def is_float(x: Any) -> bool:
    """Does this value carry a gradient (a floating-point tensor)?"""
    if not isinstance(x, (np.ndarray, np.generic)):
        return False
    dt = np.asarray(x).dtype
    return dt.kind == "f" or dt.name in ("bfloat16",)


def differentiable(*op_types: str, cases: CaseMaker | None = None, domain: str = ""):
    """Attach the decorated rule (and its gradcheck cases) to every version of each named
    operator registered so far: use it after the operator's last version in its ops file."""

    def deco(fn: Rule) -> Rule:
        for t in op_types:
            for o in REGISTRY.versions(t, domain):
                o.grad(fn)
                if cases is not None:
                    o.grad_cases_fn = cases
        return fn

    return deco


def fit(ctx: Any, *grads: Any) -> tuple:
    """Exactly one entry per input: missing inputs get None, surplus entries are dropped."""
    n = len(ctx.inputs)
    out = list(grads[:n]) + [None] * (n - len(grads))
    return tuple(
        None if x is None or g is None or not is_float(np.asarray(x)) else _like(g, x)
        for g, x in zip(out, ctx.inputs)
    )


def _like(g: Any, x: Any) -> np.ndarray:
    """g with x's shape and dtype (g already has x's number of elements)."""
    x = np.asarray(x)
    return np.asarray(g, dtype=x.dtype).reshape(x.shape)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum g over the axes numpy broadcasting added or stretched to reach g.shape from shape."""
    g = np.asarray(g)
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def reduce_to(g: np.ndarray, x: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """g summed back to x's shape (or to `shape`, which x reshapes to, when given)."""
    x = np.asarray(x)
    return unbroadcast(g, shape if shape is not None else x.shape).reshape(x.shape)


def unary(*op_types: str, cases: CaseMaker | None = None):
    """Register d(op)/dX as f(x, y, attrs) -> local derivative (multiplied by dY)."""

    def deco(deriv: Callable[..., Any]) -> Callable[..., Any]:
        def rule(ctx, dY, *rest, **attrs):
            X = np.asarray(ctx.inputs[0])
            Y = np.asarray(ctx.outputs[0])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return fit(ctx, dY * deriv(X.astype(Y.dtype, copy=False), Y, attrs))

        rule.__name__ = rule.__qualname__ = f"_grad_{deriv.__name__.strip('_')}"
        differentiable(*op_types, cases=cases)(rule)
        return deriv

    return deco


def index_traced(data: tuple[int, ...] | str) -> Rule:
    """The rule of a data-movement operator whose inputs `data` ("all": every input) carry
    data (the others are shapes, indices, ... and get None)."""

    def rule(ctx, *dys, **attrs):
        op = ctx.op
        picked = range(len(ctx.inputs)) if data == "all" else data
        args = list(ctx.inputs)
        offsets: dict[int, int] = {}
        total = 0
        for i in picked:
            x = ctx.inputs[i]
            if x is None:
                continue
            x = np.asarray(x)
            offsets[i] = total
            args[i] = np.arange(total, total + x.size, dtype=np.int64).reshape(x.shape)
            total += x.size
        kw = dict(attrs)
        args, pad_value_at = _pad_marks(op, args, kw)
        if getattr(op.variants[0], "wants_noutputs", False):
            kw["noutputs"] = len(ctx.outputs)
        src = op.reference(*args, **kw)
        src = list(src) if isinstance(src, tuple) else [src]
        flat = np.zeros(total, dtype=np.float64)
        fill = 0.0
        for sidx, g in zip(src, dys):
            if g is None:
                continue
            sidx = np.asarray(sidx).reshape(-1)
            g = np.asarray(g, dtype=np.float64).reshape(-1)
            real = sidx >= 0
            np.add.at(flat, sidx[real], g[real])
            fill += g[~real].sum()
        grads: list[Any] = [None] * len(ctx.inputs)
        for i, off in offsets.items():
            x = np.asarray(ctx.inputs[i])
            grads[i] = flat[off:off + x.size].reshape(x.shape)
        if pad_value_at is not None:
            grads[pad_value_at] = np.asarray(fill)
        return fit(ctx, *grads)

    return rule


def _pad_marks(op: OpDef, args: list[Any], kw: dict[str, Any]) -> tuple[list[Any], int | None]:
    """Padding writes -1 (no source element): its gradient goes to the padding value, whose
    input index is returned (None where the value is an attribute or the default)."""
    if op.op_type != "Pad":
        return args, None
    if "value" in kw or op.since < 11:
        kw["value"] = -1
    elif len(args) > 2 and args[2] is not None:
        args[2] = np.asarray(-1, dtype=np.int64).reshape(np.shape(args[2]))
        return args, 2
    else:
        args = args[:2] + [np.asarray(-1, dtype=np.int64)] + args[3:]
    return args, None


# ---------------------------------------------------------------------------------------------
# Gradcheck inputs


def away_from_zero(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> np.ndarray:
    """Uniform values kept at least 0.05 away from 0 (kinks of relu/abs/sign live there)."""
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    x = rng.uniform(lo, hi, size=shape)
    return np.where(np.abs(x) < 0.05, 0.05 + np.abs(x), x)


def positive(*shape: int, lo: float = 0.5, hi: float = 2.0, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, size=shape)


def int64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def unary_cases(
    ranges: Mapping[str, Callable[[], np.ndarray]], extra: Mapping[str, dict[str, Any]]
) -> CaseMaker:
    """Cases of unary operators: one input (from `ranges`, else values in [-2, 2] away from
    0), and a second case with the attributes `extra` gives the op."""

    def make(op_type: str, since: int) -> list[Sample]:
        x = ranges.get(op_type, lambda: away_from_zero(2, 3))()
        out = [Sample([x])]
        if op_type in extra:
            out.append(Sample([x], extra[op_type], label=str(extra[op_type])))
        return out

    return make


def grad_cases(opdef: Any) -> list[Sample]:
    """Gradcheck cases for a built-in operator version (empty if none are known)."""
    make = getattr(opdef, "grad_cases_fn", None)
    return make(opdef.op_type, opdef.since) if make is not None else []


def differentiable_ops() -> list[OpDef]:
    """Every registered operator version that has a backward rule."""
    return [o for o in REGISTRY.all() if o.grad_fn is not None]
