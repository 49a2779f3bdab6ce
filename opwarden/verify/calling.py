"""Calling a variant as placement would, and comparing what it returns.

``call`` runs a variant's kernel on a case (moving inputs to an NHWC variant's layout and
output 0 back); ``accepts`` says whether placement would give the case to the variant (its
dtype declaration and ``when`` predicate); ``mismatch`` compares a result with the reference
within the output dtype's tolerance (``TOLERANCE``), ``same`` bitwise. Shared by every check
(harness.py and the checks_*.py mixins) and by the per-operator input data (opdata.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.dtypes import dtype_name
from opwarden.ops.base import Variant
from opwarden.verify import inputs as I

# (rtol, atol) of a variant against the reference, by output dtype; integers, bools and strings
# must match exactly. float16/bfloat16 allow a few units in the last place of their mantissas.
TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (5e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
    "complex128": (1e-7, 1e-9),
    "complex64": (1e-4, 1e-5),
}
LOW_PRECISION = (1e-1, 1e-1)  # float8 / float4 formats: a coarse agreement only


def is_arr(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def nhwc_inputs(variant: Variant) -> tuple[int, ...]:
    return (0, 3) if variant.op.op_type == "FusedConv" else (0,)


def to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if x.ndim >= 3 else x


def from_nhwc(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def to_layout(variant: Variant, args: list[Any], ready: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Move the inputs in `args` (in place) to the variant's layout, except those in `ready`;
    the indices moved (NHWC variants' activation inputs)."""
    if variant.layout != "NHWC":
        return ()
    moved = tuple(i for i in nhwc_inputs(variant)
                  if i < len(args) and is_arr(args[i]) and i not in ready)
    for i in moved:
        args[i] = to_nhwc(args[i])
    return moved


def call(variant: Variant, case: I.Case, inputs: list[Any] | None = None,
         ready: tuple[int, ...] = (), nhwc_out: bool = True, fn: Any = None,
         **extra: Any) -> list:
    """Run `variant` (its kernel `fn`, else variant.fn) on the case's inputs (the case's own
    arrays unless `inputs` is given); inputs whose index is in `ready` are already in the
    variant's layout. An NHWC variant's output 0 comes back in NCHW unless not `nhwc_out`."""
    args = list(case.inputs if inputs is None else inputs)
    kw = dict(case.attrs)
    if variant.wants_noutputs:
        kw["noutputs"] = case.noutputs
    kw.update(extra)
    nhwc = variant.layout == "NHWC"
    to_layout(variant, args, ready)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = (variant.fn if fn is None else fn)(*args, **kw)
    # a tuple is several outputs; a list is one sequence-typed output (as the executor sees it)
    outs = list(res) if type(res) is tuple else [res]
    outs = [np.asarray(o) if isinstance(o, np.generic) else o for o in outs]
    if nhwc and nhwc_out and outs and is_arr(outs[0]):
        outs[0] = from_nhwc(outs[0])
    return outs


def accepts(variant: Variant, case: I.Case) -> bool:
    """Would placement give this case to the variant (dtype declaration and `when` predicate)?"""
    facts = [fact_of(x) for x in case.inputs]
    if variant.layout == "NHWC":  # the physical shapes placement gives `when` (place.layout)
        for i in nhwc_inputs(variant):
            if i < len(facts) and (facts[i].ndim or 0) >= 3:
                sh = facts[i].shape
                facts[i] = TensorFact(facts[i].dtype, (sh[0], *sh[2:], sh[1]))
    dts = variant.dtypes
    if dts is not None:
        sch = variant.op.schema_for(case.opset or variant.op.since)
        if isinstance(dts, dict):
            for i, f in enumerate(facts):
                p = sch.input_param(i)
                if (
                    p is not None
                    and p.type_str in dts
                    and f.dtype
                    and f.dtype not in dts[p.type_str]
                ):
                    return False
        else:
            first = next((f.dtype for f in facts if f.dtype), None)
            if first not in dts:
                return False
    if variant.when is not None:
        try:
            return bool(variant.when(*facts, **case.attrs))
        except Exception:  # noqa: BLE001 - a predicate that cannot decide rejects
            return False
    return True


def fact_of(x: Any) -> TensorFact:
    if is_arr(x):
        return TensorFact(dtype_name(x.dtype), tuple(int(d) for d in x.shape))
    return TensorFact(None, None)


# ---------------------------------------------------------------- comparing ------------------


def _as_float(x: np.ndarray) -> np.ndarray:
    return x if x.dtype.kind in "fc" else x.astype(np.float64)


def mismatch(got: Any, want: Any, where: str = "output", normwise: bool = False) -> str | None:
    """None when `got` matches `want` within the dtype's tolerance, else why not. `normwise`
    (Contract.tolerance): float values within rtol of the output's largest finite magnitude
    instead of their own."""
    if isinstance(want, list) or isinstance(got, list):
        if not (isinstance(want, list) and isinstance(got, list)) or len(want) != len(got):
            return f"{where}: sequence differs"
        for i, (g, w) in enumerate(zip(got, want)):
            m = mismatch(g, w, f"{where}[{i}]", normwise)
            if m:
                return m
        return None
    if want is None or got is None:
        return None if want is None and got is None else f"{where}: one side is None"
    if not is_arr(want) or not is_arr(got):
        return None if type(want) is type(got) else f"{where}: type {type(got).__name__}"
    if got.dtype != want.dtype:
        return f"{where}: dtype {got.dtype} != reference {want.dtype}"
    if got.shape != want.shape:
        return f"{where}: shape {list(got.shape)} != reference {list(want.shape)}"
    if got.size == 0:
        return None
    name = dtype_name(got.dtype)
    if got.dtype.kind in "biuOUS" or got.dtype.kind == "M":
        bad = got != want
        if got.dtype.kind == "O":
            bad = np.array([a != b for a, b in zip(got.ravel(), want.ravel())])
        if np.any(bad):
            idx = int(np.flatnonzero(np.ravel(bad))[0])
            return (
                f"{where}: {int(np.sum(bad))} of {got.size} values differ (exact dtype "
                f"{name}); first at flat index {idx}: {got.ravel()[idx].tolist()!r} vs reference "
                f"{want.ravel()[idx].tolist()!r}"
            )
        return None
    rtol, atol = TOLERANCE.get(name, LOW_PRECISION)
    g, w = _as_float(got), _as_float(want)
    both_nan = np.isnan(g) & np.isnan(w)
    same_inf = np.isinf(w) & (g == w)
    with np.errstate(all="ignore"):
        err = np.abs(g - w)
        scale = np.abs(w)
        if normwise:
            finite = scale[np.isfinite(scale)]
            scale = np.maximum(scale, finite.max() if finite.size else 0.0)
        ok = (err <= atol + rtol * scale) | both_nan | same_inf
    if not np.all(ok):
        idx = int(np.flatnonzero(~np.ravel(ok))[0])
        worst = float(np.nanmax(np.where(ok, 0, err))) if np.any(~ok & ~np.isnan(err)) else np.nan
        rel = "of the largest magnitude " if normwise else ""
        return (
            f"{where}: {int(np.sum(~ok))} of {got.size} values beyond rtol={rtol:g} {rel}"
            f"atol={atol:g} ({name}); max abs error {worst:.3g}; first at flat index {idx}: "
            f"{g.ravel()[idx].item()!r} vs reference {w.ravel()[idx].item()!r}"
        )
    return None


def same(a: Any, b: Any) -> bool:
    """Bitwise-equal results (NaN equal to NaN): what repeated calls must return."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if is_arr(a) and is_arr(b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "O":
            return a.tolist() == b.tolist()
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    return type(a) is type(b)


def float_inputs(c: I.Case) -> bool:
    return any(is_arr(x) and x.dtype.kind == "f" for x in c.inputs)

