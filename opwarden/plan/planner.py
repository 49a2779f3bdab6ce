"""Static memory planning: lifetimes of intermediate tensors and their offsets in one arena.

A buffer lives from the step that produces it to the last step that reads it (inclusive). Two
buffers may share bytes only if their lifetimes do not intersect. Offsets are chosen before the
first run by trying a few greedy orders (largest first into the best-fitting gap; by start time)
and keeping the smallest arena; `lower_bound_bytes` — the most bytes live at any one step — is
what no plan can beat, so the orders stop at the first plan that meets it, and a seeded search
over perturbed orders runs only when none does. A placement costs O(log steps) merges of short
range lists (`_greedy`), so planning stays near-linear in the number of buffers.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALIGNMENT = 64
SEARCH_TRIES = 48  # perturbed orders tried when the greedy plans miss the lower bound
# Buffers placed by the search at most: plans of more than SEARCH_BUDGET / SEARCH_TRIES
# buffers try fewer orders (at least 2), so a hostile 20k-buffer model costs a few greedy
# passes, not 48. Plans of up to 2048 buffers (every zoo model) are unaffected.
SEARCH_BUDGET = SEARCH_TRIES * 2048


# Sorted, disjoint closed byte ranges as (starts, ends).
Ranges = tuple[list[int], list[int]]


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
    """Place buffers in `order`, each in the smallest gap that fits among time-overlapping ones.

    A gap is a free run below the top of the union of the byte ranges of the placed buffers
    that overlap in time; the lowest of the smallest fitting gaps wins, else the top of the
    union. The union is found with a segment tree over the (compressed) steps: every node keeps
    the merged byte ranges of the buffers spanning it (`own`) and of every buffer placed within
    it (`sub`), so a placement merges O(log steps) short range lists instead of scanning every
    placed buffer (a 20k-wide graph has all buffers live at its last step).
    """
    n = len(sizes)
    offsets = [0] * n
    times = sorted({*firsts, *lasts})
    rank = {t: k for k, t in enumerate(times)}
    leaves = 1
    while leaves < len(times):
        leaves *= 2
    own: list[Ranges | None] = [None] * (2 * leaves)
    sub: list[Ranges | None] = [None] * (2 * leaves)
    placed: list[tuple[int, int, int, int]] = []  # for the rare zero-size buffer
    top = 0
    if any(f > last for f, last in zip(firsts, lasts)):
        # Malformed lifetimes (never from `analyze`) overlap by the bare comparisons only.
        for i in order:
            best = offsets[i] = _scan_gaps(sizes[i], firsts[i], lasts[i], placed)
            placed.append((best, best + sizes[i], firsts[i], lasts[i]))
            top = max(top, best + sizes[i])
        return offsets, top
    for i in order:
        size, f, last = sizes[i], firsts[i], lasts[i]
        lo, hi = rank[f] + leaves, rank[last] + leaves + 1
        canon, path = _cover(lo, hi), _ancestors(lo, hi - 1)
        if size <= 0:
            best = _scan_gaps(size, f, last, placed)
        else:
            runs = [r for c in canon if (r := sub[c]) is not None]
            runs += [r for u in path if (r := own[u]) is not None]
            best = _best_gap(size, runs)
        end = best + size
        offsets[i] = best
        placed.append((best, end, f, last))
        if end > top:
            top = end
        for table, nodes in ((own, canon), (sub, canon), (sub, path)):
            for u in nodes:
                _merge_range(table, u, best, end)
    return offsets, top


def _cover(lo: int, hi: int) -> list[int]:
    """The segment-tree nodes whose spans exactly cover leaves lo..hi-1 (the canonical cover)."""
    canon = []
    a, b = lo, hi
    while a < b:
        if a & 1:
            canon.append(a)
            a += 1
        if b & 1:
            b -= 1
            canon.append(b)
        a >>= 1
        b >>= 1
    return canon


def _ancestors(a: int, b: int) -> list[int]:
    """Every node on the paths from leaves a and b up to the root (shared ones once)."""
    path = []
    while a != b:
        path.append(a)
        path.append(b)
        a >>= 1
        b >>= 1
    while a:
        path.append(a)
        a >>= 1
    return path


def _merge_range(table: list[Ranges | None], u: int, best: int, end: int) -> None:
    """Merge the closed range [best, end] into node u's sorted, disjoint ranges."""
    r = table[u]
    if r is None:
        table[u] = ([best], [end])
        return
    starts, ends = r
    lo = bisect_left(ends, best)  # the first range ending at or after best
    hi = bisect_right(starts, end, lo)  # past the last starting at or before end
    if lo == hi:
        starts.insert(lo, best)
        ends.insert(lo, end)
    else:
        if starts[lo] > best:
            starts[lo] = best
        if ends[hi - 1] < end:
            ends[hi - 1] = end
        if hi - lo > 1:
            del starts[lo + 1 : hi]
            ends[lo] = ends[hi - 1]
            del ends[lo + 1 : hi]


def _best_gap(size, runs) -> int:
    """Offset of the lowest smallest free run of at least `size` bytes below the top of the
    union of `runs` (lists of sorted disjoint closed ranges), else that top."""
    if not runs:
        return 0
    pairs: Iterable[tuple[int, int]]
    if len(runs) == 1:
        starts, ends = runs[0]
        pairs = zip(starts, ends)
    else:
        if sum([len(r[0]) for r in runs]) > _VECTOR_RANGES:
            return _best_gap_np(size, runs)
        pairs = sorted(p for starts, ends in runs for p in zip(starts, ends))
    prev = 0
    best, best_gap = -1, -1
    for o, e in pairs:
        gap = o - prev
        if gap >= size and (best_gap < 0 or gap < best_gap):
            best, best_gap = prev, gap
        if e > prev:
            prev = e
    return best if best >= 0 else prev


_VECTOR_RANGES = 96  # more ranges than this to merge: sort and scan them in NumPy


def _best_gap_np(size, runs) -> int:
    """`_best_gap` over many ranges (a fragmented arena) with array operations."""
    starts = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in runs])
    ends = np.concatenate([np.asarray(r[1], dtype=np.int64) for r in runs])
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # ends are >= 0, the scan's first `prev`
    prev = np.empty_like(reach)
    prev[0] = 0
    prev[1:] = reach[:-1]
    gaps = starts - prev
    fit = np.flatnonzero(gaps >= size)
    if not len(fit):
        return int(reach[-1])
    return int(prev[fit[np.argmin(gaps[fit])]])  # argmin: the lowest of the smallest


def _scan_gaps(size, f, last, placed) -> int:
    """The same choice over every placed buffer (sizes <= 0, where gaps of 0 count)."""
    # by offset, ties in placement order (a zero-size buffer ties with the one it touches)
    spans = sorted(((o, e) for o, e, pf, pl in placed if pl >= f and pf <= last),
                   key=lambda s: s[0])
    if not spans:
        return 0
    prev = 0
    best, best_gap = -1, None
    for o, e in spans:
        gap = o - prev
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = prev, gap
        if e > prev:
            prev = e
    return best if best >= 0 else prev


def _breadth_order(sizes, firsts, lasts) -> list[int]:
    """Buffers of the most crowded steps first, largest first within a step.

    A buffer comes in with the first step, in the (-load, step) order, of its lifetime: its
    key is the smallest rank over its steps, a range minimum (sparse table), so the order
    costs O(steps log steps + n log n) instead of a list per step of every live buffer.
    """
    horizon = int(max(lasts)) + 1
    f = np.asarray(firsts, dtype=np.int64)
    last = np.asarray(lasts, dtype=np.int64)
    sz = np.asarray(sizes, dtype=np.int64)
    ok = f <= last  # an empty lifetime is live at no step and never ordered
    delta = np.zeros(horizon + 1, dtype=np.int64)
    np.add.at(delta, f[ok], sz[ok])
    np.add.at(delta, last[ok] + 1, -sz[ok])
    load = np.cumsum(delta)[:horizon]
    steps = np.arange(horizon)
    rank = np.empty(horizon, dtype=np.int64)
    rank[np.lexsort((steps, -load))] = steps
    table = [rank]
    while (1 << len(table)) <= horizon:  # table[j][t]: the least rank in steps t..t+2^j-1
        prev, w = table[-1], 1 << (len(table) - 1)
        table.append(np.minimum(prev[:-w], prev[w:]))
    idx = np.flatnonzero(ok)
    lo, hi = f[idx], last[idx]
    k = np.frexp(hi - lo + 1)[1] - 1  # floor(log2(length)), exact
    key = np.empty(len(idx), dtype=np.int64)
    for j in np.unique(k).tolist():
        sel = k == j
        t = table[j]
        key[sel] = np.minimum(t[lo[sel]], t[hi[sel] - (1 << j) + 1])
    ids = idx.tolist()
    ranked = sorted(zip(key.tolist(), [-sizes[i] for i in ids], ids))
    return [i for _, _, i in ranked]


def assign_offsets(
    sizes: Sequence[int], firsts: Sequence[int], lasts: Sequence[int]
) -> tuple[list[int], int]:
    """(offset per buffer, arena bytes): deterministic, never overlapping live buffers."""
    n = len(sizes)
    if n == 0:
        return [], 0
    idx = range(n)
    bound = lower_bound(sizes, firsts, lasts)
    # Every valid plan is at least the bound and a later plan must be smaller to be kept, so
    # the orders after one that meets the bound cannot change the result.
    exact = all(f <= last for f, last in zip(firsts, lasts))
    orders = [
        lambda: sorted(idx, key=lambda i: (-sizes[i], firsts[i], i)),  # greedy by size
        lambda: sorted(idx, key=lambda i: (firsts[i], -sizes[i], i)),  # by start time
        lambda: sorted(idx, key=lambda i: (-(lasts[i] - firsts[i] + 1) * sizes[i], i)),  # area
        lambda: _breadth_order(sizes, firsts, lasts),
    ]
    best: tuple[list[int], int] | None = None
    for make in orders:
        offs, top = _greedy(make(), sizes, firsts, lasts)
        if best is None or top < best[1]:
            best = (offs, top)
        if exact and best[1] <= bound:
            return best
    assert best is not None
    # Still above the lower bound: a seeded search over perturbed size orders (deterministic).
    rng = np.random.default_rng(0)
    tries = min(SEARCH_TRIES, max(2, SEARCH_BUDGET // n))
    for _ in range(tries if best[1] > bound else 0):
        noise = rng.uniform(0.7, 1.3, n).tolist()
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
