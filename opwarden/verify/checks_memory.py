"""The memory checks of the harness: mutation, alias and workspace (a mixin of the checker).

``mutation``: inputs the contract does not list in ``mutates`` come back unchanged.
``alias``: outputs share memory with inputs only as ``may_alias`` allows and are views where
``views`` demands it; a variant that accepts ``out=`` computes right into a fresh buffer and
in place. ``workspace``: the scratch a call allocates (tracemalloc peak minus its outputs,
kernel scratch pools included) stays within the declared workspace rule plus an allowance.
"""

from __future__ import annotations

import tracemalloc
from typing import TYPE_CHECKING

import numpy as np

from opwarden.kernels.cpu.util import scratch_probe
from opwarden.verify import inputs as I
from opwarden.verify.calling import (
    call,
    is_arr,
    mismatch,
    nhwc_inputs,
    same,
    to_layout,
    to_nhwc,
)

if TYPE_CHECKING:
    from opwarden.contract import Contract
    from opwarden.ops.base import Variant
    from opwarden.verify.opdata import OpData

# Workspace: a kernel's outputs are not workspace, but NumPy temporaries are unavoidable in a
# reference kernel, so its measured peak (minus the returned outputs) may exceed the declared
# workspace by TEMP_FACTOR x (input + output bytes) plus a fixed allowance for small objects.
# The other variants (fast kernels, custom ops' own variants) write into planned buffers:
# every array-sized temporary they make must be in their declaration (Variant.workspace_bytes
# or the contract's), and only small objects are allowed for.
TEMP_FACTOR = {True: 8.0, False: 0.0}  # reference / other variants
TEMP_FIXED = {True: 1 << 20, False: 1 << 18}


def _scratch_note(pool: dict[str, int]) -> str:
    """'; of which kernel scratch tag 123, ...' for a workspace failure, largest first."""
    if not pool:
        return ""
    top = sorted(pool.items(), key=lambda kv: -kv[1])
    return "; of which kernel scratch " + ", ".join(f"{t} {n}" for t, n in top[:6])


class MemoryChecks:
    """check_mutation, check_alias, check_workspace; mixed into harness._Checker, which
    provides the attributes below and run / ref_out / mine / _first_failure."""

    var: Variant
    is_ref: bool
    contract: Contract
    normwise: bool
    data: OpData

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
                if i in declared or not is_arr(a):
                    continue
                if not same(a, b):
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
                if not is_arr(o) or o.size == 0:
                    continue
                for i, a in enumerate(args):
                    if not is_arr(a) or a.size == 0 or not np.shares_memory(a, o):
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
                    and is_arr(args[i])
                    and is_arr(outs[j])
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
        if isinstance(want, BaseException) or not want or not is_arr(want[0]):
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
            if j != 0 or i >= len(c.inputs) or not is_arr(c.inputs[i]):
                continue
            args = c.fresh_inputs()
            moved = nhwc and i in nhwc_inputs(self.var)
            # (np.array, not ascontiguousarray, which makes rank 0 rank 1)
            args[i] = to_nhwc(args[i]) if moved else np.array(args[i], order="C")
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
            moved = to_layout(self.var, args)
            shapes = [tuple(x.shape) if is_arr(x) else () for x in args]
            try:
                declared = self.var.workspace(shapes, c.attrs)
            except Exception as e:  # noqa: BLE001
                return ("fail", f"workspace_bytes raised {type(e).__name__}: {e}", c)
            if c.constants:
                try:
                    call(self.var, c, list(args), ready=moved)
                except Exception:  # noqa: BLE001
                    continue
            in_bytes = sum(x.nbytes for x in args if is_arr(x))
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
                if is_arr(o) and not any(is_arr(a) and np.shares_memory(a, o) for a in args)
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

