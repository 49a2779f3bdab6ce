"""Health checks run around each kernel call (numeric, logical, contract)."""

from __future__ import annotations

from typing import Any

import numpy as np

ALL_CHECKS = frozenset({"nan", "inf", "shape", "dtype", "contract"})


def normalize(checks: Any) -> frozenset[str]:
    """The set of enabled checks for a SessionOptions.checks value."""
    items = {checks} if isinstance(checks, str) else set(checks or ())
    if "all" in items:
        return ALL_CHECKS
    return frozenset(items)


def is_float(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "fc" and x.size > 0


def _floatish(x: Any) -> bool:
    # ml_dtypes (bfloat16, float8) report kind 'V'; compare through float32 for them.
    return (
        isinstance(x, np.ndarray) and x.size > 0 and (x.dtype.kind in "fc" or x.dtype.kind == "V")
    )


def _f(x: np.ndarray) -> np.ndarray:
    return x if x.dtype.kind in "fc" else x.astype(np.float32)


def all_finite(x: Any) -> bool:
    """No NaN or Inf in x. A sum is a fast, allocation-free first test: NaN and Inf survive it;
    only when it is not finite (or overflowed) is the exact elementwise test needed."""
    if not _floatish(x):
        return True
    xf = _f(x)
    if xf.dtype.kind == "f" and np.isfinite(np.add.reduce(xf, axis=None)):
        return True
    return bool(np.isfinite(xf).all())


def count_nan(x: Any) -> int:
    return int(np.isnan(_f(x)).sum()) if _floatish(x) else 0


def count_inf(x: Any) -> int:
    return int(np.isinf(_f(x)).sum()) if _floatish(x) else 0


def has_nan(x: Any) -> bool:
    return bool(_floatish(x) and np.isnan(_f(x)).any())


def has_inf(x: Any) -> bool:
    return bool(_floatish(x) and np.isinf(_f(x)).any())


def numeric_faults(
    args: list[Any], outs: list[Any], checks: frozenset[str], nan_policy: str
) -> list[tuple[str, str]]:
    """NaN/Inf appearing in outputs when no input had any (NaN policy 'produce' allows NaN)."""
    found: list[tuple[str, str]] = []
    if "nan" in checks and nan_policy != "produce" and not any(has_nan(a) for a in args):
        for i, o in enumerate(outs):
            n = count_nan(o)
            if n:
                found.append(("nan", f"output {i} has {n} NaN values, inputs had none"))
                break
    if "inf" in checks and not any(has_inf(a) for a in args):
        for i, o in enumerate(outs):
            n = count_inf(o)
            if n:
                found.append(("inf", f"output {i} has {n} Inf values, inputs had none"))
                break
    return found


def fact_faults(outs: list[Any], facts: list[Any], checks: frozenset[str]) -> list[tuple[str, str]]:
    """Output dtype/shape differing from the shape/type rule's prediction (static parts only)."""
    found: list[tuple[str, str]] = []
    for i, (o, fact) in enumerate(zip(outs, facts)):
        if fact is None or not isinstance(o, np.ndarray):
            continue
        if "dtype" in checks and fact.dtype is not None:
            got = "string" if o.dtype.kind in "OUS" else o.dtype.name
            if got != fact.dtype:
                found.append(
                    ("dtype", f"output {i} has dtype {got}, the rule predicts {fact.dtype}")
                )
        if "shape" in checks and fact.shape is not None:
            if o.ndim != len(fact.shape) or any(
                isinstance(d, int) and d != n for d, n in zip(fact.shape, o.shape)
            ):
                found.append(
                    (
                        "shape",
                        f"output {i} has shape {list(o.shape)}, the rule predicts "
                        f"{list(fact.shape)}",
                    )
                )
    return found


def alias_faults(
    args: list[Any], outs: list[Any], allowed: set[tuple[int, int]]
) -> list[tuple[str, str]]:
    """Outputs sharing memory with an input when the contract declares no such alias."""
    for j, o in enumerate(outs):
        if not isinstance(o, np.ndarray) or o.size == 0:
            continue
        ok_inputs = [args[k] for k, jj in allowed if jj == j and k < len(args)]
        for i, a in enumerate(args):
            if (
                isinstance(a, np.ndarray)
                and a.size
                and (i, j) not in allowed
                and np.may_share_memory(a, o)
                and np.shares_memory(a, o)
                # the same buffer fed to an input that may alias is not a violation
                and not any(isinstance(b, np.ndarray) and np.shares_memory(a, b) for b in ok_inputs)
            ):
                return [
                    ("alias", f"output {j} aliases input {i}, which the contract does not allow")
                ]
    return []


def readonly(x: Any) -> Any:
    """A read-only view, so a kernel that writes into its input fails loudly."""
    if isinstance(x, np.ndarray) and x.flags.writeable:
        v = x.view()
        v.flags.writeable = False
        return v
    return x
