"""InferenceSession: load -> validate -> place -> compile, then run with validated feeds.

A run goes one way: the feeds are checked (`feed_check`), the memory manager leases the plan
for their signature with the arena (`plan.manager`), the program binds it and compiles its lean
loop once per plan and arena (`execute.program.Program.calls_for`), and the session picks the
loop that runs it: the compiled lean loop, the wavefront loop (`execute.parallel`), the
guarded loop (checks, tracing, deadlines, quarantine) or the memory-debugging loop.

onnxruntime's API around it (providers by onnxruntime's names and their fallback, OrtValue, IO
binding, RunOptions, run_async, metadata, the optimized model file) is `opwarden.ort`'s; the
session builds on `ort.surface.OrtSessionMethods`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opwarden.contract import declared_value
from opwarden.errors import (
    MemoryLimitError,
    ModelError,
    OptionsError,
    OpwardenError,
    RunTerminated,
)
from opwarden.execute.codegen import LeanFault
from opwarden.execute.parallel import run_parallel
from opwarden.execute.program import Deadline, Program, describe_value
from opwarden.execute.program import kernel_error as kernel_error
from opwarden.execute.shapes import ShapeMiss
from opwarden.feed_check import FastFeeds, check_feeds, output_indices, type_str
from opwarden.guard.faults import FaultRecord
from opwarden.guard.guard import Guard
from opwarden.guard.isolate import isolation_for
from opwarden.ir.graph import Model, Value
from opwarden.ir.load import load, read_source
from opwarden.ir.validate import validate
from opwarden.memory.hugepages import move_weights
from opwarden.options import SessionOptions
from opwarden.ort.dims import apply_dim_overrides, apply_initializers
from opwarden.ort.feeds import convert_feeds
from opwarden.ort.meta import declared_symbols, model_metadata, type_string
from opwarden.ort.optimized import write_optimized
from opwarden.ort.providers import resolve_providers
from opwarden.ort.run_options import run_stop
from opwarden.ort.surface import OrtSessionMethods, ort_kwargs
from opwarden.passes import optimize
from opwarden.place import Placement, place_model
from opwarden.place.regions import pass_options
from opwarden.plan.manager import MemoryManager
from opwarden.plan.planner import MemoryPlan
from opwarden.trace.records import OpRecord, chrome_trace, default_trace_path


def normalize_providers(providers: Sequence[Any] | None) -> list[str]:
    """Device names for a providers list (see `ort.providers.resolve_providers`: device
    names, their aliases, onnxruntime names, `.toml` profiles; unavailable onnxruntime
    providers skipped with a warning)."""
    return resolve_providers(providers)[0]


def _parallel_threads(options: SessionOptions) -> int:
    """Worker threads for independent branches (1: run steps one after another).

    `inter_op_num_threads` > 1, or onnxruntime's `execution_mode=ExecutionMode.ORT_PARALLEL`,
    turns it on; ORT_PARALLEL without a thread count uses the machine's cores.
    """
    n = options.inter_op_num_threads
    mode = options.execution_mode
    wants = n > 1 or str(getattr(mode, "name", mode)).upper() in ("1", "PARALLEL", "ORT_PARALLEL")
    if not wants:
        return 1
    return n if n > 1 else max(os.cpu_count() or 1, 1)


def _apply_threads(options: SessionOptions, providers: list[str]) -> None:
    """Size the thread pools the kernels use (BLAS, torch) from intra_op_num_threads.

    These pools are process-wide: the last session created with a non-zero value sets them.
    """
    n = options.intra_op_num_threads
    if n <= 0:
        return
    from opwarden.kernels.cpu.blas_split import configure

    configure(n)  # (OpenBLAS's thread count, or its product splitting's)
    if "torch" in providers:
        from opwarden.kernels.torch import provider as torch_provider

        torch_provider.configure(n)


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime describes it (.name, .type, .shape)."""

    name: str
    type: str
    shape: list[Any] | None


def _node_arg(v: Value, symbols: set[str]) -> NodeArg:
    """As onnxruntime reports it: dims only the model declares as declared, symbols only
    shape inference made up (not in `symbols`, the model's own) as None, no shape as []."""
    if v.kind != "tensor":
        return NodeArg(v.name, type_string(v.type_proto) or type_str(v), [])
    dims = [declared_value(d) for d in v.fact.shape or ()]
    return NodeArg(v.name, type_str(v),
                   [None if isinstance(d, str) and d not in symbols else d for d in dims])


class InferenceSession(OrtSessionMethods):
    """Run an ONNX model; drop-in for ``onnxruntime.InferenceSession`` in its common calls.

    `path_or_bytes`: a path, serialized bytes or an onnx.ModelProto. `providers`: names or
    (name, options) tuples, onnxruntime's or opwarden's (`opwarden.ort.providers`). Keywords
    are session options, and onnxruntime's `enable_fallback` and `disabled_optimizers`
    (`ort.surface.ort_kwargs`).
    """

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Any = None,
        **kwargs: Any,
    ) -> None:
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise OptionsError(
                f"sess_options must be opwarden.SessionOptions, got {type(sess_options).__name__}"
            )
        fallback, disabled, kwargs = ort_kwargs(kwargs)
        self.options = sess_options or SessionOptions(**kwargs)
        if sess_options is not None:
            for k, v in kwargs.items():
                setattr(self.options, k, v)
        if disabled:  # for this session only: the caller's options stay as they are
            import copy

            self.options = copy.copy(self.options)
            self.options.disabled_passes = [*self.options.disabled_passes, *disabled]
        self._fallback = fallback
        self.providers, self._provider_options = resolve_providers(
            providers, provider_options, self.options.fallback != "forbid")
        self.source = path_or_bytes  # kept for tools that need the model as written (grad)
        self.guard = Guard(self.options)
        self._isolation = isolation_for(self.options, self.guard)  # before any work: names
        self._profiling_start_ns = time.time_ns() if self.options.enable_profiling else 0
        self._build()

    def _build(self) -> None:
        try:
            self._prepare(self.source)
        except OpwardenError:
            raise
        except (RecursionError, MemoryError) as e:
            raise ModelError(f"model cannot be prepared: {type(e).__name__}") from None
        except Exception as e:  # noqa: BLE001 - malformed models must not leak other errors
            raise ModelError(f"model cannot be prepared: {type(e).__name__}: {e}") from None
        init = self.model.graph.initializers
        self._inputs = [v for v in self.model.graph.inputs if v.name not in init]
        self._overridable = [v for v in self.model.graph.inputs if v.name in init]
        self._outputs = list(self.model.graph.outputs)
        self._fast_feeds = FastFeeds(self.model.graph.inputs)
        # Outputs whose declared shape inference could not vouch for: warned about once each
        # when a run's result differs from it (as ORT does), never a fault.
        self._declared = {k: self.model.declared[v.name] for k, v in enumerate(self._outputs)
                          if v.name in self.model.declared}

    def _rebuild(self, providers: list[str]) -> None:
        """Place and compile the model again for new providers (`set_providers`)."""
        old = self.providers
        self.providers = providers
        try:
            self._build()
        except BaseException:
            self.providers = old
            raise

    def _load(self, source: Any) -> Model:
        """The model with the free dimension overrides applied (metadata read first)."""
        src = read_source(source)
        self._meta = model_metadata(src.proto)
        apply_initializers(src.proto, self.options.initializers)
        apply_dim_overrides(src.proto, *self.options.free_dimension_overrides)
        self._symbols = declared_symbols(src.proto)
        model = load(src)
        validate(model)
        return model

    def _prepare(self, source: Any) -> None:
        """load -> validate -> optimize (-> optimized_model_filepath) -> place -> compile."""
        _apply_threads(self.options, self.providers)
        self.model: Model = self._load(source)
        self.pass_report = optimize(self.model, pass_options(self.options, self.providers))
        if self.options.optimized_model_filepath:
            self._write_optimized(source)
        # Weights into huge pages before any kernel packs them (memory.hugepages).
        self.huge_page_bytes = move_weights(self.model) if self.options.huge_page_weights else 0
        self.model.release_pages()  # weights the passes read and replaced leave memory
        self.placements: list[Placement] = place_model(
            self.model, self.providers, self.options, self.guard.quarantine
        )
        by_node = {id(p.node): p for p in self.placements}
        self.memory = MemoryManager.for_options(self.options)
        self.parallel = _parallel_threads(self.options)
        self.program = Program(
            self.model.graph, by_node, self.memory.limit, parallel=self.parallel > 1,
            isolate=self._isolation,
        )
        self._pool = None
        self.memory.attach(self.program)
        self.memory.static_plan()  # refuses memory bombs before anything is allocated

    def _write_optimized(self, source: Any) -> None:
        """SessionOptions.optimized_model_filepath (ort.optimized)."""

        def basic() -> Model:  # the graph with standard ops only, for onnxruntime
            model = self._load(source)
            optimize(model, SessionOptions(
                optimization_level=min(self.options.optimization_level, 1),
                disabled_passes=self.options.disabled_passes))
            return model

        write_optimized(self.model, self.options, self._meta, basic)

    # -- onnxruntime-compatible surface ------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        """The inputs a caller feeds (initializers aside), as onnxruntime describes them."""
        return [_node_arg(v, self._symbols) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs, as onnxruntime describes them."""
        return [_node_arg(v, self._symbols) for v in self._outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers also listed as inputs: a feed of that name replaces the constant."""
        return [_node_arg(v, self._symbols) for v in self._overridable]

    def close(self) -> None:
        """Stop the worker process of isolated kernels (SessionOptions.isolate), if any; the
        session stays usable (its next isolated call starts a fresh worker)."""
        if self._isolation is not None:
            self._isolation.close()

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[Any]:
        """Run the model; returns the requested outputs (all when output_names is None or
        empty). Feeds are arrays, OrtValues, or lists and scalars (converted to the input's
        dtype, as onnxruntime does). With `run_options` (a RunOptions), setting its
        `terminate` from another thread stops the run before its next step (RunTerminated)."""
        return self.run_into(output_names, input_feed, run_options, None)

    def run_into(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                 run_options: Any = None, into: Any = None) -> list[Any]:
        """`run`, with `into` (ort.binding.BoundOutputs: an IO binding's output buffers) the
        compiled loop's kernels writing the outputs they can straight into those buffers."""
        timeout = self.options.run_timeout_ms
        deadline = None if timeout is None else Deadline(timeout)
        stop = run_stop(run_options, None)
        picks = output_indices(self._outputs, output_names) if output_names else None
        feeds = self._fast_feeds(input_feed)  # (None: not plain arrays, or refused)
        if feeds is None:
            feeds = check_feeds(self.model.graph.inputs, self._inputs,
                                convert_feeds(self.model.graph.inputs, input_feed))
        g = self.guard
        contract = "contract" in g.checks
        # The guarded loop checks the run's deadline; an isolated kernel's crash must reach the
        # guard, which without the contract check the lean loop would not rerun under.
        lean = not (g.trace or g.timeout or g.quarantine.entries or (g.checks - {"contract"})
                    or deadline is not None or (self._isolation is not None and not contract))
        if self._isolation is not None:
            self._isolation.prestart()  # fork before this run's threads run kernels
        debug = self.options.debug_memory
        entry, token = self.memory.lease(feeds)
        try:
            # A private arena (token None: a concurrent run) is bound for this run only, and
            # runs the generic loop rather than compiling one. A run that can be stopped
            # (RunOptions) runs the compiled loop variant that checks before each step, or the
            # guarded loop, which checks wherever it checks a deadline.
            compiled = lean and not debug and token is not None
            calls, fn = self.program.calls_for(
                entry, contract if compiled else None, stop is not None)
            if stop is not None and not compiled:
                stop.deadline = deadline
                outs = self._run_guarded(feeds, calls, stop)
            elif debug:
                outs = self.program.run_debug(feeds, None, calls, entry.binding.plan)
            elif lean and self.program.levels is not None and token is not None and stop is None:
                outs = self._run_parallel(feeds, calls, contract)
            elif fn is not None or (lean and not contract):
                if into is not None and fn is not None:
                    fn = into.loop(self.program, entry.bound, self.memory.signature(feeds)[1],
                                   feeds, contract, stop is not None) or fn
                try:
                    outs = self._run_lean(fn, feeds, calls, contract, stop)
                except ShapeMiss:
                    self.program.drop_fold(entry)
                    calls, fn = self.program.calls_for(entry, contract, stop is not None)
                    outs = self._run_lean(fn, feeds, calls, contract, stop)
            else:
                outs = self._run_guarded(feeds, calls, deadline)
        finally:
            if token is not None:
                token.release()
        if self._declared:
            self._warn_declared(outs)
        return _unaliased(outs if picks is None else [outs[i] for i in picks], feeds)

    def _warn_declared(self, outs: list[Any]) -> None:
        import warnings

        for k, decl in list(self._declared.items()):
            x = outs[k]
            if not isinstance(x, np.ndarray):
                continue
            if len(decl) == x.ndim and all(not isinstance(d, int) or d == n
                                           for d, n in zip(decl, x.shape)):
                continue
            self._declared.pop(k, None)
            want = "{" + ",".join("?" if d is None else str(d) for d in decl) + "}"
            warnings.warn(
                f"opwarden: expected shape from model of {want} does not match actual shape "
                f"of {{{','.join(map(str, x.shape))}}} for output {self._outputs[k].name!r}",
                RuntimeWarning, stacklevel=3)

    def _run_lean(self, fn: Any, feeds: list[Any], calls: list, contract: bool,
                  stop: Any = None) -> list[Any]:
        if fn is None:  # a private arena (concurrent run): the generic loop
            if contract:
                return self._run_guarded(feeds, calls)
            return self.program.run(feeds, None, calls)
        try:
            return fn(feeds, None) if stop is None else fn(feeds, None, stop)
        except LeanFault as e:
            if isinstance(e.error, RunTerminated):
                raise e.error from None  # it names the step it stopped before
            # A refused allocation is refused again under the guard: no rerun for it.
            if contract and not isinstance(e.error, MemoryLimitError):
                # Rerun under the guard: it records the fault, falls back, quarantines.
                self.guard.suspect(self.program.steps[e.index], e.error)
                return self._run_guarded(feeds, calls)
            raise kernel_error(self.program.steps[e.index], [], e.error) from e.error

    def _run_parallel(self, feeds: list[Any], calls: list, contract: bool) -> list[Any]:
        if self._pool is None:
            import concurrent.futures as cf

            self._pool = cf.ThreadPoolExecutor(self.parallel, thread_name_prefix="opwarden-inter")
        try:
            return run_parallel(self.program, feeds, calls, self._pool, contract)
        except LeanFault as e:
            if contract and not isinstance(e.error, MemoryLimitError):
                self.guard.suspect(self.program.steps[e.index], e.error)
                return self._run_guarded(feeds, calls)
            raise kernel_error(self.program.steps[e.index], [], e.error) from e.error

    def _run_guarded(self, feeds: list[Any], calls: list, deadline: Any = None) -> list[Any]:
        self.guard.begin_run()
        # Each step's output shape is checked against the facts with the feeds' dims bound.
        self.guard.bind_dims(self.program, self.memory.signature(feeds)[1])
        try:
            return self.program.run_guarded(feeds, None, self.guard, calls, deadline)
        finally:
            self.guard.end_run()

    # -- memory ------------------------------------------------------------------------------
    @property
    def memory_plan(self) -> MemoryPlan:
        """The memory plan of the last run (before any run: the plan for the declared shapes)."""
        return self.memory.last_plan or self.memory.static_plan()

    def plan_for(self, input_feed: Mapping[str, Any]) -> MemoryPlan:
        """The memory plan these feeds would use (planned now if not cached); runs nothing."""
        return self.memory.plan_for(
            check_feeds(self.model.graph.inputs, self._inputs, input_feed))

    # -- guard and trace ---------------------------------------------------------------------
    @property
    def trace(self) -> list[OpRecord]:
        """Op records of the last run (tracing on: SessionOptions(trace=True))."""
        return list(self.guard.records)

    @property
    def faults(self) -> list[FaultRecord]:
        """Every fault the guard has seen in this session, oldest first."""
        return list(self.guard.faults)

    def health(self) -> dict[str, Any]:
        """Per-variant counters (calls, faults by kind, fallbacks), faults and quarantine."""
        return self.guard.report()

    def end_profiling(self, path: str | None = None) -> str:
        """Write every traced op of this session as Chrome-trace JSON; returns the path. With
        neither enable_profiling nor trace on and no `path`, writes nothing and returns ""
        (as onnxruntime)."""
        if path is None and not (self.options.enable_profiling or self.options.trace):
            return ""
        out = path or default_trace_path(self.options.profile_file_prefix)
        return chrome_trace(self.guard.all_records, out)

    # -- explanation -------------------------------------------------------------------------
    def explain(self) -> list[dict[str, Any]]:
        """For every node: device, variant, the reason for any fallback or rewrite, rejections."""
        return [p.describe() for p in self.placements]

    def explain_summary(self) -> dict[str, Any]:
        """Per device node counts, fallbacks with reasons, inserted copies/transposes, a line."""
        from opwarden.place.summary import summarize

        return summarize(self.explain(), getattr(self.placements, "report", {}))

    def calibrate(self, input_feed: Mapping[str, Any]) -> dict[str, Any]:
        """Measure each asked-for precision degrade (SessionOptions.precision) on one feed
        against f32; explain and explain_summary show it from then on (place/regions.py)."""
        from opwarden.place.regions import calibrate

        return calibrate(self.placements, lambda: self.run(None, input_feed),
                         [o.name for o in self.get_outputs()])

__all__ = ["InferenceSession", "NodeArg", "SessionOptions", "describe_value"]


def _unaliased(outs: list[Any], feeds: list[Any]) -> list[Any]:
    """The outputs, each copied where it is (a view of) one of the caller's feed arrays: an
    Identity, Reshape or Transpose output would otherwise change when the caller next writes
    into its input (ONNX Runtime's outputs never share the inputs' memory). NumPy collapses
    view chains, so an array's `base` is the array owning the memory (for a feed seen through a
    read-only buffer, views of it have the feed as base, the feed itself that buffer)."""
    copied = outs
    for k, o in enumerate(outs):
        if type(o) is not np.ndarray:
            continue
        root = o if o.base is None else o.base
        for f in feeds:  # (root is a feed's own root, or the feed itself)
            if type(f) is np.ndarray and (root is f or root is f.base):
                if copied is outs:
                    copied = list(outs)
                copied[k] = o.copy()
                break
    return copied
