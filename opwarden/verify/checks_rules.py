"""The rule checks of the harness: shape and grad (a mixin of the checker).

``shape``: outputs have the dtype and static dims the operator's shape rule gives (its
``.infer`` rule, or onnx shape inference for built-ins; ``OpData.rule_facts``). ``grad``: the
operator's ``.grad`` rule against central finite differences (``grads.gradcheck``), in float64
and the ONNX layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opwarden.dtypes import dtype_name
from opwarden.errors import OpwardenError
from opwarden.verify.calling import call, float_inputs, is_arr

if TYPE_CHECKING:
    from opwarden.ops.base import OpDef, Variant
    from opwarden.verify.opdata import OpData


class RuleChecks:
    """check_shape, check_grad; mixed into harness._Checker, which provides the attributes
    below and ref_out / mine / _ref_or_run."""

    op: OpDef
    var: Variant
    custom: bool
    data: OpData

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
                if f is None or not is_arr(g):
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
        cases = [c for c in self.mine(self.data.base + self.data.given) if float_inputs(c)]
        cases = [c for c in cases if not isinstance(self.ref_out(c), BaseException)]
        cases = sorted(cases, key=lambda c: not any(is_arr(x) and x.dtype == np.float64
                                                    for x in c.inputs))
        # The case is run in float64; one whose outputs stay narrower (a Cast's `to` fixes
        # them) would compare the derivative with float32/float16 rounding noise.
        picked = None
        for c in cases:
            args = [x.astype(np.float64) if is_arr(x) and x.dtype.kind == "f" else x
                    for x in c.inputs]
            try:
                outs = call(self.ref, c, args)
            except Exception:  # noqa: BLE001 - not a case this check can use
                continue
            if not any(is_arr(o) and o.dtype.kind == "f" and o.dtype.itemsize < 8 for o in outs):
                picked = c, args
                break
        if picked is None:
            return ("skip", "no floating-point case that stays float64 for gradcheck", None)
        c, args = picked
        res = gradcheck(self.var, args, dict(c.attrs))
        if not res.ok:
            return ("fail", f"gradcheck: {res.detail} (max error {res.max_error:.3g})", c)
        return "pass"

