"""The concurrency check of the harness (a mixin of the checker) and the thread hammer.

A variant whose contract says thread_safe and deterministic is called by THREADS threads at
once, released together by a barrier, CALLS times each, on distinct inputs per thread where
they can be generated (``OpData.thread_cases``); every result must equal the serial one
bitwise. The interpreter's switch interval is cut to provoke races.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from opwarden.verify import inputs as I
from opwarden.verify.calling import accepts, call, mismatch, same

if TYPE_CHECKING:
    from opwarden.contract import Contract
    from opwarden.ops.base import Variant
    from opwarden.verify.opdata import Context, OpData

THREADS = 8
CALLS = 50


class ConcurrencyChecks:
    """check_concurrency; mixed into harness._Checker, which provides the attributes below
    and run."""

    var: Variant
    contract: Contract
    custom: bool
    data: OpData
    ctx: Context

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
                if not same(got, serial[t]):
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
