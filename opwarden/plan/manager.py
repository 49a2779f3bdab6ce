"""Memory: static plans per input-shape signature, one arena, limits checked before allocating.

`MemoryManager` sits between the session and the executor. For each signature (the shapes of
the feeds) it plans once (`lifetimes.analyze` -> `planner.build_plan`), keeps the plan in a
bounded LRU cache, refuses plans that exceed the memory limit, and binds the plan to the
session's arena: one grow-only buffer sized for the largest plan in use, so running many batch
sizes does not grow memory without bound. A run on another thread while the arena is busy gets
a private arena of its own.
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

__all__ = ["Buffer", "MemoryManager", "MemoryPlan", "default_limit", "describe_bytes"]


def _aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer whose first byte is ALIGNMENT-aligned (pages are touched lazily)."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGNMENT
    return raw[shift : shift + nbytes]


class _Entry:
    __slots__ = ("binding", "calls", "arena_id", "lean")

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        self.calls: Any = None
        self.arena_id = -1
        self.lean: dict[bool, Any] = {}


class MemoryManager:
    """Plans, caches and binds memory for one compiled program."""

    def __init__(self, limit: int, cache_size: int) -> None:
        self.limit = limit
        self.cache_size = cache_size
        self.program: Any = None
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._arena: np.ndarray | None = None
        self._arena_gen = 0
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

    def _entry(self, key: tuple, dims: dict[str, int]) -> _Entry:
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            return entry
        with self._plan_lock:
            # Single tensors first: sizes past the limit (or int64) never reach the planner.
            self._check_limit(None, dims)
            binding = analyze(self.program, dims, signature=key)
            self.plans_built += 1
            self._check_limit(binding.plan, dims, tensors=False)
            entry = _Entry(binding)
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

    # -- binding -----------------------------------------------------------------------------
    def calls_for(self, feeds: list[Any], lean: bool | None = None) -> tuple[Any, Any, Any]:
        """(call list bound to an arena, its compiled lean function or None, release token).

        `lean` asks for the compiled function (True: with the contract check, False: without).
        """
        key, dims = self.signature(feeds)
        entry = self._entry(key, dims)
        plan = entry.binding.plan
        self.last_plan = plan
        if self._busy.acquire(blocking=False):
            need = plan.arena_bytes
            if self._arena is None or self._arena.nbytes < need:
                # Drop every view of the old arena (bound calls, compiled runs) so its memory
                # is actually freed before the bigger one is allocated.
                for e in self._cache.values():
                    e.calls, e.lean, e.arena_id = None, {}, -1
                old = 0 if self._arena is None else self._arena.nbytes
                self._arena = None
                # Grow geometrically (within the limit) so rising batch sizes reallocate a few
                # times, not once per new size.
                grown = min(max(need, old + old // 2), max(self.limit - need, need))
                self._arena = _aligned_empty(max(need, grown, 1))
                self._arena_gen += 1
            if entry.arena_id != self._arena_gen or entry.calls is None:
                entry.calls = self.program.bind(entry.binding, self._arena)
                entry.arena_id = self._arena_gen
                entry.lean = {}
            fn = None
            if lean is not None:
                fn = entry.lean.get(lean)
                if fn is None:
                    fn = entry.lean[lean] = self.program.compile(entry.calls, contract=lean)
            return entry.calls, fn, self._busy
        # Another run holds the shared arena: this one gets a private arena.
        private = _aligned_empty(max(plan.arena_bytes, 1))
        return self.program.bind(entry.binding, private), None, None

    @property
    def arena_bytes(self) -> int:
        return 0 if self._arena is None else int(self._arena.nbytes)
