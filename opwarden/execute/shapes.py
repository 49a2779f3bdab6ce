"""Shape arithmetic folded per signature, from what a run of that signature computed.

Exported transformers compute their Reshape targets, masks and position ids at run time:
Shape -> Gather -> Unsqueeze -> Concat chains, hundreds per model (a GPT-2 decode step runs
about 750 such steps around 300 that do the work). Shape inference leaves the dims those
chains produce unknown (a Reshape's target is data to it), so neither the passes nor the plan
can fold them. Yet for one signature they are fixed: each is a deterministic function of
constants and of the shapes its Shape/Size steps read.

`candidates` finds those steps once per program (roots: Shape/Size; then every deterministic
CPU step reading only constants and candidates). The compiled lean loop records their results
on the first run of a signature (copies, taken as the step finishes); when the signature runs
again, `build_fold` keeps the small ones and the loop compiled with that fold skips their
steps and reads the recorded values instead (`execute.codegen`). A signature run once (a
decode loop whose cache grows every step) never pays for a second compile.

Soundness does not rest on the facts: at each root whose input is computed, the folded loop
compares that input's shape with the recorded one (one tuple compare); the folded values are
functions of those shapes alone. On a difference it raises `ShapeMiss`, and the session drops
the fold for that signature and runs it again unfolded. Guarded, traced and parallel runs
execute every step as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A folded value stays a shape-sized thing: larger results (a big mask) run as before.
FOLD_VALUE_BYTES = 1 << 16
FOLD_TOTAL_BYTES = 1 << 22  # per signature


class ShapeMiss(Exception):  # noqa: N818 - a control-flow signal, never reaches a user
    """A folded Shape/Size step's input had another shape than the recorded one."""

    def __init__(self, step: int, got: tuple[int, ...], want: tuple[int, ...]) -> None:
        super().__init__(f"step {step}: input shape {got}, folded for {want}")
        self.step = step


@dataclass
class Candidates:
    """`steps`: candidate steps in order; `roots`: Shape/Size step -> its computed input slot
    (whose shape the folded loop checks)."""

    steps: list[int] = field(default_factory=list)
    roots: dict[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.steps)


@dataclass
class ShapeFold:
    """`values`: slot -> folded read-only array; `skip`: steps whose outputs are all folded
    (the lean loop does not run them); `roots`: Shape/Size step -> (its input slot, the shape
    recorded), checked where the step stood."""

    values: dict[int, np.ndarray] = field(default_factory=dict)
    skip: set[int] = field(default_factory=set)
    roots: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.skip)


def candidates(program: Any) -> Candidates:
    """The steps of `program` that depend on constants and tensor shapes only."""
    cands = Candidates()
    fed = set(program.input_slots) | set(program.capture_slots)
    outputs = set(program.output_slots)
    fixed = {s for s, c in enumerate(program.template)
             if c is not None and s not in fed and isinstance(c, np.ndarray)}
    for i, st in enumerate(program.steps):
        pl = st.placement
        node = pl.node
        if (st.graphs or pl.device != "cpu" or node.domain not in ("", "ai.onnx")
                or not st.outs or any(s in outputs for s in st.outs)):
            continue
        if node.op_type in ("Shape", "Size") and len(st.ins) == 1 and st.ins[0] >= 0:
            if st.ins[0] not in fixed:
                cands.roots[i] = st.ins[0]
        elif (not pl.variant.op.contract.deterministic or all(s < 0 for s in st.ins)
              or any(s >= 0 and s not in fixed for s in st.ins)):
            continue
        cands.steps.append(i)
        fixed.update(s for s in st.outs if s >= 0)
    return cands


def record_value(x: Any) -> Any:
    """What the recording keeps of a candidate's result: a copy (the step's planned buffer is
    reused later in the run), or None for what is not a small array."""
    if type(x) is np.ndarray and x.nbytes <= FOLD_VALUE_BYTES and x.dtype != object:
        return x.copy()
    return None


def build_fold(program: Any, cands: Candidates, rec: dict[Any, Any]) -> ShapeFold | None:
    """The fold of one signature from a run's recording (`rec`: slot -> record_value of its
    result, ("in", step) -> a root's input shape), or None when nothing folds."""
    fold = ShapeFold()
    known = {s for s, c in enumerate(program.template) if c is not None}
    known -= set(program.input_slots) | set(program.capture_slots)
    total = 0
    for i in cands.steps:
        st = program.steps[i]
        if i not in cands.roots and any(s >= 0 and s not in known and s not in fold.values
                                        for s in st.ins):
            continue  # an input that did not fold (too large, not an array)
        vals = [rec.get(s) for s in st.outs if s >= 0]
        if any(v is None for v in vals):
            continue
        nbytes = sum(int(v.nbytes) for v in vals if v is not None)
        if total + nbytes > FOLD_TOTAL_BYTES:
            break
        if i in cands.roots:
            shape = rec.get(("in", i))
            if shape is None:
                continue
            fold.roots[i] = (cands.roots[i], tuple(shape))
        total += nbytes
        for s in st.outs:
            if s >= 0:
                v = rec[s]
                v.flags.writeable = False
                fold.values[s] = v
        fold.skip.add(i)
    return fold or None
