"""Health checks run around each kernel call (numeric, logical, contract)."""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import Declared
from opwarden.dtypes import np_dtype_of
from opwarden.memory.constants import is_constant

# "mutation" (inputs compared before and after each kernel) comes only with "all".
ALL_CHECKS = frozenset({"nan", "inf", "shape", "dtype", "contract", "mutation"})


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


def checked_shape(shape: Any) -> tuple | None:
    """The part of a fact's shape a kernel is held to: the shape with the dims only the model's
    declaration gives (ir.graph.Declared) as None, or None when the rank itself is only
    declared (no dim verified). A wrong declaration is the model's fault, not the kernel's."""
    if shape is None:
        return None
    ok = [type(d) is int or type(d) is str for d in shape]
    if all(ok):
        return tuple(shape)
    if not any(ok) and any(type(d) is Declared for d in shape):
        return None
    return tuple(d if k else None for d, k in zip(shape, ok))


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a and b share memory. The exact test is exponential in the worst case (strided
    and broadcast views); past a bounded effort overlapping bounds count as sharing."""
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=1 << 12))
    except np.exceptions.TooHardError:
        return True


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
                and _shares(a, o)
                # the same buffer fed to an input that may alias is not a violation
                and not any(isinstance(b, np.ndarray) and _shares(a, b) for b in ok_inputs)
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


def expected_dtype(fact: Any) -> np.dtype | None:
    """The NumPy dtype a tensor fact predicts (None: unknown, or strings, whose kernels return
    object or unicode arrays alike)."""
    if fact is None or fact.dtype is None or fact.dtype == "string":
        return None
    try:
        return np_dtype_of(fact.dtype)
    except (KeyError, TypeError):
        return None


def expected_shape(fact: Any, dims: dict[str, int]) -> tuple[int, ...] | None:
    """The whole shape a fact predicts with these symbolic dims bound, or None when any part of
    it is unknown."""
    shape = fact.shape if fact is not None else None
    if shape is None:
        return None
    out = []
    for d in shape:
        if type(d) is int:
            out.append(d)
        elif type(d) is str and d in dims:
            out.append(dims[d])
        else:
            return None
    return tuple(out)


OUTPUT_KINDS = frozenset({"outputs", "dtype", "shape"})


def output_faults(
    outs: list[Any], values: list[Any], dims: dict[str, int],
    kinds: frozenset[str] = OUTPUT_KINDS, strings: bool = False,
) -> list[tuple[str, str]]:
    """A step's results against the plan's static facts (the contract check runs every kind;
    `checks="shape"`/`"dtype"` alone run theirs): each typed tensor output must be an array
    ("outputs") of the predicted dtype ("dtype") and shape ("shape": rank and every dim known,
    symbolic ones bound by `dims`; dims only the model declares are not held against it, see
    checked_shape; string outputs are held to a string kind only with `strings`, as kernels
    return object and unicode arrays alike). Catching these at the step blames them on the
    kernel that made them, not on the next node that trips over them."""
    for k, (o, v) in enumerate(zip(outs, values)):
        if v is None or v.kind != "tensor" or v.fact.dtype is None:
            continue
        if not isinstance(o, np.ndarray):
            if "outputs" not in kinds:
                continue
            return [("outputs", f"output {k} is {type(o).__name__}, not a tensor "
                                f"({v.fact.dtype})")]
        if strings and v.fact.dtype == "string" and o.dtype.kind not in "OUS":
            return [("dtype", f"output {k} has dtype {o.dtype.name}, the plan expects string")]
        want = expected_dtype(v.fact) if "dtype" in kinds else None
        if want is not None and o.dtype != want:
            return [("dtype", f"output {k} has dtype {o.dtype.name}, the plan expects "
                              f"{v.fact.dtype}")]
        shape = checked_shape(v.fact.shape) if "shape" in kinds else None
        if shape is None:
            continue
        if o.ndim != len(shape) or any(
            (d if type(d) is int else dims.get(d, n) if type(d) is str else n) != n
            for d, n in zip(shape, o.shape)
        ):
            want_shape = [dims.get(d, d) if isinstance(d, str) else d for d in shape]
            return [("shape", f"output {k} has shape {list(o.shape)}, the plan expects "
                              f"{want_shape}")]
    return []


def _bits(a: np.ndarray) -> np.ndarray:
    """`a`'s bytes as unsigned integers (NaN payloads and -0.0 compare as written)."""
    n = a.dtype.itemsize
    if n in (1, 2, 4, 8):
        return a.view(np.dtype(f"u{n}"))
    return np.ascontiguousarray(a).view(np.uint8)


def snapshot(args: list[Any], skip: set[int]) -> list[Any] | None:
    """Copies of the inputs a kernel could change, for the mutation check (None: nothing to
    watch). Left out: positions in `skip` (a planned in-place output, inputs the contract lets
    the kernel write), weights (declared constants, behind read-only buffers and, in huge
    pages, read-only memory) and object arrays (whose elements are not bytes). A copy costs
    less than a checksum (measured: copy 13 GB/s and compare 10 GB/s, zlib.crc32 4.5 GB/s) and
    is what the reference rerun needs when the kernel did write."""
    snaps: list[Any] = [None] * len(args)
    any_ = False
    for i, a in enumerate(args):
        if (i in skip or not isinstance(a, np.ndarray) or not a.size or a.dtype.kind == "O"
                or is_constant(a)):
            continue
        snaps[i] = a.copy()
        any_ = True
    return snaps if any_ else None


def mutated(args: list[Any], snaps: list[Any]) -> int | None:
    """The first input whose bytes differ from its snapshot, or None."""
    for i, (a, c) in enumerate(zip(args, snaps)):
        if c is not None and not np.array_equal(_bits(a), _bits(c)):
            return i
    return None


def restore(a: np.ndarray, snap: np.ndarray) -> None:
    """Write `snap` back into `a`'s memory, for the later readers of a value a kernel changed
    (through a writable view: `a` itself and its flags stay as they are)."""
    w = a.view()
    w.flags.writeable = True  # the kernel that wrote into it did the same
    np.copyto(w, snap)
