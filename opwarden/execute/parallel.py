"""The wavefront loop: the steps of each wavefront of a `Program` run together on a thread pool.

`Program(parallel=True)` orders its steps by wavefront (a step's is one past its latest
producer's), so each step reads only values of earlier wavefronts and writes its own slots:
results do not depend on scheduling. With the contract check on, the lean loop's checks
(`codegen.py`) apply to every step and a failure raises `LeanFault`, as in the compiled loop,
so the session reruns the run under the guard.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.blas import blas_thread_count, set_blas_threads
from opwarden.execute.codegen import LeanFault, feed_view
from opwarden.execute.program import Program, call_step
from opwarden.guard.checks import output_faults


def run_parallel(
    program: Program, feeds: list[Any], calls: list, pool: Any, contract: bool = False
) -> list[Any]:
    """`program.run` with the steps of each wavefront submitted together to `pool`."""
    env = program.initial_env(feeds, None)
    if contract:
        env = [feed_view(x) for x in env]
    assert program.levels is not None
    blas_threads = blas_thread_count()
    for t, lv in enumerate(program.levels):
        if len(lv) == 1:
            _one_step(calls[lv[0]], env, contract, lv[0])
        else:
            # Branches share the cores: BLAS inside each gets a share, not all of them.
            share = max(1, blas_threads // min(len(lv), pool._max_workers))
            if share != blas_threads:
                set_blas_threads(share)
            try:
                futures = [pool.submit(_one_step, calls[i], env, contract, i) for i in lv]
                errors = [f.exception() for f in futures]
            finally:
                if share != blas_threads:
                    set_blas_threads(blas_threads)
            for e in errors:
                if e is not None:
                    raise e
        for s in program.level_frees[t]:
            env[s] = None
    return [env[s] for s in program.output_slots]


def _one_step(call: tuple, env: list[Any], contract: bool, index: int) -> None:
    """One step of the parallel loop: `call_step`, plus the lean contract checks."""
    if not contract:
        call_step(call, env)
        return
    try:
        call_step(call, env)
        _check_lean_contract(call, env)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the session reruns the whole run under the guard
        raise LeanFault(index, e) from e


def _check_lean_contract(call: tuple, env: list[Any]) -> None:
    """What the lean loop checks: typed outputs are arrays of the facts' dtype and static
    shape (symbolic dims unchecked here), no undeclared output-is-input, outputs made
    read-only."""
    st, _fn, ins, kw, _frees, _hook = call
    bad = output_faults([env[s] if s >= 0 else None for s in st.outs],
                        st.placement.node.outputs, {})
    if bad:
        raise ValueError(f"{bad[0][0]}: {bad[0][1]}")
    contract = st.placement.variant.op.contract
    allowed = contract.aliases(len(st.outs))
    args = [env[s] if s >= 0 else None for s in ins]
    for k, s in enumerate(st.outs):
        x = env[s] if s >= 0 else None
        if type(x) is not np.ndarray:
            continue
        for a, arg in enumerate(args):
            if (a, k) not in allowed and arg is not None and (x is arg or x.base is arg):
                raise ValueError(f"output {k} aliases input {a}, undeclared")
        if x.flags.writeable and x is not kw.get("out"):
            x.flags.writeable = False
