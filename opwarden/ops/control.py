"""Operators: control flow (If, Loop, Scan). Graph attributes arrive as callables (BoundGraph).

Loop and Scan bound their iterations by what the body carries (`_Bounds`): the session's memory
limit, against the bytes accumulated in scan outputs and held in loop-carried values, checked
before each next iteration; and the run's deadline (SessionOptions.run_timeout_ms), checked at
every iteration.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import Contract
from opwarden.errors import KernelError, MemoryLimitError, describe_bytes
from opwarden.ops.base import op

CONTROL = Contract(nan="propagate", thread_safe=True)

# What an accumulated scan element costs beyond its data: the array object, its data block
# and its list slot (an empty array's object alone is about 170 B, many times a scalar's data).
# Under-counting it lets a loop that never stops (an empty slice emitted each iteration) pass
# the memory limit in real memory.
_ELEMENT_BYTES = 176


def _held(x: Any) -> int:
    """Bytes a loop value holds: a tensor's data, the tensors of a sequence."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, list):
        return sum(_held(t) for t in x)
    return 0


class _Bounds:
    """The limits on one Loop/Scan run, read from its body (a BoundGraph: `memory_limit`, the
    session's, and `deadline`, the run's; a plain callable has neither)."""

    def __init__(self, body: Any, op_type: str) -> None:
        self.limit = getattr(body, "memory_limit", None)
        self.deadline = getattr(body, "deadline", None)
        self.op_type = op_type
        self.scanned = 0  # bytes of scan outputs accumulated so far
        self.elements = 0
        self.step = 0  # bytes the last iteration added to them
        # carried sequence position -> (length, bytes, first and last element) when last
        # counted, so a sequence grown at its end is counted by its new elements only
        self._seqs: dict[int, tuple[int, int, Any, Any]] = {}

    def check(self, i: int, carried: list[Any]) -> None:
        """Before iteration i: stop at the deadline, refuse what would pass the memory limit."""
        if self.deadline is not None:
            self.deadline.check(f"{self.op_type} iteration {i}")
        if self.limit is None or i == 0:
            return
        held = self._carried(carried)
        # the next iteration adds as much as the last; stacking copies everything once more
        scans = self.scanned + self.step
        need = held + 2 * scans + (self.elements + 1) * _ELEMENT_BYTES
        if need > self.limit:
            raise MemoryLimitError(
                f"{self.op_type}: after {i} iterations its scan outputs hold "
                f"{describe_bytes(self.scanned)} and its loop-carried values "
                f"{describe_bytes(held)}; iteration {i + 1} would take it to "
                f"{describe_bytes(need)} with the stacked outputs, more than the memory limit "
                f"of {describe_bytes(self.limit)} (SessionOptions.memory_limit_bytes); refused "
                "before allocating"
            )

    def add(self, scans: Any) -> None:
        """Count one iteration's scan outputs."""
        if self.limit is None:
            return
        n = 0
        for v in scans:
            n += _held(v)
            self.elements += 1
        self.scanned += n
        self.step = n

    def _carried(self, carried: list[Any]) -> int:
        total = 0
        for k, x in enumerate(carried):
            if isinstance(x, np.ndarray):
                total += x.nbytes
            elif isinstance(x, list):
                total += self._sequence(k, x)
        return total

    def _sequence(self, k: int, seq: list) -> int:
        n = len(seq)
        prev = self._seqs.get(k)
        if prev is not None and 0 < prev[0] <= n and seq[0] is prev[2] and (
                seq[prev[0] - 1] is prev[3]):
            b = prev[1] + sum(_held(t) for t in seq[prev[0]:])
        else:
            b = _held(seq)
        self._seqs[k] = (n, b, seq[0] if n else None, seq[-1] if n else None)
        return b


def _truth(cond, what: str) -> bool:
    c = np.asarray(cond)
    if c.size != 1:
        raise KernelError(f"{what} must hold exactly one element, got shape {list(c.shape)}")
    return bool(c.reshape(()))


@op("If", since=1, contract=CONTROL)
def If(cond, *, then_branch=None, else_branch=None):
    """Run then_branch or else_branch by a scalar condition (ONNX If-1..21)."""
    branch = then_branch if _truth(cond, "If condition") else else_branch
    return tuple(branch())


def _stack(parts: list, like=None) -> np.ndarray:
    if parts:
        return np.stack([np.asarray(p) for p in parts])
    return np.zeros((0,), dtype=like if like is not None else np.float32)


def _no_iterations(body: Any, k: int) -> np.ndarray:
    """Scan output k (index among the body's outputs) of a loop that ran no iteration: shape
    [0, *per-iteration shape] from the body's output facts, as ONNX Runtime gives it (dims
    they leave open are 0); [0] float32 where the facts know nothing."""
    from opwarden.contract import declared_value
    from opwarden.dtypes import np_dtype_of

    program = getattr(body, "program", None)
    outs = program.graph.outputs if program is not None else ()
    fact = outs[k].fact if k < len(outs) and outs[k] is not None else None
    if fact is None or fact.shape is None:
        return np.zeros((0,), np.float32)
    try:
        dtype = np_dtype_of(fact.dtype) if fact.dtype else np.float32
    except (KeyError, TypeError):
        dtype = np.float32
    dims = [declared_value(d) for d in fact.shape]
    return np.zeros((0, *[d if isinstance(d, int) and d >= 0 else 0 for d in dims]), dtype)


@op("Loop", since=1, contract=CONTROL)
def Loop(M=None, cond=None, *v_initial, body=None):
    """Generic loop with trip count and condition; scan outputs stacked (ONNX Loop-1..21)."""
    trip = None if M is None else int(np.asarray(M).reshape(-1)[0])
    keep = True if cond is None else _truth(cond, "Loop condition")
    carried = list(v_initial)
    n_carried = len(carried)
    scans: list[list] | None = None
    bounds = _Bounds(body, "Loop")
    i = 0
    while keep and (trip is None or i < trip):
        bounds.check(i, carried)
        outs = body(np.array(i, dtype=np.int64), np.array(keep), *carried)
        if len(outs) < 1 + n_carried:
            raise KernelError(f"Loop body returned {len(outs)} values, needs {1 + n_carried}")
        keep = _truth(outs[0], "Loop body condition output")
        carried = list(outs[1 : 1 + n_carried])
        if scans is None:
            scans = [[] for _ in outs[1 + n_carried :]]
        for acc, v in zip(scans, outs[1 + n_carried :]):
            acc.append(v)
        bounds.add(outs[1 + n_carried :])
        i += 1
    n_scan = len(body.output_names) - 1 - n_carried
    if scans is None:
        scans = [[] for _ in range(n_scan)]
    stacked = []
    for j, acc in enumerate(scans):
        if acc and isinstance(acc[0], list):
            stacked.append(acc)
        else:
            stacked.append(_stack(acc) if acc else _no_iterations(body, 1 + n_carried + j))
    return tuple(carried) + tuple(stacked)


@op("Scan", since=9, contract=CONTROL)
def Scan(
    *inputs,
    body=None,
    num_scan_inputs=None,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    """Iterate `body` over slices of the scan inputs, carrying state (ONNX Scan-9..21)."""
    n_scan = int(num_scan_inputs)
    n_state = len(inputs) - n_scan
    state = list(inputs[:n_state])
    xs = list(inputs[n_state:])
    in_axes = list(scan_input_axes or [0] * n_scan)
    in_dirs = list(scan_input_directions or [0] * n_scan)
    xs = [np.moveaxis(x, a % x.ndim, 0) for x, a in zip(xs, in_axes)]
    xs = [x[::-1] if d else x for x, d in zip(xs, in_dirs)]
    lengths = {x.shape[0] for x in xs}
    if len(lengths) > 1:
        raise KernelError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    steps = lengths.pop() if lengths else 0
    n_out = len(body.output_names) - n_state
    accs: list[list] = [[] for _ in range(n_out)]
    bounds = _Bounds(body, "Scan")
    for t in range(steps):
        bounds.check(t, state)
        outs = body(*state, *[x[t] for x in xs])
        state = list(outs[:n_state])
        for acc, v in zip(accs, outs[n_state:]):
            acc.append(np.asarray(v))
        bounds.add(outs[n_state:])
    out_axes = list(scan_output_axes or [0] * n_out)
    out_dirs = list(scan_output_directions or [0] * n_out)
    ys = []
    for j, (acc, a, d) in enumerate(zip(accs, out_axes, out_dirs)):
        if d:
            acc = acc[::-1]
        y = _stack(acc) if acc else _no_iterations(body, n_state + j)
        ys.append(np.moveaxis(y, 0, a % y.ndim) if y.ndim > 1 else y)
    return tuple(state) + tuple(ys)


@op("Scan", since=8, contract=CONTROL)
def Scan_8(sequence_lens, *inputs, body=None, num_scan_inputs=None, directions=None):
    """Scan-8: inputs carry a batch axis 0 and the sequence on axis 1."""
    n_scan = int(num_scan_inputs)
    n_state = len(inputs) - n_scan
    batch = inputs[0].shape[0] if inputs else 0
    dirs = list(directions or [0] * n_scan)
    results: list[list] = []
    bounds = _Bounds(body, "Scan")
    calls = 0  # body calls over all batch entries: their results stay held together
    for b in range(batch):
        state = [x[b] for x in inputs[:n_state]]
        xs = [x[b] for x in inputs[n_state:]]
        length = xs[0].shape[0] if xs else 0
        if sequence_lens is not None:
            length = int(np.asarray(sequence_lens).reshape(-1)[b])
        xs = [x[:length][::-1] if d else x[:length] for x, d in zip(xs, dirs)]
        accs: list[list] = []
        for t in range(length):
            bounds.check(calls, state)
            calls += 1
            outs = body(*state, *[x[t] for x in xs])
            state = list(outs[:n_state])
            if not accs:
                accs = [[] for _ in outs[n_state:]]
            for acc, v in zip(accs, outs[n_state:]):
                acc.append(np.asarray(v))
            bounds.add(outs[n_state:])
        results.append(state + [_stack(a) for a in accs])
    return tuple(np.stack([r[i] for r in results]) for i in range(len(results[0])))
