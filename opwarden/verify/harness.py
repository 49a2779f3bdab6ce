"""The validation harness: every variant of an operator checked against its schema and contract.

``check(op_or_variant)`` runs, per variant, the checks named in ``CHECKS`` on inputs generated
from the schema (``inputs.plan``), taken from the ONNX node suite (``inputs.suite_cases``) and
from the samples an operator declares (``OpDef.samples``, ``inputs.sample_cases``). Each check
is "pass", "fail" or "skip" (with a reason); a failure keeps the smallest failing input.

The checks live in mixins of the checker, by kind: checks_numeric.py (numerics, boundary, nan,
overflow), checks_memory.py (mutation, alias, workspace), checks_concurrency.py, checks_rules.py
(shape, grad). Calling and comparing are in calling.py, the per-operator inputs in opdata.py;
this module holds the reports, the checker's core (results, orchestration) and `check`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import OpDef, Variant
from opwarden.ops.schema import STANDARD_DOMAINS
from opwarden.verify import inputs as I
from opwarden.verify.calling import LOW_PRECISION, TOLERANCE, accepts, call, mismatch
from opwarden.verify.checks_concurrency import CALLS, THREADS, ConcurrencyChecks
from opwarden.verify.checks_memory import TEMP_FACTOR, TEMP_FIXED, MemoryChecks
from opwarden.verify.checks_numeric import NumericChecks
from opwarden.verify.checks_rules import RuleChecks
from opwarden.verify.opdata import THREAD_SAMPLE_ELEMENTS, Context

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


class CheckFailure(Exception):
    """Raised inside a check with the detail of a contract violation."""


# ---------------------------------------------------------------- the checker ----------------


class _Checker(NumericChecks, MemoryChecks, ConcurrencyChecks, RuleChecks):
    """All checks of one variant; the reference variant's results are cached per case."""

    def __init__(self, opdef: OpDef, variant: Variant, ctx: Context) -> None:
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

    def _ref_or_run(self, c: I.Case) -> list | None:
        try:
            if self.is_ref:
                out = self.ref_out(c)
                return None if isinstance(out, BaseException) else out
            return self.run(c)
        except Exception:  # noqa: BLE001 - crashes are the numerics/boundary checks' business
            return None


# ---------------------------------------------------------------- entry point ----------------


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
    ctx = Context(seed, quick, suite_limit, rounds, fast_suite)
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


__all__ = [
    "CALLS", "CHECKS", "LOW_PRECISION", "TEMP_FACTOR", "TEMP_FIXED", "THREADS",
    "THREAD_SAMPLE_ELEMENTS", "TOLERANCE", "CheckFailure", "Report", "VariantReport", "accepts",
    "call", "check", "mismatch",
]  # fmt: skip
