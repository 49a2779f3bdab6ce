"""Static memory planning: lifetimes of intermediate tensors and their offsets in one arena.

A buffer lives from the step that produces it to the last step that reads it (inclusive). Two
buffers may share bytes only if their lifetimes do not intersect. Offsets are chosen before the
first run by trying a few greedy orders (largest first into the best-fitting gap; by start time)
and keeping the smallest arena; `lower_bound_bytes` — the most bytes live at any one step — is
what no plan can beat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALIGNMENT = 64
SEARCH_TRIES = 48  # perturbed orders tried when the greedy plans miss the lower bound


def align(n: int, a: int = ALIGNMENT) -> int:
    return (int(n) + a - 1) // a * a


@dataclass
class Buffer:
    """One planned region: a tensor (or a group of tensors sharing memory) or a workspace."""

    name: str
    producer: str
    nbytes: int
    first: int
    last: int
    offset: int = -1
    values: list[str] = field(default_factory=list)
    kind: str = "tensor"  # tensor | workspace
    materialized: bool = False  # a kernel writes straight into it (accepts out=)
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "producer": self.producer,
            "size": self.nbytes,
            "offset": self.offset,
            "first_step": self.first,
            "last_step": self.last,
            "values": list(self.values),
            "kind": self.kind,
            "materialized": self.materialized,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }


def lower_bound(sizes: Sequence[int], firsts: Sequence[int], lasts: Sequence[int]) -> int:
    """The maximum over steps of the bytes live at once."""
    if not len(sizes):
        return 0
    horizon = int(max(lasts)) + 2
    delta = np.zeros(horizon, dtype=np.int64)
    np.add.at(delta, np.asarray(firsts, dtype=np.int64), np.asarray(sizes, dtype=np.int64))
    np.add.at(delta, np.asarray(lasts, dtype=np.int64) + 1, -np.asarray(sizes, dtype=np.int64))
    return int(np.cumsum(delta).max())


def _greedy(order, sizes, firsts, lasts) -> tuple[list[int], int]:
    """Place buffers in `order`, each in the smallest gap that fits among time-overlapping ones."""
    n = len(sizes)
    offsets = [0] * n
    p_off = np.zeros(n, dtype=np.int64)
    p_end = np.zeros(n, dtype=np.int64)
    p_first = np.zeros(n, dtype=np.int64)
    p_last = np.zeros(n, dtype=np.int64)
    k = 0
    top = 0
    for i in order:
        size, f, last = sizes[i], firsts[i], lasts[i]
        best, best_gap = -1, None
        if k:
            mask = (p_last[:k] >= f) & (p_first[:k] <= last)
            if mask.any():
                offs = p_off[:k][mask]
                ends = p_end[:k][mask]
                idx = np.argsort(offs, kind="stable")
                prev = 0
                for o, e in zip(offs[idx].tolist(), ends[idx].tolist()):
                    gap = o - prev
                    if gap >= size and (best_gap is None or gap < best_gap):
                        best, best_gap = prev, gap
                    if e > prev:
                        prev = e
                if best < 0:
                    best = prev
            else:
                best = 0
        else:
            best = 0
        offsets[i] = best
        p_off[k], p_end[k], p_first[k], p_last[k] = best, best + size, f, last
        k += 1
        top = max(top, best + size)
    return offsets, top


def _breadth_order(sizes, firsts, lasts) -> list[int]:
    """Buffers of the most crowded steps first, largest first within a step."""
    horizon = int(max(lasts)) + 1
    live: list[list[int]] = [[] for _ in range(horizon)]
    load = [0] * horizon
    for i, (sz, f, last) in enumerate(zip(sizes, firsts, lasts)):
        for t in range(f, last + 1):
            live[t].append(i)
            load[t] += sz
    seen: set[int] = set()
    order: list[int] = []
    for t in sorted(range(horizon), key=lambda t: (-load[t], t)):
        for i in sorted(live[t], key=lambda i: (-sizes[i], i)):
            if i not in seen:
                seen.add(i)
                order.append(i)
    return order


def assign_offsets(
    sizes: Sequence[int], firsts: Sequence[int], lasts: Sequence[int]
) -> tuple[list[int], int]:
    """(offset per buffer, arena bytes): deterministic, never overlapping live buffers."""
    n = len(sizes)
    if n == 0:
        return [], 0
    idx = range(n)
    orders = [
        sorted(idx, key=lambda i: (-sizes[i], firsts[i], i)),  # greedy by size
        sorted(idx, key=lambda i: (firsts[i], -sizes[i], i)),  # by start time
        sorted(idx, key=lambda i: (-(lasts[i] - firsts[i] + 1) * sizes[i], i)),  # by area
    ]
    orders.append(_breadth_order(sizes, firsts, lasts))
    best: tuple[list[int], int] | None = None
    for order in orders:
        offs, top = _greedy(order, sizes, firsts, lasts)
        if best is None or top < best[1]:
            best = (offs, top)
    assert best is not None
    # Still above the lower bound: a seeded search over perturbed size orders (deterministic).
    bound = lower_bound(sizes, firsts, lasts)
    rng = np.random.default_rng(0)
    for _ in range(SEARCH_TRIES if best[1] > bound else 0):
        noise = rng.uniform(0.7, 1.3, n)
        order = sorted(idx, key=lambda i: (-sizes[i] * noise[i], i))
        offs, top = _greedy(order, sizes, firsts, lasts)
        if top < best[1]:
            best = (offs, top)
            if top <= bound:
                break
    return best


@dataclass
class MemoryPlan:
    """The plan for one input-shape signature."""

    arena_bytes: int
    lower_bound_bytes: int
    naive_bytes: int
    buffers: list[Buffer]
    steps: list[str]
    signature: tuple = ()
    dynamic: list[str] = field(default_factory=list)  # values whose size is not known statically
    outputs_bytes: int = 0
    alignment: int = ALIGNMENT
    # value name -> the Concat output it is a slice of (its producer writes into it)
    slices: dict[str, str] = field(default_factory=dict)

    @property
    def materialized_bytes(self) -> int:
        """Arena bytes that kernels actually write (the rest of the arena is never touched)."""
        return sum(b.nbytes for b in self.buffers if b.materialized)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "naive_bytes": self.naive_bytes,
            "ratio_to_lower_bound": (
                self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0
            ),
            "alignment": self.alignment,
            "outputs_bytes": self.outputs_bytes,
            "signature": list(self.signature),  # the values of the symbolic input dims
            "steps": len(self.steps),
            "buffers": [b.as_dict() for b in self.buffers],
            "dynamic": list(self.dynamic),
            "concat_slices": dict(self.slices),
        }

    def check(self) -> None:
        """Assert the plan's invariants (used by tests and debug mode)."""
        bs = sorted(self.buffers, key=lambda b: b.offset)
        for i, a in enumerate(bs):
            assert a.offset >= 0 and a.offset % self.alignment == 0, a
            assert a.offset + a.nbytes <= self.arena_bytes, a
            for b in bs[i + 1 :]:
                if b.offset >= a.offset + a.nbytes:
                    break
                overlap_t = not (a.last < b.first or b.last < a.first)
                assert not overlap_t, f"{a.name} and {b.name} overlap in time and space"
        assert self.arena_bytes >= self.lower_bound_bytes


def build_plan(
    buffers: list[Buffer], steps: list[str], signature: tuple = (), dynamic=(), outputs_bytes=0
) -> MemoryPlan:
    """Assign offsets to `buffers` (sizes already aligned) and compute the report figures."""
    sizes = [b.nbytes for b in buffers]
    firsts = [b.first for b in buffers]
    lasts = [b.last for b in buffers]
    offsets, top = assign_offsets(sizes, firsts, lasts)
    for b, o in zip(buffers, offsets):
        b.offset = o
    return MemoryPlan(
        arena_bytes=top,
        lower_bound_bytes=lower_bound(sizes, firsts, lasts),
        naive_bytes=sum(sizes),
        buffers=buffers,
        steps=steps,
        signature=signature,
        dynamic=list(dynamic),
        outputs_bytes=outputs_bytes,
    )
