"""The value checks of the harness: numerics, boundary, nan and overflow (a mixin of the checker).

``numerics``: a variant against the reference kernel on the generated, node-suite and sample
inputs (and its node-bound kernel, prepared then called); the reference itself against the ONNX
node suite's expected outputs, the schema's output dtypes and, when deterministic, itself.
``boundary``: the same on empty, broadcast, large and non-contiguous inputs (the reference
may refuse them with an OpwardenError). ``nan`` and ``overflow``: the contract's declared NaN
and integer-overflow policies, probed with NaN-filled and extreme narrow-integer inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from opwarden.dtypes import dtype_name
from opwarden.errors import OpwardenError
from opwarden.verify import inputs as I
from opwarden.verify.calling import call, float_inputs, is_arr, mismatch, same

if TYPE_CHECKING:
    from opwarden.contract import Contract
    from opwarden.ops.base import OpDef, Variant
    from opwarden.verify.opdata import OpData


class NumericChecks:
    """check_numerics, check_boundary, check_nan, check_overflow; mixed into harness._Checker,
    which provides the attributes below and run / ref_out / mine / _first_failure /
    _ref_or_run."""

    op: OpDef
    var: Variant
    ref: Variant
    is_ref: bool
    contract: Contract
    normwise: bool
    data: OpData
    report: Any

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
                if is_arr(g) and is_arr(w) and (g.shape != w.shape or g.dtype != w.dtype):
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
            if is_arr(g) and is_arr(w) and (g.shape != w.shape or g.dtype != w.dtype):
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
                        if e is not I.ABSENT:
                            compare(e, g, c.rtol, c.atol, f"output {j}", undefined[j])
                except AssertionError as err:
                    return ("fail", f"differs from the ONNX node suite: {err}", c)
                continue
            for j, g in enumerate(got):
                p = sch.output_param(j)
                if not is_arr(g) or p is None:
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
                if not same(again, got):
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
        if exp is None or not outs or not is_arr(outs[0]):
            return None
        if tuple(outs[0].shape) != tuple(exp):
            return f"output 0 has shape {list(outs[0].shape)}, the shape rule says {list(exp)}"
        return None


    # nan ----------------------------------------------------------------------------------------
    def check_nan(self):
        policy = self.contract.nan
        floats = [c for c in self.mine(self.data.base + self.data.given) if float_inputs(c)]
        if not floats:
            return ("skip", "no floating-point inputs", None)
        if policy == "none":
            for c in floats:
                got = self._ref_or_run(c)
                if got is None:
                    continue
                for j, g in enumerate(got):
                    if is_arr(g) and g.dtype.kind == "f" and g.size and np.isnan(g).any():
                        return ("fail", f"nan='none' but output {j} holds NaN", c)
            return "pass"
        checked = 0
        if policy in ("propagate", "suppress"):
            for c in floats:
                if any(
                    is_arr(x) and x.dtype.kind == "f" and np.isnan(x).any()
                    for x in c.inputs
                    if is_arr(x)
                ):
                    continue
                got = self._ref_or_run(c)
                if got is None:
                    continue
                checked += 1
                for j, g in enumerate(got):
                    if is_arr(g) and g.dtype.kind in "fc" and g.size and np.isnan(g).any():
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
                                is_arr(g)
                                and is_arr(w)
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
                    x.astype(np.int64) if is_arr(x) and x.dtype.kind in "iu" else x
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
            narrow_dt = next(x.dtype for x in c.inputs if is_arr(x) and x.dtype.kind in "iu")
            info = np.iinfo(narrow_dt)
            for j, (g, w) in enumerate(zip(got, wide)):
                if not (is_arr(g) and is_arr(w)) or g.dtype != narrow_dt or g.shape != w.shape:
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
