"""The executor: a graph compiled into a flat list of steps over numbered slots.

Everything is resolved before the first run (kernel, attribute kwargs, input/output slots, the
slots that die after each step); `Program.run` only moves arrays between slots and calls kernels.

A memory plan becomes runnable here: `Program.bind` gives each step its planned `out=` and
`workspace=` views into the arena, and `Program.calls_for` binds a leased plan (plan.manager)
once per arena and compiles its lean loop (codegen.py) once per contract flag, keeping both on
the lease. The loops that run a call list: `run` (generic), `run_guarded` (every step under the
guard), `run_debug` (checks the plan after every step); the compiled lean loop is codegen's and
the wavefront loop parallel.py's.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from opwarden.contract import has_declared
from opwarden.errors import KernelError, MemoryLimitError, OpwardenError, RunTimeoutError
from opwarden.execute.bound import BoundGraph
from opwarden.execute.shapes import Candidates, build_fold, candidates
from opwarden.ir.graph import Graph, Value
from opwarden.memory.constants import freeze as freeze_constant
from opwarden.place.partition import Placement
from opwarden.plan.limits import guard_allocation
from opwarden.plan.manager import PlanEntry


class Step:
    """One node, ready to call."""

    __slots__ = (
        "fn",
        "ref",
        "ins",
        "outs",
        "kwargs",
        "graphs",
        "frees",
        "placement",
        "noutputs",
    )

    def __init__(self, placement: Placement, ins, outs, graphs) -> None:
        self.placement = placement
        var = placement.variant
        # NHWC and emulated nodes fall back to a reference that takes their layout/numerics
        self.ref = placement.ref_variant or next(
            v for v in placement.variant.op.variants if v.reference
        )
        self.ins = ins
        self.outs = outs
        self.kwargs = dict(placement.kwargs)
        for k in graphs:
            self.kwargs.pop(k, None)
        # A variant may bind its kernel to this node (Variant.specialize): attributes are fixed.
        self.fn = var.fn if var.specialize is None else var.specialize(dict(self.kwargs))
        self.graphs = graphs
        self.frees: tuple[int, ...] = ()
        self.noutputs = len(outs) if placement.variant.wants_noutputs else 0


class Deadline:
    """A run's deadline (SessionOptions.run_timeout_ms): checked between the steps of guarded
    runs and at every Loop/Scan iteration, which reach it through their BoundGraph body."""

    __slots__ = ("at", "ms")

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.at = time.monotonic() + ms / 1000.0

    def check(self, where: str) -> None:
        if time.monotonic() > self.at:
            raise RunTimeoutError(
                f"{where}: the run passed its deadline of {self.ms:g} ms "
                "(SessionOptions.run_timeout_ms) and was stopped"
            )


class Bound:
    """What a plan bound to one arena yields (`Program.calls_for`): the call list, and its
    compiled lean loops by contract flag."""

    __slots__ = ("calls", "lean", "fold", "recorded")

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls
        self.lean: dict[Any, Any] = {}  # contract flag (, "stop" when stoppable) -> loop
        # the signature's shape fold (execute.shapes): None until a second run builds it
        # from `recorded` (the first run's recording), then a ShapeFold, or False for none
        self.fold: Any = None
        self.recorded: dict | None = None


class _Recording:
    """A signature's first compiled run: the loop with its candidates' results recorded
    (`_rec`, a global of the generated function) into the entry's Bound."""

    __slots__ = ("fn", "bound")

    def __init__(self, fn: Any, bound: Bound) -> None:
        self.fn, self.bound = fn, bound

    def __call__(self, *args: Any) -> Any:
        g = self.fn.__globals__
        rec: dict = {}
        g["_rec"] = rec
        try:
            out = self.fn(*args)
        finally:
            g["_rec"] = None
        self.bound.recorded = rec
        return out


def _as_result(x: Any) -> Any:
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


class Program:
    """A compiled graph (the main graph or a subgraph body)."""

    def __init__(
        self,
        graph: Graph,
        placements: dict[int, Placement],
        memory_limit: int | None = None,
        parallel: bool = False,
        isolate: Any = None,
        planned: bool = True,
    ) -> None:
        self.graph = graph
        self.memory_limit = memory_limit
        # Symbolic dims a memory plan binds for this graph (the feeds'); None for subgraphs,
        # which no plan covers: their sizes are checked as the kernels run (plan.limits).
        plan_dims = _input_dims(graph) if planned else None
        self.isolate = isolate  # guard.isolate.Isolation: steps whose kernel runs in a worker
        self.slots: dict[int, int] = {}  # id(Value) -> slot
        self.values: list[Value | None] = []  # slot -> Value
        self.template: list[Any] = []
        self.input_slots = [self._slot(v) for v in graph.inputs]
        self.capture_slots = [self._slot(v) for v in graph.captures]
        for v in graph.initializers.values():
            # Declared constant, so kernels may cache what they derive from it (packed weights),
            # and behind a read-only buffer, so no kernel can make it writeable.
            self.template[self._slot(v)] = freeze_constant(v.const)
        self.steps: list[Step] = []
        for node in graph.nodes:
            pl = placements[id(node)]
            ins = tuple(self._slot(v) if v is not None else -1 for v in node.inputs)
            outs = tuple(self._slot(v) if v is not None else -1 for v in node.outputs)
            graphs: dict[str, Any] = {}
            for k, a in node.attrs.items():
                if isinstance(a, Graph):
                    graphs[k] = self._sub(a, placements)
                elif isinstance(a, list) and a and isinstance(a[0], Graph):
                    graphs[k] = [self._sub(g, placements) for g in a]
            st = Step(pl, ins, outs, graphs)
            if isolate is not None:
                st.fn = isolate.wrap(st, self)
            if memory_limit is not None:
                st.fn = guard_allocation(st.fn, pl, memory_limit, plan_dims)
            self.steps.append(st)
        self.output_slots = [self._slot(v) for v in graph.outputs]
        # Time of each step for memory planning: its index, or its wavefront when independent
        # steps of one wavefront run at the same time (parallel branches).
        self.step_time = list(range(len(self.steps)))
        self.levels: list[list[int]] | None = None
        if parallel:
            self._wavefronts()
        self.level_width = [1] * (max(self.step_time, default=-1) + 1)
        if self.levels is not None:
            self.level_width = [len(lv) for lv in self.levels]
        self._plan_frees()
        self.calls = self.bind(None, None)
        self.code_cache: dict[str, Any] = {}  # generated source -> code (codegen)
        self._candidates: Candidates | None = None

    def _wavefronts(self) -> None:
        """Reorder steps by wavefront: a step's wavefront is one past its latest producer's."""
        produced: dict[int, int] = {}
        level_of: list[int] = []
        for st in self.steps:
            reads = [s for s in st.ins if s >= 0]
            for g in st.graphs.values():
                for _, caps in g if isinstance(g, list) else [g]:
                    reads.extend(caps)
            lv = 1 + max((produced.get(s, -1) for s in reads), default=-1)
            level_of.append(lv)
            for s in st.outs:
                if s >= 0:
                    produced[s] = lv
        order = sorted(range(len(self.steps)), key=lambda i: (level_of[i], i))
        self.steps = [self.steps[i] for i in order]
        self.step_time = [level_of[i] for i in order]
        self.levels = []
        for k, lv in enumerate(self.step_time):
            if lv == len(self.levels):
                self.levels.append([])
            self.levels[lv].append(k)

    def _slot(self, v: Value) -> int:
        s = self.slots.get(id(v))
        if s is None:
            s = self.slots[id(v)] = len(self.template)
            self.template.append(None)
            self.values.append(v)
        return s

    def _sub(self, g: Graph, placements: dict[int, Placement]) -> tuple[Program, tuple[int, ...]]:
        prog = Program(g, placements, self.memory_limit, isolate=self.isolate, planned=False)
        return prog, tuple(self._slot(v) for v in g.captures)

    def _plan_frees(self) -> None:
        """Drop each intermediate right after its last reader (graph outputs and constants stay)."""
        keep = set(self.output_slots) | {s for s, c in enumerate(self.template) if c is not None}
        last: dict[int, int] = {}
        for i, st in enumerate(self.steps):
            for s in st.ins:
                if s >= 0:
                    last[s] = i
            for g in st.graphs.values():
                for _, caps in g if isinstance(g, list) else [g]:
                    for s in caps:
                        last[s] = i
            for s in st.outs:
                if s >= 0:
                    last.setdefault(s, i)
        frees: dict[int, list[int]] = {}
        level_frees: dict[int, list[int]] = {}
        for s, i in last.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
                level_frees.setdefault(self.step_time[i], []).append(s)
        for i, st in enumerate(self.steps):
            st.frees = tuple(frees.get(i, ()))
        self.level_frees = [tuple(level_frees.get(t, ())) for t in range(len(self.level_width))]

    def initial_env(self, feeds: list[Any], captured: list[Any] | None) -> list[Any]:
        env = list(self.template)
        for s, x in zip(self.input_slots, feeds):
            env[s] = x
        if captured:
            for s, x in zip(self.capture_slots, captured):
                env[s] = x
        return env

    def bind(self, binding: Any, arena: np.ndarray | None) -> list[tuple]:
        """The call list for one memory plan (None: every kernel allocates its outputs).

        Each call is (step, fn, input slots, kwargs, slots freed after it, post-hook); kwargs
        carry the attributes, ``noutputs``, and the planned ``out=``/``workspace=`` views.
        """
        calls = []
        for i, st in enumerate(self.steps):
            kw = dict(st.kwargs)
            if st.noutputs:
                kw["noutputs"] = st.noutputs
            hook = None
            fn = st.fn
            if binding is not None and arena is not None:
                region = binding.out_region.get(i)
                view = None
                if region is not None:
                    off, shape, dt, chain = region
                    n = math.prod(shape) * np.dtype(dt).itemsize
                    view = arena[off : off + n].view(dt).reshape(shape)
                    for axis, lo, hi in chain:  # a slice of a Concat's output
                        view = view[(slice(None),) * axis + (slice(lo, hi),)]
                    if self._declared_out(st, bool(chain)):
                        fn = Tentative(fn, view, self.values[st.outs[0]].name)
                    else:
                        kw["out"] = view
                ws = binding.ws_region.get(i)
                if ws is not None and not any(
                        has_declared(self.values[s].fact.shape) for s in st.ins if s >= 0):
                    kw["workspace"] = arena[ws[0] : ws[0] + ws[1]]
                if i in binding.view_checks or region is not None:
                    hook = _ArenaViews(arena, view)
            calls.append((st, fn, st.ins, kw, st.frees, hook))
        return calls

    def _declared_out(self, st: Step, sliced: bool) -> bool:
        """Is step st's planned output buffer sized from dims only the model declares (its
        own, or a Concat's it is a slice of)?"""
        v = self.values[st.outs[0]]
        return has_declared(v.fact.shape) or sliced and any(
            n.op_type == "Concat"
            and any(o is not None and has_declared(o.fact.shape) for o in n.outputs)
            for n, _k in v.uses)

    def compile(self, calls: list | None = None, contract: bool = False,
                stoppable: bool = False, fold: Any = None, record: Any = None) -> Any:
        """The lean run function for a call list (see codegen.py)."""
        from opwarden.execute.codegen import compile_calls

        return compile_calls(self, calls if calls is not None else self.calls, contract,
                             stoppable, fold, record)

    @property
    def candidates(self) -> Candidates:
        """The steps that compute from constants and shapes only (execute.shapes)."""
        c = self._candidates
        if c is None:
            c = self._candidates = candidates(self)
        return c

    def calls_for(self, entry: PlanEntry, lean: bool | None = None,
                  stoppable: bool = False) -> tuple[list[tuple], Any]:
        """(the call list bound to a leased plan's arena, its compiled lean loop or None).

        `lean` asks for the compiled loop (True: with the contract check, False: without);
        `stoppable` for its variant that checks a stop (RunOptions.terminate) before each step.
        Both are kept on the entry (`entry.bound`), so a signature binds and compiles once per
        arena; the memory manager drops them when it replaces the arena or evicts the plan.
        A signature's first compiled run records its shape arithmetic (execute.shapes); from
        its second run the loop skips it (`bound.fold`; `drop_fold` when a run contradicts it).
        """
        bound = entry.bound
        if bound is None:
            bound = entry.bound = Bound(self.bind(entry.binding, entry.arena))
        if lean is None:
            return bound.calls, None
        key: Any = (lean, "stop") if stoppable else lean
        cands = self.candidates
        if bound.fold is None and bound.recorded is not None:  # the signature's second run
            bound.fold = build_fold(self, cands, bound.recorded) or False
            bound.recorded = None
            bound.lean.clear()  # (the loops that record)
        fn = bound.lean.get(key)
        if fn is None:
            record = cands if cands and bound.fold is None else None
            fn = bound.lean[key] = self.compile(bound.calls, contract=lean, stoppable=stoppable,
                                                fold=bound.fold or None, record=record)
        if cands and bound.fold is None:
            return bound.calls, _Recording(fn, bound)
        return bound.calls, fn

    @staticmethod
    def drop_fold(entry: PlanEntry) -> None:
        """A run met a tensor of another shape than its signature's first run (the fold's
        premise): that signature's loops run unfolded from now on."""
        if entry.bound is not None:
            entry.bound.fold = False
            entry.bound.lean.clear()

    def run(
        self, feeds: list[Any], captured: list[Any] | None = None, calls: list | None = None
    ) -> list[Any]:
        """Run with values for graph.inputs (and captured outer values); returns graph outputs."""
        env = self.initial_env(feeds, captured)
        for call in calls or self.calls:
            call_step(call, env)
            for s in call[4]:
                env[s] = None
        return [env[s] for s in self.output_slots]

    def run_guarded(
        self,
        feeds: list[Any],
        captured: list[Any] | None,
        guard: Any,
        calls: list | None = None,
        deadline: Deadline | None = None,
    ) -> list[Any]:
        """`run` with every step under the guard (checks, fallback, deadlines, tracing)."""
        env = self.initial_env(feeds, captured)
        fin: list[Any] = [None] * len(env)
        for st, _fn, ins, kw, _frees, hook in calls or self.calls:
            if deadline is not None:
                deadline.check(f"before node {st.placement.node.label}")
            args = [env[s] if s >= 0 else None for s in ins]
            if st.graphs:
                kw = dict(kw)
                for k, g in st.graphs.items():
                    kw[k] = _bind(g, env, guard, deadline)
            try:
                outs = guard.call(st, args, kw, fin)
            except (MemoryLimitError, RunTimeoutError) as e:
                label = st.placement.node.label
                if label in str(e):
                    raise
                raise type(e)(f"node {label}: {e}") from None
            for s, o in zip(st.outs, outs):
                if s >= 0:
                    env[s] = o
            if hook is not None:
                hook(st, env)
            for s in st.frees:
                env[s] = None
        return [env[s] for s in self.output_slots]

    def run_debug(
        self, feeds: list[Any], captured: list[Any] | None, calls: list, plan: Any
    ) -> list[Any]:
        """`run` that verifies after every step that no live planned tensor was overwritten."""
        env = self.initial_env(feeds, captured)
        live: dict[int, int] = {}  # slot -> checksum of its bytes when produced
        last = {}
        for i, (st, *_rest) in enumerate(calls):
            for s in st.ins:
                if s >= 0:
                    last[s] = i
        for i, call in enumerate(calls):
            st, frees = call[0], call[4]
            call_step(call, env)
            for s, crc in list(live.items()):
                x = env[s]
                if last.get(s, -1) <= i:  # dead after this step: in-place reuse is allowed
                    del live[s]
                    continue
                if isinstance(x, np.ndarray) and _crc(x) != crc:
                    v = self.values[s]
                    raise KernelError(
                        f"memory plan violated: step {i} ({st.placement.node.label}) "
                        f"overwrote live tensor {v.name if v is not None else s!r}"
                    )
            for s in st.outs:
                x = env[s] if s >= 0 else None
                if isinstance(x, np.ndarray) and x.dtype != object and last.get(s, -1) > i:
                    live[s] = _crc(x)
            for s in frees:
                env[s] = None
                live.pop(s, None)
        return [env[s] for s in self.output_slots]


def _crc(x: np.ndarray) -> int:
    """Checksum of an array's bytes (run_debug: was a live tensor overwritten?)."""
    import zlib

    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8).data)


def call_step(call: tuple, env: list[Any]) -> None:
    """One bound call against `env`: gather inputs, call the kernel, store outputs."""
    st, fn, ins, kw, _frees, hook = call
    args = [env[s] if s >= 0 else None for s in ins]
    if st.graphs:
        kw = dict(kw)
        for k, g in st.graphs.items():
            kw[k] = _bind(g, env)
    try:
        res = fn(*args, **kw)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every kernel failure (SystemExit too) gets
        raise kernel_error(st, args, e) from e  # the node's context
    _store(st, res, env)
    if hook is not None:
        hook(st, env)


class Tentative:
    """A kernel whose planned out= buffer is sized from a shape only the model declares (a
    custom operator without a shape rule, say). A stale declaration must not break the run
    (ONNX Runtime trusts the kernel), and a wrong-sized out= either fails the kernel or, worse,
    broadcasts into it: so the first call runs without the buffer, and its result decides.
    Matching the buffer, later calls get it; otherwise they never do (warned once)."""

    def __init__(self, fn: Any, out: np.ndarray, name: str) -> None:
        self.fn, self.out, self.name = fn, out, name
        self.ro = out.view()  # what later steps see: the buffer stays writable for the next run
        self.ro.flags.writeable = False
        self.state: bool | None = None  # None: not yet called; then whether it matched

    def __getattr__(self, name: str) -> Any:  # the wrapped kernel's attributes (refuse)
        return getattr(self.__dict__["fn"], name)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        if self.state:
            r = self.fn(*args, out=self.out, **kw)
            if type(r) is tuple:
                return (self.ro if r[0] is self.out else r[0], *r[1:])
            return self.ro if r is self.out else r
        r = self.fn(*args, **kw)
        if self.state is None:
            x = r[0] if type(r) is tuple else r
            self.state = (type(x) is np.ndarray and x.shape == self.out.shape
                          and x.dtype == self.out.dtype)
            if not self.state:
                import warnings

                warnings.warn(
                    f"opwarden: value {self.name!r} has shape "
                    f"{list(getattr(x, 'shape', ()))}, but the model declares "
                    f"{list(self.out.shape)}; the declaration is ignored", RuntimeWarning,
                    stacklevel=2)
        return r


class _ArenaViews:
    """Post-step hook: results that point into the arena without being planned are copied out.

    A kernel may return a view of an input (or the input itself) without declaring it; if
    that input lives in the arena, the view would be overwritten when the region is reused.
    NumPy collapses view chains to the array that owns the memory, so "is a view into the
    arena" is one identity test against the arena's owner.
    """

    __slots__ = ("root", "out", "out_ptr")

    def __init__(self, arena: np.ndarray, out: Any) -> None:
        self.root = arena.base if arena.base is not None else arena
        self.out = out
        self.out_ptr = out.__array_interface__["data"][0] if out is not None else -1

    def __call__(self, st: Step, env: list[Any]) -> None:
        for k, s in enumerate(st.outs):
            if s >= 0:
                env[s] = self.fix(env[s], k)

    def fix(self, x: Any, k: int) -> Any:
        """Output `k` as it may be kept: a copy if it is an unplanned view into the arena."""
        if type(x) is not np.ndarray or x.base is not self.root or (k == 0 and x is self.out):
            return x
        if k == 0 and x.__array_interface__["data"][0] == self.out_ptr:
            return x  # the planned buffer itself, reshaped
        return x.copy()


def _bind(g: Any, env: list[Any], guard: Any = None, deadline: Deadline | None = None) -> Any:
    if isinstance(g, list):
        return [BoundGraph(p, [env[s] for s in caps], guard, deadline) for p, caps in g]
    prog, caps = g
    return BoundGraph(prog, [env[s] for s in caps], guard, deadline)


def _input_dims(graph: Graph) -> frozenset[str]:
    """The symbolic dims of a graph's tensor inputs (what a memory plan binds per signature)."""
    return frozenset(
        d for v in graph.inputs if v.kind == "tensor" and v.fact.shape is not None
        for d in v.fact.shape if isinstance(d, str)
    )


def _store(st: Step, res: Any, env: list[Any]) -> None:
    outs = st.outs
    if len(outs) == 1:
        if type(res) is tuple:
            if not res:
                raise kernel_error(st, [], ValueError("kernel returned no outputs"))
            res = res[0]
        env[outs[0]] = _as_result(res)
        return
    if type(res) is not tuple:
        res = (res,)
    for i, s in enumerate(outs):
        if s < 0:
            continue
        if i >= len(res):
            raise kernel_error(
                st, [], ValueError(f"kernel returned {len(res)} outputs, node needs output {i}")
            )
        env[s] = _as_result(res[i])


def describe_value(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    if x is None:
        return "None"
    if isinstance(x, list):
        return f"sequence[{len(x)}]"
    return type(x).__name__


def kernel_error(st: Step, args: list[Any], e: BaseException) -> OpwardenError:
    pl = st.placement
    where = f"node {pl.node.label} (variant {pl.variant.name} on {pl.device})"
    shapes = ", ".join(describe_value(a) for a in args)
    if isinstance(e, OpwardenError):
        return type(e)(f"{where}: {e}")
    return KernelError(f"{where} failed on inputs ({shapes}): {type(e).__name__}: {e}")
