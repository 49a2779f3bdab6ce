"""gradcheck: an operator's backward rule against central finite differences in float64."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opwarden.errors import ContractError, OpwardenError


@dataclass
class GradcheckResult:
    """ok: every checked gradient matched; max_error: the largest |analytic - numeric|."""

    ok: bool
    max_error: float
    detail: str

    def __bool__(self) -> bool:
        return self.ok


def _resolve(op_or_variant: Any) -> tuple[Any, Any]:
    """(OpDef, forward function) for an OpDef, a Variant or an OpDef's reference."""
    from opwarden.ops.base import OpDef, Variant

    if isinstance(op_or_variant, Variant):
        v = op_or_variant
        dts = v.dtypes
        allowed = set().union(*dts.values()) if isinstance(dts, Mapping) else dts
        # The rule belongs to the op: a variant without float64 is checked via the reference.
        if allowed is not None and "float64" not in allowed:
            return v.op, v.op.reference
        return v.op, v.fn
    if isinstance(op_or_variant, OpDef):
        return op_or_variant, op_or_variant.reference
    raise ContractError(
        f"gradcheck needs an operator (opwarden.op) or one of its variants, got "
        f"{type(op_or_variant).__name__}"
    )


def _defaults(opdef: Any) -> dict[str, Any]:
    """Schema defaults of the op's attributes (what a node would pass to the kernel)."""
    try:
        sch = opdef.schema_for(opdef.since)
    except OpwardenError:
        return {}
    return {k: s.default for k, s in sch.attrs.items() if s.has_default}


def _as_list(res: Any) -> list[Any]:
    return list(res) if isinstance(res, tuple) else [res]


def _ieee_float_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _call_attrs(
    opdef: Any, fn: Any, attrs: Mapping[str, Any] | None, noutputs: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(attributes the rule sees, keyword arguments of the forward call)."""
    defaults = _defaults(opdef)
    kw = {**defaults, **dict(attrs or {})}
    if "stash_type" in defaults or "stash_type" in kw:
        # stash_type only picks the precision of the computation; the check runs in float64.
        kw["stash_type"] = 11
    call_kw = dict(kw)
    wants_n = any(v.fn is fn and v.wants_noutputs for v in opdef.variants)
    if noutputs is not None and wants_n:
        call_kw["noutputs"] = noutputs
    return kw, call_kw


def gradcheck(
    op_or_variant: Any,
    inputs: Sequence[Any],
    attrs: Mapping[str, Any] | None = None,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-3,
    atol: float = 1e-5,
    noutputs: int | None = None,
    seed: int = 0,
    max_points: int | None = 256,
) -> GradcheckResult:
    """Compare the op's `.grad` with central differences of <random dY, op(inputs)>.

    Floating inputs are promoted to float64. Every float input is checked: one with a gradient
    against its finite differences, one the rule calls non-differentiable (None) against zero.
    The rule must return exactly one gradient per input, in the input's shape and dtype.
    Inputs with more than `max_points` elements are checked on a fixed random sample of them;
    elements where the op has a kink (one-sided slopes disagree) are skipped and counted.
    """
    import opwarden.autograd  # noqa: F401 - the built-in backward rules attach on import
    from opwarden.autograd.core import GradContext, call_rule, upstream

    opdef, fn = _resolve(op_or_variant)
    name = opdef.qualname
    if opdef.grad_fn is None:
        return GradcheckResult(False, float("inf"), f"{name} has no backward rule (.grad)")
    kw, call_kw = _call_attrs(opdef, fn, attrs, noutputs)
    xs = [
        np.asarray(x, dtype=np.float64) if x is not None and np.asarray(x).dtype.kind == "f"
        else (None if x is None else np.asarray(x))
        for x in inputs
    ]

    def forward(args: list[Any]) -> list[Any]:
        with np.errstate(all="ignore"):
            res = _as_list(fn(*args, **call_kw))
        return [np.asarray(y) if y is not None else None for y in res]

    try:
        ys = forward(xs)
    except Exception as e:  # noqa: BLE001 - report, do not crash the harness
        return GradcheckResult(False, float("inf"), f"{name}: forward failed: {e}")
    rng = np.random.default_rng(seed)
    dys = [rng.standard_normal(y.shape) if _ieee_float_array(y) else None for y in ys]

    def objective(args: list[Any]) -> float:
        outs = forward(args)
        return float(sum(np.sum(o * d) for o, d in zip(outs, dys) if d is not None))

    ctx = GradContext(inputs=list(xs), outputs=list(ys), attrs=dict(kw), op=opdef)
    try:
        grads = call_rule(opdef, ctx, upstream(ys, dys), strict_dtype=True)
    except ContractError as e:
        return GradcheckResult(False, float("inf"), str(e))
    except Exception as e:  # noqa: BLE001
        why = f"{name}: backward raised {type(e).__name__}: {e}"
        return GradcheckResult(False, float("inf"), why)
    return _judge(name, xs, grads, objective, _Tolerance(eps, rtol, atol), seed, max_points)


@dataclass
class _Tolerance:
    eps: float
    rtol: float
    atol: float


def _numeric(
    objective: Any, xs: list[Any], i: int, points: np.ndarray, base: float, tol: _Tolerance
) -> tuple[np.ndarray, np.ndarray]:
    """(central differences of the objective at input i's `points`, where it is smooth)."""
    x = xs[i]
    flat = x.reshape(-1)
    eps = tol.eps
    num = np.full(points.size, np.nan)
    smooth = np.zeros(points.size, bool)
    for k, j in enumerate(points):
        args = list(xs)
        lp_lm = []
        for sign in (1, -1):
            xj = flat.copy()
            xj[j] += sign * eps
            args[i] = xj.reshape(x.shape)
            lp_lm.append(objective(args))
        lp, lm = lp_lm
        num[k] = (lp - lm) / (2 * eps)
        # A kink (relu at 0, a max tie, a clip bound) shows as one-sided slopes that
        # disagree; the derivative does not exist there, so the point is not judged.
        left, right = (base - lm) / eps, (lp - base) / eps
        smooth[k] = abs(left - right) <= 10 * (tol.atol + tol.rtol * abs(num[k]))
    return num, smooth


def _judge(
    name: str, xs: list[Any], grads: Sequence[Any], objective: Any, tol: _Tolerance, seed: int,
    max_points: int | None,
) -> GradcheckResult:
    """Every float input's analytic gradient against its finite differences."""
    base = objective(xs)
    pick = np.random.default_rng(seed + 1)
    worst, lines, ok, checked, kinks = 0.0, [], True, 0, 0
    for i, x in enumerate(xs):
        if not _ieee_float_array(x):
            continue
        points = np.arange(x.size)
        if max_points is not None and x.size > max_points:
            # Large inputs: a fixed random sample of elements keeps the cost bounded.
            points = np.sort(pick.choice(x.size, max_points, replace=False))
        num, smooth = _numeric(objective, xs, i, points, base, tol)
        usable = smooth & np.isfinite(num)
        kinks += int((~smooth).sum())
        ana_full = grads[i]
        if ana_full is None:
            ana = np.zeros(points.size)
            what = "rule says not differentiable (None), but the output depends on it"
        else:
            ana = np.asarray(ana_full, dtype=np.float64).reshape(-1)[points]
            checked += 1
            what = "analytic and numeric gradients differ"
        err = np.where(usable, np.abs(ana - num), 0.0)
        bad = usable & (err > tol.atol + tol.rtol * np.abs(np.where(usable, num, 0.0)))
        worst = max(worst, float(err.max(initial=0.0)))
        if bad.any():
            ok = False
            k = int(np.argmax(np.where(bad, err, -1)))
            idx = [int(v) for v in np.unravel_index(int(points[k]), x.shape)] if x.shape else []
            lines.append(
                f"input {i}: {what} at {idx}: analytic {ana[k]:.6g}, numeric {num[k]:.6g} "
                f"({int(bad.sum())} of {points.size} checked elements off)"
            )
    if kinks:
        lines.append(f"{kinks} element(s) at non-differentiable points skipped")
    if checked == 0 and ok:
        lines.append("no input has a gradient to check")
    detail = f"{name}: " + ("; ".join(lines) if lines else f"{checked} input(s) match")
    return GradcheckResult(ok, worst, detail)
