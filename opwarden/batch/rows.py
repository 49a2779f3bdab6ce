"""Run a batch of rows (a dict of column arrays, as Ray Data hands them) on one session.

Each model input reads the column of its name (a one-input model also takes a column named
``data``, what ``ray.data.from_numpy`` and ``read_numpy`` make, or a batch's only column). A
column's first axis counts rows, and its rank tells what a row is:

- the input's rank: rows are *samples* along the model's first axis. A symbolic first dim runs
  the whole batch at once; a fixed one (SqueezeNet's 1) runs it in slices of that size. Every
  output must then have one row per sample, and the slices' outputs are concatenated.
- one more than the input's rank: each row is a *whole feed*, run alone; the outputs are
  stacked (an object column where their shapes differ between rows).

Columns no input reads (ids, file names) pass through to the output batch unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opwarden.errors import InputError


class RowRunner:
    """Runs batches of rows on `session`; `output_names` picks and orders the outputs."""

    def __init__(self, session: Any, output_names: Sequence[str] | None = None) -> None:
        self.session = session
        self.inputs = session.get_inputs()
        known = [o.name for o in session.get_outputs()]
        if isinstance(output_names, str):
            raise InputError(f"output_names must be a list of names, got the string "
                             f"{output_names!r}")
        self.output_names = list(output_names) if output_names else known
        unknown = [n for n in self.output_names if n not in known]
        if unknown:
            raise InputError(f"output_names {unknown} are not outputs of the model "
                             f"(its outputs: {known})")
        # (wall-clock start, index of the run's first trace record) per traced run
        self.run_marks: list[tuple[float, int]] = []

    # -- one run ---------------------------------------------------------------------------
    def run_feed(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """One session run; its outputs by name."""
        guard = self.session.guard
        if guard.trace:
            self.run_marks.append((time.time(), len(guard.all_records)))
        outs = self.session.run(self.output_names, dict(feeds))
        return dict(zip(self.output_names, outs))

    # -- a batch of rows -------------------------------------------------------------------
    def keys(self, batch: Mapping[str, Any]) -> dict[str, str]:
        """The batch column each model input reads (InputError naming what is missing)."""
        keys: dict[str, str] = {}
        for a in self.inputs:
            if a.name in batch:
                keys[a.name] = a.name
            elif len(self.inputs) == 1 and ("data" in batch or len(batch) == 1):
                keys[a.name] = "data" if "data" in batch else next(iter(batch))
            else:
                raise InputError(f"the batch has no column for model input {a.name!r}: its "
                                 f"columns are {sorted(batch)}; the model's inputs are "
                                 f"{[i.name for i in self.inputs]}")
        return keys

    def _layout(self, cols: dict[str, np.ndarray]) -> tuple[str, int | None]:
        """("samples", slice size or None for all) or ("whole", None)."""
        modes, fixed = set(), set()
        for a in self.inputs:
            c = cols[a.name]
            if c.ndim == 0:
                raise InputError(f"column for input {a.name!r} is a scalar, not a column of "
                                 "rows")
            if a.shape is None:
                modes.add("samples")
                continue
            r = len(a.shape)
            if c.ndim == r + 1:
                modes.add("whole")
            elif c.ndim == r and r > 0:
                modes.add("samples")
                if isinstance(a.shape[0], int):
                    fixed.add(a.shape[0])
            else:
                raise InputError(
                    f"column for input {a.name!r} has rows of shape {list(c.shape[1:])}; the "
                    f"input is {a.shape}: a row must be one sample ({a.shape[1:]}) or a whole "
                    f"feed ({a.shape})")
        if len(modes) > 1:
            raise InputError("some columns hold samples and others whole feeds: "
                             f"{ {a.name: list(cols[a.name].shape) for a in self.inputs} }")
        if len(fixed) > 1:
            raise InputError(f"the inputs fix different batch sizes {sorted(fixed)}")
        return modes.pop(), (fixed.pop() if fixed else None)

    def run_batch(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The model's outputs for every row of `batch`, plus the columns no input reads."""
        keys = self.keys(batch)
        cols = {a: np.asarray(batch[k]) for a, k in keys.items()}
        counts = {len(c) if c.ndim else -1 for c in cols.values()}
        if len(counts) != 1:
            raise InputError(f"columns have different row counts: "
                             f"{ {k: c.shape[:1] for k, c in cols.items()} }")
        n = max(counts.pop(), 0)
        extra = {k: v for k, v in batch.items() if k not in keys.values()}
        clash = sorted(set(extra) & set(self.output_names))
        if clash:
            raise InputError(f"batch columns {clash} have the names of model outputs")
        mode, size = self._layout(cols)
        if n == 0:
            out = {k: np.zeros((0,), np.float32) for k in self.output_names}
        elif mode == "whole":
            out = _stack([self.run_feed({k: c[i] for k, c in cols.items()}) for i in range(n)],
                         self.output_names)
        else:
            out = self._samples(cols, n, size or n)
        out.update(extra)
        return out

    def _samples(self, cols: dict[str, np.ndarray], n: int, size: int) -> dict[str, Any]:
        if n % size:
            raise InputError(f"the model fixes a batch of {size}; a batch of {n} rows does not "
                             f"split into runs of {size}")
        parts: dict[str, list[Any]] = {k: [] for k in self.output_names}
        for i in range(0, n, size):
            got = self.run_feed({k: c[i:i + size] for k, c in cols.items()})
            for k, v in got.items():
                if not isinstance(v, np.ndarray) or v.ndim == 0 or v.shape[0] != size:
                    shape = list(v.shape) if isinstance(v, np.ndarray) else type(v).__name__
                    raise InputError(
                        f"output {k!r} is {shape} for {size} sample row(s): not one row per "
                        "sample; give each row as a whole feed (one more axis) instead")
                parts[k].append(v)
        return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in parts.items()}

def _stack(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in names:
        vals = [r[k] for r in rows]
        if all(isinstance(v, np.ndarray) for v in vals) and len({v.shape for v in vals}) == 1:
            out[k] = np.stack(vals)
        else:
            col = np.empty(len(vals), dtype=object)
            for i, v in enumerate(vals):
                col[i] = v
            out[k] = col
    return out
