"""Memory: static plans per input-shape signature, one arena, limits checked before allocating.

`MemoryManager` is the step of a run between feed validation and the executor. For each
signature (the values of the feeds' symbolic dims) it plans once (`lifetimes.analyze` ->
`planner.build_plan`), keeps the plan in a bounded LRU cache (`plan_cache_size`), refuses plans
that exceed the memory limit before anything is allocated, and leases the plan with the
session's arena: one grow-only buffer sized for the largest plan in use, so running many batch
sizes does not grow memory without bound. A run on another thread while the arena is busy gets
a private arena of its own.

The manager reads the compiled program's steps and slots (what `analyze` plans) but never calls
it: binding a plan to the arena and compiling the lean loop are the executor's
(`execute.program.Program.calls_for`), which keeps what it derives on the leased `PlanEntry`.
The manager only drops that when the arena is replaced (so the old arena's memory is freed
before the bigger one is allocated) or when the LRU evicts the plan.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from opwarden.errors import MemoryLimitError, describe_bytes
from opwarden.plan.lifetimes import Binding, analyze, tensor_bytes
from opwarden.plan.limits import default_limit
from opwarden.plan.planner import ALIGNMENT, Buffer, MemoryPlan
from opwarden.plan.scratch import check_scratch

__all__ = ["Buffer", "MemoryManager", "MemoryPlan", "PlanEntry", "default_limit", "describe_bytes"]


def _aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer whose first byte is ALIGNMENT-aligned (pages are touched lazily)."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGNMENT
    return raw[shift : shift + nbytes]


class PlanEntry:
    """A plan leased for a run: its `binding` (buffer offsets per step), the `arena` its buffers
    are views of, and `bound`, what the executor derived from the two (its bound call list and
    compiled loops; None until it binds, reset to None whenever `arena` changes)."""

    __slots__ = ("binding", "arena", "bound")

    def __init__(self, binding: Binding, arena: np.ndarray | None = None) -> None:
        self.binding = binding
        self.arena = arena
        self.bound: Any = None


class MemoryManager:
    """Plans, caches and binds memory for one compiled program."""

    def __init__(self, limit: int, cache_size: int) -> None:
        self.limit = limit
        self.cache_size = cache_size
        self.program: Any = None
        self._cache: OrderedDict[tuple, PlanEntry] = OrderedDict()
        self._arena: np.ndarray | None = None
        self._busy = threading.Lock()
        self._plan_lock = threading.Lock()
        self.last_plan: MemoryPlan | None = None
        self.plans_built = 0
        # (feed index, axis, dim name) for every symbolic dim of a graph input
        self._sym: list[tuple[int, int, str]] = []

    @classmethod
    def for_options(cls, options: Any) -> MemoryManager:
        return cls(options.memory_limit_bytes or default_limit(), options.plan_cache_size)

    def attach(self, program: Any) -> None:
        """Plan for this compiled program."""
        self.program = program
        self._cache.clear()
        self._sym = []
        for k, v in enumerate(program.graph.inputs):
            shape = v.fact.shape if v.kind == "tensor" else None
            for axis, d in enumerate(shape or ()):
                if isinstance(d, str):
                    self._sym.append((k, axis, d))

    # -- planning ----------------------------------------------------------------------------
    def static_plan(self) -> MemoryPlan:
        """The plan for the model's declared shapes (symbolic dims unbound) — checked at load."""
        entry = self._entry((), {})
        return entry.binding.plan

    def plan_for(self, feeds: list[Any]) -> MemoryPlan:
        """The plan these (validated) feeds use, planned now if not cached."""
        key, dims = self.signature(feeds)
        return self._entry(key, dims).binding.plan

    def signature(self, feeds: list[Any]) -> tuple[tuple, dict[str, int]]:
        dims: dict[str, int] = {}
        if not self._sym:
            return (), dims
        key = []
        for k, axis, name in self._sym:
            x = feeds[k]
            n = int(x.shape[axis]) if isinstance(x, np.ndarray) and axis < x.ndim else -1
            dims.setdefault(name, n)
            key.append(n)
        return tuple(key), dims

    def _entry(self, key: tuple, dims: dict[str, int]) -> PlanEntry:
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            return entry
        with self._plan_lock:
            # Single tensors first: sizes past the limit (or int64) never reach the planner.
            self._check_limit(None, dims)
            binding = analyze(self.program, dims, signature=key)  # (refuses impossible dims)
            self.plans_built += 1
            self._check_limit(binding.plan, dims, tensors=False)
            check_scratch(self.program, dims, self.limit)  # kernel scratch, node by node
            entry = PlanEntry(binding)
            self._cache[key] = entry
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return entry

    def _check_limit(self, plan: MemoryPlan | None, dims: dict[str, int],
                     tensors: bool = True) -> None:
        """Refuse, before allocating anything, a plan whose memory exceeds the limit (plan
        None: only a single tensor above it; tensors False: only the plan's total)."""
        biggest = None
        for v in self.program.values if tensors else ():
            if v is None or v.kind != "tensor" or v.const is not None:
                continue
            tb = tensor_bytes(v.fact, dims)
            if tb is not None and (biggest is None or tb[0] > biggest[0]):
                biggest = (tb[0], v, tb[1])
        where = f" (input dims {dims})" if dims else ""
        if biggest is not None and biggest[0] > self.limit:
            nbytes, v, shape = biggest
            who = v.producer.label if v.producer is not None else "the graph"
            raise MemoryLimitError(
                f"tensor {v.name!r} produced by {who} needs {describe_bytes(nbytes)} "
                f"(shape {list(shape)}, {v.fact.dtype}){where}, more than the memory limit of "
                f"{describe_bytes(self.limit)} (SessionOptions.memory_limit_bytes); refused "
                "before allocating"
            )
        need = 0 if plan is None else plan.lower_bound_bytes + plan.outputs_bytes
        if need > self.limit:
            raise MemoryLimitError(
                f"the model needs at least {describe_bytes(need)} of activations and outputs"
                f"{where}, more than the memory limit of {describe_bytes(self.limit)} "
                "(SessionOptions.memory_limit_bytes); refused before allocating"
            )

    # -- leasing -----------------------------------------------------------------------------
    def lease(self, feeds: list[Any]) -> tuple[PlanEntry, threading.Lock | None]:
        """(the plan for these validated feeds with the arena it runs in, release token).

        The token is the shared arena's lock, held until the run releases it; None for a
        private arena (another run holds the shared one), whose entry is this run's alone.
        """
        key, dims = self.signature(feeds)
        entry = self._entry(key, dims)
        plan = entry.binding.plan
        self.last_plan = plan
        if self._busy.acquire(blocking=False):
            arena = self._arena
            if arena is None or arena.nbytes < plan.arena_bytes:
                try:
                    arena = self._grow(plan.arena_bytes)
                except BaseException:
                    self._busy.release()  # a failed allocation must not keep the arena locked
                    raise
            if entry.arena is not arena:
                entry.arena, entry.bound = arena, None
            return entry, self._busy
        return PlanEntry(entry.binding, _aligned_empty(max(plan.arena_bytes, 1))), None

    def _grow(self, need: int) -> np.ndarray:
        # Drop every view of the old arena (the executor's bound calls and compiled runs) so
        # its memory is actually freed before the bigger one is allocated.
        for e in self._cache.values():
            e.arena, e.bound = None, None
        old = 0 if self._arena is None else self._arena.nbytes
        self._arena = None
        # Grow geometrically (within the limit) so rising batch sizes reallocate a few times,
        # not once per new size.
        grown = min(max(need, old + old // 2), max(self.limit - need, need))
        arena = self._arena = _aligned_empty(max(need, grown, 1))
        return arena

    @property
    def arena_bytes(self) -> int:
        return 0 if self._arena is None else int(self._arena.nbytes)
