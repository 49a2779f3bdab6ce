"""The validation harness: every variant of an operator checked against its schema and contract.

``check(op_or_variant)`` runs, per variant, the checks named in ``CHECKS`` on inputs generated
from the schema (``inputs.plan``), taken from the ONNX node suite (``inputs.suite_cases``) and
from the samples an operator declares (``OpDef.samples``, ``inputs.sample_cases``). Each check
is "pass", "fail" or "skip" (with a reason); a failure keeps the smallest failing input.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.dtypes import INTS, dtype_name
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu.util import scratch_probe
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import OpDef, Variant
from opwarden.ops.schema import STANDARD_DOMAINS
from opwarden.verify import inputs as I

CHECKS = (
    "numerics",
    "boundary",
    "nan",
    "overflow",
    "mutation",
    "alias",
    "workspace",
    "concurrency",
    "shape",
    "grad",
)

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

# Workspace: a kernel's outputs are not workspace, but NumPy temporaries are unavoidable in a
# reference kernel, so its measured peak (minus the returned outputs) may exceed the declared
# workspace by TEMP_FACTOR x (input + output bytes) plus a fixed allowance for small objects.
# The other variants (fast kernels, custom ops' own variants) write into planned buffers:
# every array-sized temporary they make must be in their declaration (Variant.workspace_bytes
# or the contract's), and only small objects are allowed for.
TEMP_FACTOR = {True: 8.0, False: 0.0}  # reference / other variants
TEMP_FIXED = {True: 1 << 20, False: 1 << 18}

THREADS = 8
CALLS = 50
THREAD_SAMPLE_ELEMENTS = 1 << 16  # input elements of a declared sample used for concurrency


@dataclass
class VariantReport:
    """The outcome of every check for one variant."""

    op: str
    domain: str
    since: int
    variant: str
    device: str
    checks: dict[str, str] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return "fail" not in self.checks.values()

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "domain": self.domain or "ai.onnx",
            "since": self.since,
            "variant": self.variant,
            "device": self.device,
            "checks": dict(self.checks),
            "failures": list(self.failures),
            "skipped": dict(self.skipped),
        }


@dataclass
class Report:
    """All variant reports of one `check` call."""

    variants: list[VariantReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.variants)

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [dict(f, variant=v.variant) for v in self.variants for f in v.failures]

    def __getitem__(self, name: str) -> VariantReport:
        for v in self.variants:
            if v.variant == name:
                return v
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "variants": [v.to_dict() for v in self.variants]}

    def summary(self) -> dict[str, dict[str, int]]:
        """check -> {"pass": n, "fail": n, "skip": n} over all variants."""
        out = {c: {"pass": 0, "fail": 0, "skip": 0} for c in CHECKS}
        for v in self.variants:
            for c, s in v.checks.items():
                out[c][s] += 1
        return out


_ABSENT = I.ABSENT


class CheckFailure(Exception):
    """Raised inside a check with the detail of a contract violation."""


# ---------------------------------------------------------------- calling --------------------


def _is_arr(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _nhwc_inputs(variant: Variant) -> tuple[int, ...]:
    return (0, 3) if variant.op.op_type == "FusedConv" else (0,)


def _to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if x.ndim >= 3 else x


def _from_nhwc(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def _to_layout(variant: Variant, args: list[Any], ready: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Move the inputs in `args` (in place) to the variant's layout, except those in `ready`;
    the indices moved (NHWC variants' activation inputs)."""
    if variant.layout != "NHWC":
        return ()
    moved = tuple(i for i in _nhwc_inputs(variant)
                  if i < len(args) and _is_arr(args[i]) and i not in ready)
    for i in moved:
        args[i] = _to_nhwc(args[i])
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
    _to_layout(variant, args, ready)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = (variant.fn if fn is None else fn)(*args, **kw)
    # a tuple is several outputs; a list is one sequence-typed output (as the executor sees it)
    outs = list(res) if type(res) is tuple else [res]
    outs = [np.asarray(o) if isinstance(o, np.generic) else o for o in outs]
    if nhwc and nhwc_out and outs and _is_arr(outs[0]):
        outs[0] = _from_nhwc(outs[0])
    return outs


def _scratch_note(pool: dict[str, int]) -> str:
    """'; of which kernel scratch tag 123, ...' for a workspace failure, largest first."""
    if not pool:
        return ""
    top = sorted(pool.items(), key=lambda kv: -kv[1])
    return "; of which kernel scratch " + ", ".join(f"{t} {n}" for t, n in top[:6])


def accepts(variant: Variant, case: I.Case) -> bool:
    """Would placement give this case to the variant (dtype declaration and `when` predicate)?"""
    facts = [_fact(x) for x in case.inputs]
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


def _fact(x: Any) -> TensorFact:
    if _is_arr(x):
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
    if not _is_arr(want) or not _is_arr(got):
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


def _same(a: Any, b: Any) -> bool:
    """Bitwise-equal results (NaN equal to NaN): what repeated calls must return."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if _is_arr(a) and _is_arr(b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "O":
            return a.tolist() == b.tolist()
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    return type(a) is type(b)


# ---------------------------------------------------------------- the checker ----------------


class _Checker:
    """All checks of one variant; the reference variant's results are cached per case."""

    def __init__(self, opdef: OpDef, variant: Variant, ctx: _Context) -> None:
        self.op = opdef
        self.var = variant
        self.ctx = ctx
        self.ref = next(v for v in opdef.variants if v.reference)
        self.is_ref = variant.reference
        self.contract = opdef.contract
        self.normwise = opdef.contract.tolerance == "normwise"
        self.custom = opdef.domain not in STANDARD_DOMAINS
        self.report = VariantReport(
            opdef.op_type, opdef.domain, opdef.since, variant.name, variant.device
        )
        self.data = ctx.data(opdef)

    # results --------------------------------------------------------------------------------
    def ref_out(self, case: I.Case) -> list | BaseException:
        return self.ctx.ref_out(self.ref, case)

    def run(self, case: I.Case, **extra: Any) -> list:
        """The variant on a private copy of the case's inputs."""
        return call(self.var, case, case.fresh_inputs(), **extra)

    def run_bound(self, case: I.Case) -> list:
        """The variant's node-bound kernel (Variant.specialize, bound to a node with the case's
        attributes) on private copies, called twice: the first call prepares, the second runs
        what it prepared. Inputs after the first are marked constant, as a session marks its
        initializers (weights), so a kernel that prepares only for constants is exercised."""
        inputs = case.fresh_inputs()
        for x in inputs[1:]:
            if isinstance(x, np.ndarray):
                mark_constant(x)
        assert self.var.specialize is not None
        bound = self.var.specialize(dict(case.attrs))
        call(self.var, case, inputs, fn=bound)
        return call(self.var, case, inputs, fn=bound)

    def mine(self, cases: Iterable[I.Case]) -> list[I.Case]:
        return sorted((c for c in cases if accepts(self.var, c)), key=lambda c: c.size)

    # orchestration --------------------------------------------------------------------------
    def run_all(self, checks: Iterable[str]) -> VariantReport:
        t0 = time.perf_counter()
        for name in CHECKS:
            if name not in checks:
                continue
            fn = getattr(self, f"check_{name}")
            try:
                res = fn()
            except CheckFailure as e:
                res = ("fail", str(e), None)
            except Exception as e:  # noqa: BLE001 - a crashing check is reported, not raised
                res = ("fail", f"the check itself crashed: {type(e).__name__}: {e}", None)
            status, detail, case = res if isinstance(res, tuple) else (res, "", None)
            self.report.checks[name] = status
            if status == "skip":
                self.report.skipped[name] = detail
            elif status == "fail":
                self.report.failures.append(
                    {
                        "check": name,
                        "detail": detail,
                        "input": case.describe() if isinstance(case, I.Case) else case,
                    }
                )
        self.report.seconds = time.perf_counter() - t0
        return self.report

    def _first_failure(self, cases: list[I.Case], probe) -> tuple | None:
        """Run `probe(case) -> detail | None` over cases smallest first; the first failure."""
        for c in cases:
            detail = probe(c)
            if detail:
                return ("fail", detail, c)
        return None

    # numerics ---------------------------------------------------------------------------------
    def check_numerics(self):
        cases = self.mine(self.data.base + self.data.given)
        if not cases:
            return ("skip", "no input this variant accepts could be generated", None)
        if self.is_ref:
            return self._ref_numerics(cases)
        compared = 0

        def probe_with(run, what: str):
            """A probe comparing run(case) with the reference, its failures prefixed `what`."""

            def probe(c: I.Case) -> str | None:
                nonlocal compared
                want = self.ref_out(c)
                if isinstance(want, BaseException):
                    return None
                try:
                    got = run(c)
                except Exception as e:  # noqa: BLE001
                    return f"{what}raised {type(e).__name__}: {e} (the reference kernel did not)"
                compared += 1
                detail = self._compare(got, want)
                return None if detail is None else what + detail

            return probe

        fail = self._first_failure(cases, probe_with(self.run, ""))
        if fail:
            return fail
        if not compared:
            return ("skip", "the reference kernel rejected every generated input", None)
        if self.var.specialize is not None:
            fail = self._first_failure(
                cases, probe_with(self.run_bound, "node-bound kernel, prepared call: ")
            )
            if fail:
                return fail
        return "pass"

    def _compare(self, got: list, want: list) -> str | None:
        if len(got) < len(want):
            return f"{len(got)} outputs, the reference gives {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            if not self.contract.deterministic:
                if _is_arr(g) and _is_arr(w) and (g.shape != w.shape or g.dtype != w.dtype):
                    return (
                        f"output {j}: {g.dtype}{list(g.shape)} vs reference "
                        f"{w.dtype}{list(w.shape)}"
                    )
                continue
            m = mismatch(g, w, f"output {j}", self.normwise)
            if m:
                return m
        return None

    def _compare_layout(self, got: list, want: list) -> str | None:
        if len(got) < len(want):
            return f"{len(got)} outputs, the reference gives {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            if _is_arr(g) and _is_arr(w) and (g.shape != w.shape or g.dtype != w.dtype):
                return f"output {j}: {g.dtype}{list(g.shape)} vs reference {w.dtype}{list(w.shape)}"
        return None

    def _ref_numerics(self, cases: list[I.Case]):
        """The reference against the ONNX node suite's expected outputs; outputs of the declared
        dtypes; repeated calls give identical results when the contract says deterministic."""
        from opwarden.verify.conformance import compare, undefined_for_node

        sch = self.op.schema_for(I.governed_opset(self.op))
        ran = 0
        for c in cases:
            got = self.ref_out(c)
            if isinstance(got, BaseException):
                if c.source == "sample":
                    return ("fail", f"raised {type(got).__name__} on a declared sample: {got}", c)
                if c.source == "suite" and not isinstance(got, OpwardenError):
                    return ("fail", f"raised {type(got).__name__}: {got}", c)
                continue
            ran += 1
            if c.expected is not None:
                undefined = (undefined_for_node(c.node, c.inputs) if c.node is not None
                             else [None] * len(c.expected))
                try:
                    for j, (e, g) in enumerate(zip(c.expected, got)):
                        if e is not _ABSENT:
                            compare(e, g, c.rtol, c.atol, f"output {j}", undefined[j])
                except AssertionError as err:
                    return ("fail", f"differs from the ONNX node suite: {err}", c)
                continue
            for j, g in enumerate(got):
                p = sch.output_param(j)
                if not _is_arr(g) or p is None:
                    continue
                allowed = sch.allowed_dtypes(p.type_str)
                if allowed is not None and dtype_name(g.dtype) not in allowed:
                    return (
                        "fail",
                        f"output {j} has dtype {dtype_name(g.dtype)}, the schema "
                        f"allows {p.type_str} in {sorted(allowed)}",
                        c,
                    )
            if self.contract.deterministic:
                again = self.run(c)
                if not _same(again, got):
                    return (
                        "fail",
                        "two calls on the same input gave different results "
                        "(the contract says deterministic)",
                        c,
                    )
        if not ran:
            return ("skip", "the reference kernel rejected every generated input", None)
        return "pass"

    # boundary ---------------------------------------------------------------------------------
    def check_boundary(self):
        cases = self.mine(self.data.boundary)
        if not cases:
            return ("skip", "no boundary inputs for this operator's schema", None)
        tried = 0

        def probe(c: I.Case) -> str | None:
            nonlocal tried
            want = self.ref_out(c)
            if self.is_ref:
                if isinstance(want, OpwardenError):
                    return None  # a clear refusal is acceptable
                if isinstance(want, BaseException):
                    return f"raised {type(want).__name__}: {want} (not an OpwardenError)"
                tried += 1
                return self._shape_agrees(c, want)
            if isinstance(want, BaseException):
                return None
            tried += 1
            try:
                got = self.run(c)
            except OpwardenError:
                return None
            except Exception as e:  # noqa: BLE001
                return f"raised {type(e).__name__}: {e} (the reference kernel did not)"
            if self.report.checks.get("numerics") == "fail":
                # values are the numerics check's finding; here only count, dtype and shape
                return self._compare_layout(got, want)
            return self._compare(got, want)

        fail = self._first_failure(cases, probe)
        if fail:
            return fail
        if not tried:
            return ("skip", "the reference refuses every boundary input", None)
        return "pass"

    def _shape_agrees(self, c: I.Case, outs: list) -> str | None:
        exp = self.data.expect_shape(c)
        if exp is None or not outs or not _is_arr(outs[0]):
            return None
        if tuple(outs[0].shape) != tuple(exp):
            return f"output 0 has shape {list(outs[0].shape)}, the shape rule says {list(exp)}"
        return None

    # nan ----------------------------------------------------------------------------------------
    def check_nan(self):
        policy = self.contract.nan
        floats = [c for c in self.mine(self.data.base + self.data.given) if _float_inputs(c)]
        if not floats:
            return ("skip", "no floating-point inputs", None)
        if policy == "none":
            for c in floats:
                got = self._ref_or_run(c)
                if got is None:
                    continue
                for j, g in enumerate(got):
                    if _is_arr(g) and g.dtype.kind == "f" and g.size and np.isnan(g).any():
                        return ("fail", f"nan='none' but output {j} holds NaN", c)
            return "pass"
        checked = 0
        if policy in ("propagate", "suppress"):
            for c in floats:
                if any(
                    _is_arr(x) and x.dtype.kind == "f" and np.isnan(x).any()
                    for x in c.inputs
                    if _is_arr(x)
                ):
                    continue
                got = self._ref_or_run(c)
                if got is None:
                    continue
                checked += 1
                for j, g in enumerate(got):
                    if _is_arr(g) and g.dtype.kind in "fc" and g.size and np.isnan(g).any():
                        return (
                            "fail",
                            f"nan={policy!r}, but output {j} has "
                            f"{int(np.isnan(g).sum())} NaN from finite inputs "
                            "(declare nan='produce' if the math creates NaN)",
                            c,
                        )
        if policy in ("propagate", "produce"):
            for c in self.data.nan_cases(self.var):
                got = self._ref_or_run(c)
                if got is None:
                    continue
                checked += 1
                detail = self.data.nan_lost(c, got)
                if detail:
                    return ("fail", f"nan={policy!r}: {detail}", c)
                if not self.is_ref:
                    want = self.ref_out(c)
                    if not isinstance(want, BaseException):
                        for j, (g, w) in enumerate(zip(got, want)):
                            if (
                                _is_arr(g)
                                and _is_arr(w)
                                and g.shape == w.shape
                                and g.dtype.kind == "f"
                                and w.dtype.kind == "f"
                                and not np.array_equal(np.isnan(g), np.isnan(w))
                            ):
                                return (
                                    "fail",
                                    f"output {j}: NaN positions differ from the reference kernel's",
                                    c,
                                )
        if not checked:
            return ("skip", "no NaN probe applies to this operator's inputs", None)
        return "pass"

    def _ref_or_run(self, c: I.Case) -> list | None:
        try:
            if self.is_ref:
                out = self.ref_out(c)
                return None if isinstance(out, BaseException) else out
            return self.run(c)
        except Exception:  # noqa: BLE001 - crashes are the numerics/boundary checks' business
            return None

    # overflow -----------------------------------------------------------------------------------
    def check_overflow(self):
        policy = self.contract.overflow
        cases = self.mine(self.data.overflow_cases())
        if not cases:
            return ("skip", "no narrow integer (8/16-bit) inputs to overflow", None)
        checked = 0
        for c in cases:
            got = self._ref_or_run(c)
            wide_case = I.Case(
                [
                    x.astype(np.int64) if _is_arr(x) and x.dtype.kind in "iu" else x
                    for x in c.inputs
                ],
                c.attrs,
                c.label + " widened to int64",
            )
            try:
                wide = call(self.ref, wide_case)
            except Exception:  # noqa: BLE001 - the reference may not take int64
                continue
            if got is None:
                continue
            narrow_dt = next(x.dtype for x in c.inputs if _is_arr(x) and x.dtype.kind in "iu")
            info = np.iinfo(narrow_dt)
            for j, (g, w) in enumerate(zip(got, wide)):
                if not (_is_arr(g) and _is_arr(w)) or g.dtype != narrow_dt or g.shape != w.shape:
                    continue
                if w.dtype.kind not in "iu":
                    continue
                checked += 1
                w = w.astype(np.int64)
                out_of_range = (w < info.min) | (w > info.max)
                if policy == "wrap":
                    want = w.astype(narrow_dt)
                elif policy == "saturate":
                    want = np.clip(w, info.min, info.max).astype(narrow_dt)
                else:
                    if out_of_range.any():
                        i = int(np.flatnonzero(out_of_range.ravel())[0])
                        return (
                            "fail",
                            f"overflow=None (cannot overflow), but output {j} "
                            f"overflows {narrow_dt}: exact result {int(w.ravel()[i])} at flat "
                            f"index {i}, kernel gives {g.ravel()[i]!r}; declare 'wrap' or "
                            "'saturate'",
                            c,
                        )
                    want = w.astype(narrow_dt)
                bad = g != want
                if bad.any():
                    i = int(np.flatnonzero(bad.ravel())[0])
                    kind = (
                        "wraps"
                        if g.ravel()[i] == w.astype(narrow_dt).ravel()[i]
                        else "saturates"
                        if g.ravel()[i] in (info.min, info.max)
                        else "differs"
                    )
                    return (
                        "fail",
                        f"overflow={policy!r}, but output {j} {kind}: exact result "
                        f"{int(w.ravel()[i])} at flat index {i} should give "
                        f"{int(want.ravel()[i])}, kernel gives {int(g.ravel()[i])}",
                        c,
                    )
        if not checked:
            return ("skip", "no output keeps a narrow integer dtype", None)
        return "pass"

    # mutation -------------------------------------------------------------------------------------
    def check_mutation(self):
        cases = self.mine(self.data.base + self.data.given + self.data.small_boundary())
        if not cases:
            return ("skip", "no input this variant accepts could be generated", None)
        declared = set(self.contract.mutates)
        ran = 0

        def probe(c: I.Case) -> str | None:
            nonlocal ran
            args = c.fresh_inputs()
            before = [I._copy(x) for x in args]
            try:
                call(self.var, c, args)
            except Exception:  # noqa: BLE001
                return None
            ran += 1
            for i, (a, b) in enumerate(zip(args, before)):
                if i in declared or not _is_arr(a):
                    continue
                if not _same(a, b):
                    n = int(np.sum(np.asarray(a != b))) if a.dtype.kind != "O" else -1
                    return (
                        f"input {i} was modified ({n} elements changed), but the contract "
                        f"declares mutates={tuple(sorted(declared))}"
                    )
            return None

        fail = self._first_failure(cases, probe)
        if fail:
            return fail
        return "pass" if ran else ("skip", "every call raised", None)

    # alias ----------------------------------------------------------------------------------------
    def check_alias(self):
        cases = self.mine(self.data.base + self.data.given + self.data.small_boundary())
        if not cases:
            return ("skip", "no input this variant accepts could be generated", None)
        ran = 0

        def probe(c: I.Case) -> str | None:
            nonlocal ran
            args = c.fresh_inputs()
            try:
                outs = call(self.var, c, args)
            except Exception:  # noqa: BLE001
                return None
            ran += 1
            may = self.contract.aliases(len(outs))
            must = self.contract.views(len(outs))
            for j, o in enumerate(outs):
                if not _is_arr(o) or o.size == 0:
                    continue
                for i, a in enumerate(args):
                    if not _is_arr(a) or a.size == 0 or not np.shares_memory(a, o):
                        continue
                    if (i, j) not in may:
                        return (
                            f"output {j} shares memory with input {i}, but the contract "
                            f"declares may_alias={sorted(may)}"
                        )
            for i, j in must:
                if (
                    i < len(args)
                    and j < len(outs)
                    and _is_arr(args[i])
                    and _is_arr(outs[j])
                    and args[i].size
                    and outs[j].size
                    and not np.shares_memory(args[i], outs[j])
                ):
                    return (
                        f"the contract says output {j} must alias input {i} (a view), "
                        "but it is a copy"
                    )
            if self.var.accepts_out:
                return self._out_probe(c)
            return None

        fail = self._first_failure(cases, probe)
        if fail:
            return fail
        return "pass" if ran else ("skip", "every call raised", None)

    def _out_probe(self, c: I.Case) -> str | None:
        want = self.ref_out(c)
        if isinstance(want, BaseException) or not want or not _is_arr(want[0]):
            return None
        w0 = want[0]
        nhwc = self.var.layout == "NHWC" and w0.ndim >= 3
        buf = np.empty(np.moveaxis(w0, 1, -1).shape if nhwc else w0.shape, w0.dtype)
        got = self.run(c, out=buf)
        # Not using `out` only wastes the planned buffer (the executor keeps the fresh result);
        # what was returned must still be right.
        m = mismatch(got[0], w0, "output 0 with out= given", self.normwise)
        if m:
            return m
        # In place: out= is the very array given as an input the contract lets output 0 share
        # (in the variant's layout), as the memory plan hands it.
        for i, j in sorted(set(self.contract.may_alias)):
            if j != 0 or i >= len(c.inputs) or not _is_arr(c.inputs[i]):
                continue
            args = c.fresh_inputs()
            moved = nhwc and i in _nhwc_inputs(self.var)
            # (np.array, not ascontiguousarray, which makes rank 0 rank 1)
            args[i] = _to_nhwc(args[i]) if moved else np.array(args[i], order="C")
            if args[i].shape != buf.shape or args[i].dtype != w0.dtype:
                continue
            res = call(self.var, c, args, ready=(i,) if moved else (), out=args[i])
            m = mismatch(res[0], w0, f"output 0 computed in place (out is input {i})",
                         self.normwise)
            if m:
                return m
        return None

    # workspace ------------------------------------------------------------------------------------
    def check_workspace(self):
        # Every sample (they are written to reach each path of the fast kernels, whose scratch
        # differs by path) and the three largest other cases (temporaries show best there).
        # A case with declared constants is called once first: that call also packs the
        # weights into the cache a session keeps with them (weight memory, held once, not per
        # call); the call measured is the steady state's.
        mine = self.mine(self.data.base + self.data.given + self.data.large())
        if not mine:
            return ("skip", "no input this variant accepts could be generated", None)
        others = sorted((c for c in mine if c.source != "sample"), key=lambda c: c.size)
        cases = [c for c in mine if c.source == "sample"] + others[-3:]
        measured = 0
        for c in reversed(cases):
            args = c.fresh_inputs()
            # In the variant's layout before the measurement (the harness's copy is not the
            # kernel's), and the rule sees the shapes the kernel gets, as the planner does.
            moved = _to_layout(self.var, args)
            shapes = [tuple(x.shape) if _is_arr(x) else () for x in args]
            try:
                declared = self.var.workspace(shapes, c.attrs)
            except Exception as e:  # noqa: BLE001
                return ("fail", f"workspace_bytes raised {type(e).__name__}: {e}", c)
            if c.constants:
                try:
                    call(self.var, c, list(args), ready=moved)
                except Exception:  # noqa: BLE001
                    continue
            in_bytes = sum(x.nbytes for x in args if _is_arr(x))
            was = tracemalloc.is_tracing()
            if not was:
                tracemalloc.start()
            try:
                # A fresh scratch pool for the call: the kernels' thread-local scratch buffers
                # (kernels.util.scratch) persist between calls, so without it only the first
                # call that grew them would show them.
                with scratch_probe() as pool:
                    base = tracemalloc.get_traced_memory()[0]
                    tracemalloc.reset_peak()
                    try:
                        outs = call(self.var, c, args, ready=moved, nhwc_out=False)
                    except Exception:  # noqa: BLE001
                        continue
                    peak = tracemalloc.get_traced_memory()[1] - base
            finally:
                if not was:
                    tracemalloc.stop()
            out_bytes = sum(
                o.nbytes
                for o in outs
                if _is_arr(o) and not any(_is_arr(a) and np.shares_memory(a, o) for a in args)
            )
            used = peak - out_bytes
            slack = TEMP_FACTOR[self.is_ref] * (in_bytes + out_bytes) + TEMP_FIXED[self.is_ref]
            measured += 1
            if used > declared + slack:
                return (
                    "fail",
                    f"used {used} bytes of scratch (tracemalloc peak {peak} minus "
                    f"{out_bytes} bytes of outputs{_scratch_note(pool)}), declared "
                    f"workspace_bytes={declared} plus an allowance of {int(slack)} for "
                    "temporaries",
                    c,
                )
        return "pass" if measured else ("skip", "every call raised", None)

    # concurrency -------------------------------------------------------------------------------
    def check_concurrency(self):
        if not self.contract.thread_safe:
            return ("skip", "the contract declares thread_safe=False", None)
        if not self.contract.deterministic:
            return ("skip", "the contract declares deterministic=False", None)
        if self.contract.mutates:
            return ("skip", "the kernel mutates its inputs", None)
        per_thread = self.data.thread_cases(self.var, THREADS)
        per_thread = [c for c in per_thread if accepts(self.var, c)]
        if len(per_thread) < THREADS:
            return ("skip", "no input this variant accepts could be generated", None)
        try:
            serial = [self.run(c) for c in per_thread]
        except Exception:  # noqa: BLE001
            return ("skip", "the variant raises on the concurrency input", None)
        rounds = self.ctx.rounds if self.custom or not self.ctx.quick else 1
        calls = CALLS
        for _ in range(rounds):
            bad = _hammer(self.var, per_thread, serial, calls)
            if bad:
                t, k, detail = bad
                return (
                    "fail",
                    f"thread_safe=True, but thread {t} call {k} of {THREADS} threads "
                    f"x {calls} calls differs from the serial result: {detail}",
                    per_thread[t],
                )
        return "pass"

    # shape ----------------------------------------------------------------------------------------
    def check_shape(self):
        cases = self.mine(self.data.base + self.data.given + self.data.small_boundary())
        if not cases:
            return ("skip", "no input this variant accepts could be generated", None)
        if self.custom and self.op.infer_fn is None:
            return ("skip", "the operator has no .infer rule", None)
        compared = 0
        for c in cases:
            got = self._ref_or_run(c)
            if got is None:
                continue
            try:
                facts = self.data.rule_facts(c)
            except OpwardenError:
                continue
            except Exception as e:  # noqa: BLE001
                return ("fail", f"the shape rule raised {type(e).__name__}: {e}", c)
            if facts is None:
                continue
            for j, (g, f) in enumerate(zip(got, facts)):
                if f is None or not _is_arr(g):
                    continue
                compared += 1
                if f.dtype is not None and dtype_name(g.dtype) != f.dtype:
                    return (
                        "fail",
                        f"output {j} has dtype {dtype_name(g.dtype)}, the shape rule "
                        f"says {f.dtype}",
                        c,
                    )
                if f.shape is not None and (
                    len(f.shape) != g.ndim
                    or any(isinstance(d, int) and d != n for d, n in zip(f.shape, g.shape))
                ):
                    return (
                        "fail",
                        f"output {j} has shape {list(g.shape)}, the shape rule says "
                        f"{list(f.shape)}",
                        c,
                    )
        if not compared:
            return ("skip", "the shape rule gave no static facts for these inputs", None)
        return "pass"

    # grad --------------------------------------------------------------------------------------
    def check_grad(self):
        if self.op.grad_fn is None:
            return ("skip", "the operator has no .grad rule", None)
        if getattr(self.var, "layout", "any") not in ("any", "NCHW"):
            # The backward rule is stated in the ONNX layout; this variant's forward is held
            # to the reference by `numerics`, the rule itself is checked on the reference.
            return ("skip", f"{self.var.layout} variant: gradcheck runs in ONNX layout", None)
        try:
            from opwarden.verify.grads import gradcheck
        except ImportError:
            return ("skip", "opwarden.verify.grads (gradcheck) is not available", None)
        cases = [c for c in self.mine(self.data.base + self.data.given) if _float_inputs(c)]
        cases = [c for c in cases if not isinstance(self.ref_out(c), BaseException)]
        if not cases:
            return ("skip", "no floating-point input for gradcheck", None)
        c = next(
            (c for c in cases if any(_is_arr(x) and x.dtype == np.float64 for x in c.inputs)),
            cases[0],
        )
        args = [x.astype(np.float64) if _is_arr(x) and x.dtype.kind == "f" else x for x in c.inputs]
        res = gradcheck(self.var, args, dict(c.attrs))
        if not res.ok:
            return ("fail", f"gradcheck: {res.detail} (max error {res.max_error:.3g})", c)
        return "pass"


def _float_inputs(c: I.Case) -> bool:
    return any(_is_arr(x) and x.dtype.kind == "f" for x in c.inputs)


def _hammer(variant: Variant, cases: list[I.Case], serial: list, calls: int):
    """THREADS threads released together by a barrier, each calling `calls` times."""
    barrier = threading.Barrier(len(cases))
    bad: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        c = cases[t]
        try:
            barrier.wait()
            for k in range(calls):
                if bad:
                    return
                got = call(variant, c, c.fresh_inputs())
                if not _same(got, serial[t]):
                    m = mismatch(got, serial[t]) if isinstance(got, list) else None
                    with lock:
                        bad.append((t, k, m or "results differ bitwise"))
                    return
        except Exception as e:  # noqa: BLE001
            with lock:
                bad.append((t, -1, f"raised {type(e).__name__}: {e}"))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible to provoke races
    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(cases))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    return bad[0] if bad else None


# ---------------------------------------------------------------- per-op data ----------------


class _OpData:
    """Inputs of one operator version, built once and shared by its variants."""

    def __init__(self, opdef: OpDef, ctx: _Context) -> None:
        self.op = opdef
        self.ctx = ctx
        self.custom = opdef.domain not in STANDARD_DOMAINS
        self.rng = np.random.default_rng(ctx.seed)
        self.plan: I.Plan | None = None
        self.base: list[I.Case] = []
        # Cases given with the op: the ONNX node suite's (built-ins) and its declared samples.
        self.given: list[I.Case] = []
        self.boundary: list[I.Case] = []
        self.elementwise = False
        self.skip_reason = ""
        self._graph_attrs = any(
            s.type in ("GRAPH", "GRAPHS") for s in opdef.schema_for(opdef.since).attrs.values()
        )
        if self._graph_attrs:
            self.skip_reason = "graph attributes need a runtime (checked by the conformance suite)"
            return
        if not self.custom:
            try:
                self.given = I.suite_cases(opdef, limit=ctx.suite_limit, fast=ctx.fast_suite)
            except Exception:  # noqa: BLE001 - a broken suite module leaves no suite cases
                self.given = []
        samples = I.sample_cases(opdef, self.rng)
        self.given += samples
        try:
            self.plan = I.plan(opdef)
        except Exception:  # noqa: BLE001
            self.plan = None
        if self.plan is not None:
            self.base = I.base_cases(self.plan, self.rng)
            if self.custom and samples and self.base and all(
                isinstance(ctx.ref_out(_ref(opdef), c), BaseException) for c in self.base
            ):
                # The schema's default attributes are no valid call (FusedElementwise's empty
                # program): generate with those of a declared sample of as many inputs.
                fit = [c for c in samples if len(c.inputs) == self.plan.n_inputs]
                if fit:
                    self.plan.attrs = dict(fit[0].attrs)
                    self.base = I.base_cases(self.plan, self.rng)
            if not self.custom:
                # built-in ops: only those whose reference takes the generated inputs
                self.base = [
                    c
                    for c in self.base
                    if not isinstance(ctx.ref_out(_ref(opdef), c), BaseException)
                ]
            self.elementwise = self._is_elementwise()
            if not self.custom and not self.elementwise:
                self.base = []  # non-elementwise built-ins use the node suite's inputs
        self.boundary = self._boundary()

    def _is_elementwise(self) -> bool:
        ok = 0
        for c in self.base[:1]:
            for shape in (I.BASE_SHAPE, (2, 1, 3), (5,)):
                cc = I.Case(
                    [_reshape(self.rng, x, shape) for x in c.inputs],
                    dict(c.attrs),
                    "probe",
                    noutputs=c.noutputs,
                )
                out = self.ctx.ref_out(_ref(self.op), cc)
                if isinstance(out, BaseException) or not out or not _is_arr(out[0]):
                    return False
                if tuple(out[0].shape) != shape:
                    return False
                ok += 1
        return ok == 3

    def _boundary(self) -> list[I.Case]:
        out: list[I.Case] = []
        if self.elementwise and self.plan is not None:
            bcast = self.op.contract.broadcast == "multidirectional" or self.custom
            for b_i, b in enumerate(self.plan.bindings):
                for label, shapes in I.boundary_shapes(self.plan.n_inputs, bcast):
                    if b_i and "large" in label:
                        continue
                    dts = "/".join(I.binding_dtypes(self.plan, b))
                    out.append(
                        I.make_case(
                            self.plan, b, shapes, self.rng, f"{dts} {label}", source="boundary"
                        )
                    )
        for c in self.base[:3] + self.given:
            arrs = [x for x in c.inputs if _is_arr(x) and x.ndim and x.size]
            if not arrs:
                continue
            nc = c.copy()
            nc.inputs = [I.strided(x) if _is_arr(x) and x.ndim and x.size else x for x in c.inputs]
            for i in nc.constants:  # (a non-contiguous initializer, declared constant too)
                mark_constant(nc.inputs[i])
            nc.label, nc.source, nc.expected = c.label + " (non-contiguous)", "boundary", None
            out.append(nc)
        return out

    def small_boundary(self) -> list[I.Case]:
        return [c for c in self.boundary if c.size <= 4096]

    def large(self) -> list[I.Case]:
        return [c for c in self.boundary if c.size > 4096]

    # expected shapes --------------------------------------------------------------------------
    def expect_shape(self, c: I.Case) -> tuple | None:
        """Output 0's shape by broadcasting (elementwise ops) or by the shape rule."""
        if self.elementwise and c.node is None:
            try:
                return tuple(np.broadcast_shapes(*[x.shape for x in c.inputs if _is_arr(x)]))
            except ValueError:
                return None
        try:
            facts = self.rule_facts(c)
        except Exception:  # noqa: BLE001
            return None
        if not facts or facts[0] is None or not facts[0].static:
            return None
        return tuple(facts[0].shape)

    def rule_facts(self, c: I.Case) -> list[TensorFact | None] | None:
        """Output facts from the op's .infer rule, or onnx shape inference for built-ins."""
        facts = [_fact(x) for x in c.inputs]
        if self.op.infer_fn is not None:
            res = self.op.infer_fn(*facts, **c.attrs)
            res = list(res) if isinstance(res, (tuple, list)) else [res]
            return [r if isinstance(r, TensorFact) else None for r in res]
        if self.custom:
            return None
        return _onnx_infer(self.op, c)

    # NaN probes ---------------------------------------------------------------------------------
    def nan_cases(self, variant: Variant) -> list[I.Case]:
        out = []
        for c in self.base + self.given:
            if not _float_inputs(c):
                continue
            nc = c.copy()
            nc.expected = None
            if self.elementwise and self._pointwise(c):
                # input 0 always; the others only where every input is data (symmetric ops)
                every = self.custom or self.op.contract.broadcast == "multidirectional"
                for k, x in enumerate(nc.inputs):
                    if (k == 0 or every) and _is_arr(x) and x.dtype.kind == "f" and x.size:
                        x.ravel()[::3] = np.nan
                nc.label = c.label + " with NaN at every 3rd element"
            elif self.custom:
                x = nc.inputs[0]
                if not (_is_arr(x) and x.dtype.kind == "f" and x.size):
                    continue
                x[...] = np.nan
                nc.label = c.label + " with input 0 all NaN"
            else:
                continue
            if accepts(variant, nc):
                out.append(nc)
        return out[:4]

    def _pointwise(self, c: I.Case) -> bool:
        """Does the reference compute output 0 element by element on this case (its output
        permuted like the inputs when all inputs are permuted alike)? Shape-preserving ops that
        move elements (ChannelShuffle with group > 1) are not, whatever the shapes suggest.
        True when it cannot be told: inputs of different shapes, non-deterministic ops."""
        arrs = [x for x in c.inputs if _is_arr(x)]
        if (not self.op.contract.deterministic or not arrs or arrs[0].size < 2
                or any(x.shape != arrs[0].shape for x in arrs)):
            return True
        want = self.ctx.ref_out(_ref(self.op), c)
        if isinstance(want, BaseException) or not want or not _is_arr(want[0]):
            return True
        if want[0].shape != arrs[0].shape:
            return False
        perm = np.random.default_rng(7).permutation(arrs[0].size)
        moved = [x.ravel()[perm].reshape(x.shape) if _is_arr(x) else x for x in c.inputs]
        try:
            got = call(_ref(self.op), c, moved)
        except Exception:  # noqa: BLE001 - refusing permuted values: not element by element
            return False
        return bool(got) and mismatch(got[0], want[0].ravel()[perm].reshape(want[0].shape)) is None

    def nan_lost(self, c: I.Case, got: list) -> str | None:
        if not got or not _is_arr(got[0]) or got[0].dtype.kind not in "fc" or not got[0].size:
            return None
        o = got[0]
        if self.elementwise:
            for i, x in enumerate(c.inputs):
                if not (_is_arr(x) and x.dtype.kind == "f" and x.size):
                    continue
                try:
                    mask = np.broadcast_to(np.isnan(x), o.shape)
                except ValueError:
                    continue
                lost = mask & ~np.isnan(o)
                if lost.any():
                    k = int(np.flatnonzero(lost.ravel())[0])
                    return (
                        f"input {i} has NaN where output 0 has {o.ravel()[k].item()!r} "
                        f"(flat index {k}; {int(lost.sum())} NaN lost)"
                    )
            return None
        if not np.isnan(o).any():
            return "input 0 is all NaN, output 0 holds no NaN"
        return None

    # overflow probes ------------------------------------------------------------------------------
    def overflow_cases(self) -> list[I.Case]:
        if self.plan is None or not self.base:
            return []
        out = []
        for b in self.plan.bindings:
            dts = I.binding_dtypes(self.plan, b)
            narrow = [d for d in dts if d in INTS and np.dtype(d).itemsize <= 2]
            if not narrow or any(d != narrow[0] for d in dts if d in INTS):
                continue
            n_int = sum(d in INTS for d in dts)
            vals = I.extreme_ints(narrow[0], 11)
            grids = np.meshgrid(*([vals] * min(n_int, 2)), indexing="ij")
            flat = [g.ravel() for g in grids]
            inputs, k = [], 0
            for d in dts:
                if d in INTS:
                    inputs.append(np.ascontiguousarray(flat[min(k, len(flat) - 1)]))
                    k += 1
                else:
                    inputs.append(I.random_array(self.rng, d, flat[0].shape))
            out.append(
                I.Case(
                    inputs,
                    dict(self.plan.attrs),
                    f"{'/'.join(dts)} extreme values",
                    source="overflow",
                    noutputs=max(1, self.plan.schema.min_outputs),
                )
            )
        return out

    # concurrency inputs ---------------------------------------------------------------------------
    def thread_cases(self, variant: Variant, n: int) -> list[I.Case]:
        """n inputs, distinct per thread where they can be generated, big enough to race on."""
        mine = [c for c in self.base if accepts(variant, c)]
        if mine and self.plan is not None:
            c0 = mine[0]
            shape = I.CONCURRENCY_SHAPE if self.elementwise else None
            out = []
            for t in range(n):
                rng = np.random.default_rng(1000 + t)
                inputs = [_reshape(rng, x, shape or x.shape) for x in c0.inputs]
                out.append(
                    I.Case(
                        inputs,
                        dict(c0.attrs),
                        f"{c0.label.split()[0]} thread {t} {list(shape or c0.inputs[0].shape)}",
                        noutputs=c0.noutputs,
                    )
                )
            if not isinstance(self.ctx.ref_out(_ref(self.op), out[0]), BaseException):
                return out
            if not isinstance(self.ctx.ref_out(_ref(self.op), c0), BaseException):
                return [c0] * n
            # (a custom op's schema-made inputs the reference rejects: its given cases)
        mine = [c for c in self.given if accepts(variant, c)]
        if not mine:
            return []
        c0 = mine[-1]
        samples = [c for c in mine if c.source == "sample"]
        if samples:
            # the largest that keeps THREADS x CALLS calls quick
            c0 = ([c for c in samples if c.size <= THREAD_SAMPLE_ELEMENTS] or samples[:1])[-1]
            # Distinct float data per thread (shapes, dtypes and attributes of the sample);
            # declared constants shared by all, as concurrent runs share a session's weights
            # (and race to fill the caches kernels keep for them).
            out = []
            for t in range(n):
                rng = np.random.default_rng(1000 + t)
                inputs = [
                    _reshape(rng, x, x.shape)
                    if _is_arr(x) and x.dtype.kind == "f" and i not in c0.constants else x
                    for i, x in enumerate(c0.inputs)
                ]
                out.append(I.Case(inputs, dict(c0.attrs), f"{c0.label} thread {t}",
                                  source="sample", noutputs=c0.noutputs, opset=c0.opset,
                                  constants=c0.constants))
            if not isinstance(self.ctx.ref_out(_ref(self.op), out[0]), BaseException):
                return out
        return [c0] * n


def _reshape(rng: np.random.Generator, x: Any, shape: tuple) -> Any:
    """A fresh random array like x (same dtype) of `shape`."""
    if not _is_arr(x):
        return x
    return I.random_array(rng, dtype_name(x.dtype), tuple(shape))


def _ref(opdef: OpDef) -> Variant:
    return next(v for v in opdef.variants if v.reference)


def _onnx_infer(opdef: OpDef, c: I.Case) -> list[TensorFact | None] | None:
    """Output facts by onnx's shape inference on a one-node model with these input types."""
    import onnx
    from onnx import helper

    from opwarden.dtypes import onnx_type
    from opwarden.ir.export import attribute_proto

    if c.node is not None:
        node = onnx.NodeProto()
        node.CopyFrom(c.node)
        opset = c.opset
    else:
        node = helper.make_node(
            opdef.op_type,
            [f"i{k}" if x is not None else "" for k, x in enumerate(c.inputs)],
            [f"o{j}" for j in range(c.noutputs)],
            domain=opdef.domain,
        )
        node.attribute.extend(
            attribute_proto(k, v)
            for k, v in c.attrs.items()
            if v is not None and not (isinstance(v, list) and not v)
        )
        opset = c.opset or opdef.since
    vis = []
    for name, x in zip(node.input, c.inputs):
        if not name or not _is_arr(x):
            if name:
                return None
            continue
        vis.append(helper.make_tensor_value_info(name, onnx_type(x.dtype), list(x.shape)))
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    g = helper.make_graph([node], "g", vis, outs)
    imports = [helper.make_opsetid(opdef.domain, opset)]
    if opdef.domain:
        imports.append(helper.make_opsetid("", 21))
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 8
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 - onnx's inference may reject corner cases
        return None
    from opwarden.ir.load import type_fact

    types = {vi.name: vi.type for vi in inferred.graph.output}
    types.update({vi.name: vi.type for vi in inferred.graph.value_info})
    res: list[TensorFact | None] = []
    for o in node.output:
        tp = types.get(o)
        if tp is None or not o:
            res.append(None)
            continue
        kind, fact = type_fact(tp)
        res.append(fact if kind == "tensor" and (fact.shape is not None or fact.dtype) else None)
    return res


# ---------------------------------------------------------------- entry point ----------------


class _Context:
    def __init__(
        self, seed: int, quick: bool, suite_limit: int, rounds: int, fast_suite: bool = False
    ) -> None:
        self.fast_suite = fast_suite
        self.seed = seed
        self.quick = quick
        self.suite_limit = suite_limit
        self.rounds = rounds
        self._data: dict[int, _OpData] = {}
        self._ref: dict[int, Any] = {}

    def data(self, opdef: OpDef) -> _OpData:
        d = self._data.get(id(opdef))
        if d is None:
            d = self._data[id(opdef)] = _OpData(opdef, self)
        return d

    def ref_out(self, ref: Variant, case: I.Case) -> list | BaseException:
        key = id(case)
        hit = self._ref.get(key)
        if hit is not None and hit[0] is case:
            return hit[1]
        try:
            res: Any = call(ref, case, case.fresh_inputs())
        except Exception as e:  # noqa: BLE001 - recorded; each check decides what it means
            res = e
        self._ref[key] = (case, res)
        return res


def _select(target: Any, device: str | None) -> list[tuple[OpDef, Variant]]:
    from opwarden.ops import REGISTRY

    if isinstance(target, Variant):
        pairs = [(target.op, target)]
    elif isinstance(target, OpDef):
        pairs = [(target, v) for v in target.variants]
    else:
        ops = REGISTRY.all()
        if target is not None:
            want = str(target)
            dom, _, name = want.rpartition("::")
            pairs = []
            for o in ops:
                for v in o.variants:
                    if (
                        v.name == want
                        or (o.op_type == name and (not dom or o.domain == dom))
                        or o.qualname == want
                    ):
                        pairs.append((o, v))
            if not pairs:
                from opwarden.errors import OptionsError

                raise OptionsError(f"no operator or variant named {want!r} is registered")
        else:
            pairs = [(o, v) for o in ops for v in o.variants]
    if device:
        pairs = [(o, v) for o, v in pairs if v.device == device]
    return pairs


def check(
    target: Any = None,
    *,
    device: str | None = None,
    checks: Iterable[str] | None = None,
    seed: int = 0,
    quick: bool = False,
    suite_limit: int = 6,
    rounds: int = 3,
    fast_suite: bool = False,
    progress: Any = None,
) -> Report:
    """Check every variant of `target` (an op object, a variant, a name, or None for all).

    ``quick``: one concurrency round for built-in ops (custom ops always get ``rounds``);
    ``suite_limit``: node-suite cases per op; ``fast_suite``: skip node-suite modules whose
    generation is slow (pooling) unless the whole suite is already loaded.
    """
    wanted = tuple(checks) if checks is not None else CHECKS
    unknown = [c for c in wanted if c not in CHECKS]
    if unknown:
        from opwarden.errors import OptionsError

        raise OptionsError(f"unknown checks {unknown}; known: {list(CHECKS)}")
    pairs = _select(target, device)
    ctx = _Context(seed, quick, suite_limit, rounds, fast_suite)
    if len({id(o) for o, _ in pairs}) > 20 and any(o.domain in STANDARD_DOMAINS for o, _ in pairs):
        I.preload_suite()
    report = Report()
    t0 = time.perf_counter()
    for opdef, variant in pairs:
        chk = _Checker(opdef, variant, ctx)
        if chk.data.skip_reason:
            vr = chk.report
            for name in wanted:
                vr.checks[name] = "skip"
                vr.skipped[name] = chk.data.skip_reason
        else:
            vr = chk.run_all(wanted)
        report.variants.append(vr)
        if progress is not None:
            progress(vr)
    report.seconds = time.perf_counter() - t0
    return report
