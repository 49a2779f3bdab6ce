"""The guard: runs one step under health checks, falls back on faults, records the trace.

On a fault (a kernel exception, a deadline miss, a mutated input, an undeclared alias, a wrong
output count/shape/dtype, NaN/Inf out of finite inputs) the guard records the context, reruns
the node with the operator's reference kernel, marks the variant unstable (quarantine) and
carries on; later calls of a quarantined variant go straight to the reference kernel.
With ``on_fault="raise"`` it raises KernelError naming the node and the failed check.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from opwarden.errors import KernelError, MemoryLimitError, RunTimeoutError
from opwarden.guard import checks as C
from opwarden.guard.faults import DeadlineExceeded, FaultRecord, Quarantine, VariantStats
from opwarden.guard.isolate import KernelCrash
from opwarden.trace.records import OpRecord

MAX_RECORDS = 1_000_000
HARD_FAULTS = ("exception", "deadline", "mutation", "outputs", "alias", "shape", "dtype", "crash")


# Raised by kernels but not kernel faults: the user's interrupt, a generator being closed.
PASS_THROUGH = (KeyboardInterrupt, GeneratorExit)


class HandledFault(KernelError):
    """A fault the guard has already recorded and answered at its own node. Raised out of a
    subgraph, it passes through every enclosing If/Loop/Scan unchanged: the enclosing node is
    not at fault, and rerunning it on its reference would rerun the whole subgraph (twice per
    nesting level)."""


class _DeadlineWorker:
    """One daemon thread that runs kernels under a deadline. A kernel past its deadline is
    abandoned with its thread, which finishes on its own; being a daemon it never holds the
    process at exit (concurrent.futures joins its workers at exit, so one hung kernel kept the
    process alive)."""

    def __init__(self) -> None:
        self._job = threading.Condition()
        self._task: Any = None
        self._stop = False
        threading.Thread(target=self._loop, name="opwarden-op", daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._job:
                while self._task is None and not self._stop:
                    self._job.wait()
                if self._task is None:
                    return
                fn, args, kw, box, done = self._task
            try:
                box.append((True, fn(*args, **kw)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which decides
                box.append((False, e))
            with self._job:
                self._task = None
            done.set()

    def run(self, fn: Any, args: list[Any], kw: dict[str, Any], seconds: float) -> Any:
        """fn(*args, **kw), or DeadlineExceeded after `seconds` (the worker is then spent)."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        with self._job:
            self._task = (fn, args, kw, box, done)
            self._job.notify()
        if not done.wait(seconds):
            with self._job:
                self._stop = True  # it exits once the abandoned kernel returns
            raise DeadlineExceeded
        ok, value = box[0]
        if ok:
            return value
        raise value


def _desc(x: Any) -> tuple[Any, str]:
    if isinstance(x, np.ndarray):
        return list(x.shape), ("string" if x.dtype.kind in "OUS" else x.dtype.name)
    if x is None:
        return None, "none"
    if isinstance(x, list):
        return [len(x)], "sequence"
    return None, type(x).__name__


def _views(outs: list[Any], args: list[Any], kw: dict[str, Any]) -> list[bool]:
    """Per output, whether it is a view of an input: it shares an input's memory without having
    been written into a planned buffer (an output planned over a dying input computed its values
    there; a view moved nothing)."""
    if isinstance(kw.get("out"), np.ndarray):
        return [False] * len(outs)
    ins = [a for a in args if isinstance(a, np.ndarray) and a.size]
    return [isinstance(o, np.ndarray) and o.size > 0
            and any(np.may_share_memory(o, a) for a in ins) for o in outs]


def _ref_kw(kw: dict[str, Any], st: Any) -> dict[str, Any]:
    """Keyword arguments for the reference kernel: planned buffers are for the fast variant,
    and `noutputs` goes only to a reference that takes it (BatchNormalization-14's does not)."""
    wants = st.ref.wants_noutputs
    if "out" in kw or "workspace" in kw or ("noutputs" in kw) != wants:
        kw = {k: v for k, v in kw.items() if k not in ("out", "workspace", "noutputs")}
        if wants:
            kw["noutputs"] = len(st.outs)
    return kw


def _in_place_inputs(args: list[Any], kw: dict[str, Any]) -> list[Any] | None:
    """args with a copy of each input the planned output shares (a kernel run in place), or
    None when there is none: a faulting in-place kernel has already overwritten those, and
    the reference rerun must read what the node was given."""
    out = kw.get("out")
    if not isinstance(out, np.ndarray):
        return None
    hit = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.size
           and np.may_share_memory(a, out)]
    if not hit:
        return None
    pristine = list(args)
    for i in hit:
        pristine[i] = args[i].copy()
    return pristine


def _attrs_for_record(kw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in kw.items():
        if k in ("out", "workspace"):
            continue
        if isinstance(v, np.ndarray):
            out[k] = f"tensor{list(v.shape)}"
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
        elif isinstance(v, list) and all(isinstance(i, (int, float, str)) for i in v):
            out[k] = v
        else:
            out[k] = type(v).__name__
    return out


class Guard:
    """Per-session guard state: options, quarantine, counters, faults, trace."""

    def __init__(self, options: Any) -> None:
        self.checks = C.normalize(options.checks)
        self.on_fault = options.on_fault
        self.trace = bool(options.trace or options.enable_profiling)
        self.timeout = options.op_timeout_ms
        self.quarantine = Quarantine(options.quarantine_file)
        self.stats: dict[str, VariantStats] = {}
        self.faults: list[FaultRecord] = []
        self.records: list[OpRecord] = []  # last run
        self.all_records: list[OpRecord] = []
        self.runs = 0
        self._t0 = 0.0
        self._kernel_s = 0.0  # the last call's kernel time (traced records report it alone)
        self._worker: _DeadlineWorker | None = None
        # Symbolic dims of this run's feeds, and the steps (the main graph's) they apply to.
        self._dims: dict[str, int] = {}
        self._main: tuple[Any, frozenset[int]] = (None, frozenset())
        self._suspects: dict[int, str] = {}  # id(step) -> what it raised in the lean loop

    @property
    def active(self) -> bool:
        return bool(self.checks or self.trace or self.timeout or self.quarantine.entries)

    # -- run bookkeeping ---------------------------------------------------------------------
    def suspect(self, st: Any, error: BaseException) -> None:
        """Step `st` raised in the lean loop; the guarded rerun that follows counts it as
        faulted even when the kernel succeeds there, so a transient fault is still recorded,
        answered by the reference kernel and quarantined."""
        if not st.placement.variant.reference:  # the rerun raises again or records it
            self._suspects[id(st)] = (f"{type(error).__name__}: {error} "
                                      "(raised in the lean loop; rerun under the guard)")

    def begin_run(self) -> None:
        self.runs += 1
        self.records = []
        self._t0 = time.perf_counter()

    def bind_dims(self, program: Any, dims: dict[str, int]) -> None:
        """The symbolic dims this run's feeds bind (MemoryManager.signature), for the output
        shape check of `program`'s steps (a subgraph's own facts are checked without them)."""
        if self._main[0] is not program:
            self._main = (program, frozenset(id(st) for st in program.steps))
        self._dims = dims

    def end_run(self) -> None:
        self._suspects.clear()
        room = MAX_RECORDS - len(self.all_records)
        if room > 0:
            self.all_records.extend(self.records[:room])

    def deadline_ms(self, op_type: str) -> float | None:
        t = self.timeout
        if t is None:
            return None
        if isinstance(t, dict):
            return t.get(op_type, t.get("*"))
        return float(t)

    # -- the guarded call --------------------------------------------------------------------
    def call(self, st: Any, args: list[Any], kw: dict[str, Any], fin: list[Any]) -> Any:
        """Run one step; returns its outputs (possibly from the reference kernel)."""
        pl = st.placement
        var = pl.variant
        stats = self.stats.setdefault(var.name, VariantStats())
        stats.calls += 1
        rec = self._record(st, args, kw) if self.trace else None
        self._outs_finite = False
        t_start = time.perf_counter()
        if var.name in self.quarantine and not var.reference:
            refuse = getattr(st.fn, "refuse", None)  # the memory check (plan.limits) the
            if refuse is not None:  # wrapped kernel would have run before allocating
                refuse(*args, **kw)
            outs, err = self._plain(st, args, kw, reference=True)
            status = "fallback"
            self._kernel_s = time.perf_counter() - t_start
            stats.fallbacks += 1
            if err is not None:
                raise HandledFault(f"node {pl.node.label}: the reference kernel (variant "
                                  f"{var.name} is quarantined) failed: {err}")
            faults: list[tuple[str, str]] = [("quarantined", self.quarantine.reason(var.name))]
        else:
            pristine = _in_place_inputs(args, kw) if not var.reference else None
            snaps = self._snapshot(st, args, kw, pristine) if "mutation" in self.checks else None
            outs, faults = self._checked_call(st, args, kw, fin)
            if self._suspects:  # raised in the lean loop: a fault even if it passes now
                lean = self._suspects.pop(id(st), None)
                if lean is not None and not faults:
                    faults = [("exception", lean)]
            status = "ok"
            if snaps is not None:
                k = C.mutated(args, snaps)
                if k is not None:
                    faults.insert(0, ("mutation", f"kernel changed input {k} "
                                                  f"({_desc(args[k])[1]}{_desc(args[k])[0]})"))
                    for a, c in zip(args, snaps):
                        if c is not None:
                            self._restore(a, c)
                    pristine = [c if c is not None else a for a, c in zip(pristine or args, snaps)]
            if faults:
                outs, status = self._on_fault(st, pristine or args, kw, faults, stats, outs)
        if rec is not None:
            self._finish(rec, outs, t_start, status, faults, st.ref.name)
            rec.output_views = _views(outs, args, kw)
            prov = getattr(var, "provenance", None)  # a compiled region: its nodes' times
            if prov is not None:
                rec.covers = prov(status == "fallback")
        return outs

    @staticmethod
    def _snapshot(st, args, kw, pristine) -> list[Any] | None:
        skip = set(st.placement.variant.op.contract.mutates)
        if pristine is not None:  # run in place over these: they change by the plan
            skip |= {i for i, (a, p) in enumerate(zip(args, pristine)) if a is not p}
        return C.snapshot(args, skip)

    @staticmethod
    def _restore(a, snap) -> None:
        # Later steps read the same value: give them what the producer made.
        try:
            C.restore(a, snap)
        except ValueError:  # memory nothing can write to (then nothing wrote to it)
            pass

    def _checked_call(self, st, args, kw, fin) -> tuple[list[Any], list[tuple[str, str]]]:
        pl = st.placement
        contract = pl.variant.op.contract
        call_args = [C.readonly(a) for a in args] if "contract" in self.checks else args
        t0 = time.perf_counter()
        try:
            res = self._invoke(st.fn, call_args, kw, pl.node.op_type)
        except DeadlineExceeded as e:
            return [], [("deadline", str(e))]
        except KernelCrash as e:  # an isolated kernel's worker process died (guard/isolate.py)
            return [], [("crash", str(e))]
        except (MemoryLimitError, RunTimeoutError, HandledFault):
            raise  # a refused allocation, a passed run deadline, a fault answered inside
        except ValueError as e:
            if "read-only" in str(e) or "WRITEABLE" in str(e):
                return [], [("mutation", f"kernel wrote into a read-only input: {e}")]
            return [], [("exception", f"ValueError: {e}")]
        except PASS_THROUGH:
            raise
        except BaseException as e:  # noqa: BLE001 - every kernel failure is a fault (SystemExit)
            return [], [("exception", f"{type(e).__name__}: {e}")]
        finally:
            self._kernel_s = time.perf_counter() - t0
        try:
            outs = self._as_list(st, res)
        except KernelError as e:
            return [], [("outputs", str(e))]
        faults: list[tuple[str, str]] = []
        kinds = C.OUTPUT_KINDS if "contract" in self.checks else self.checks & C.OUTPUT_KINDS
        if kinds:
            dims = self._dims if id(st) in self._main[1] else {}
            faults += C.output_faults(outs, pl.node.outputs, dims, kinds,
                                      strings="dtype" in self.checks)
        if "contract" in self.checks:
            allowed = contract.aliases(len(outs))
            planned = kw.get("out")
            if isinstance(planned, np.ndarray):
                # Inputs the memory plan placed inside the planned output (a Concat's inputs
                # written straight into their slices) share it by the plan, not the kernel.
                allowed |= {(i, 0) for i, a in enumerate(args)
                            if isinstance(a, np.ndarray) and np.shares_memory(a, planned)}
            faults += C.alias_faults(args, outs, allowed)
        if self.checks & {"nan", "inf"} and st.ins:
            faults += self._numeric(st, args, outs, fin, contract.nan)
        return outs, faults

    def _numeric(self, st, args, outs, fin, nan_policy) -> list[tuple[str, str]]:
        # Each tensor is scanned once: `fin` caches "all finite" per slot for this run.
        ins_finite = True
        for s, a in zip(st.ins, args):
            if s < 0 or not C._floatish(a):
                continue
            f = fin[s]
            if f is None:
                f = fin[s] = C.all_finite(a)
            ins_finite = ins_finite and f
        out_finite = [C.all_finite(o) if C._floatish(o) else True for o in outs]
        for s, f in zip(st.outs, out_finite):
            if s >= 0:
                fin[s] = f
        self._outs_finite = all(out_finite)
        if self._outs_finite or not ins_finite:
            return []
        return C.numeric_faults([], outs, self.checks, nan_policy)

    def _invoke(self, fn, args, kw, op_type: str) -> Any:
        limit = self.deadline_ms(op_type)
        if limit is None:
            return fn(*args, **kw)
        if self._worker is None:
            self._worker = _DeadlineWorker()
        try:
            return self._worker.run(fn, args, kw, limit / 1000.0)
        except DeadlineExceeded:
            # Abandon the kernel: its thread finishes on its own; a fresh worker serves the rest.
            self._worker = None
            raise DeadlineExceeded(f"kernel ran past its {limit:g} ms deadline") from None

    def _as_list(self, st, res) -> list[Any]:
        n = len(st.outs)
        if type(res) is tuple:
            outs = list(res)
        else:
            outs = [res]
        if len(outs) < n and any(s >= 0 for s in st.outs[len(outs) :]):
            raise KernelError(f"kernel returned {len(outs)} outputs, node needs {n}")
        return [np.asarray(o) if isinstance(o, np.generic) else o for o in outs[:n]]

    def _on_fault(self, st, args, kw, faults, stats, outs=()) -> tuple[list[Any], str]:
        pl = st.placement
        var = pl.variant
        kind, detail = faults[0]
        shapes, dtypes = zip(*[_desc(a) for a in args]) if args else ((), ())
        rec = FaultRecord(
            node=pl.node.name,
            op_type=pl.node.op_type,
            variant=var.name,
            device=pl.device,
            check=kind,
            detail=detail,
            input_shapes=list(shapes),
            input_dtypes=list(dtypes),
            attrs=_attrs_for_record(kw),
        )
        for k, _ in faults:
            stats.faults[k] += 1
        where = f"node {pl.node.label}: check {kind!r} failed for variant {var.name} on {pl.device}"
        if self.on_fault == "raise":
            rec.action = "raise"
            self.faults.append(rec)
            raise HandledFault(f"{where}: {detail}")
        if var.reference:
            if kind in ("exception", "deadline", "mutation", "outputs"):
                rec.action = "raise"
                self.faults.append(rec)
                raise HandledFault(
                    f"{where} (the reference kernel; nothing to fall back to): {detail}"
                )
            # A reference kernel disagreeing with a check is recorded, not hidden or retried:
            # its outputs stand (rerunning an If/Loop would rerun its whole body).
            rec.action = "recorded"
            self.faults.append(rec)
            if not outs:
                outs, _ = self._plain(st, args, kw)
            return list(outs), "ok"
        ref_outs, ref_err = self._plain(st, args, kw, reference=True)
        if ref_err is not None:
            rec.action = "raise"
            self.faults.append(rec)
            raise HandledFault(f"{where}; the reference kernel failed too: {ref_err}")
        blame = getattr(st.ref, "blame", None)  # a compiled region names its first bad node
        named = blame(kind, list(args)) if blame is not None else None
        if named is not None:
            rec.node, rec.op_type, rec.detail = named[0], named[1], f"{named[2]}: {detail}"
        if kind in ("nan", "inf") and all(k in ("nan", "inf") for k, _ in faults):
            ref_bad = any((C.has_nan(o) if kind == "nan" else C.has_inf(o)) for o in ref_outs)
            if ref_bad:  # the math itself gives NaN/Inf here: an anomaly, not a faulty kernel
                rec.action = "recorded"
                self.faults.append(rec)
                return ref_outs, "ok"
        self.faults.append(rec)
        stats.fallbacks += 1
        self.quarantine.add(var.name, f"{kind}: {detail} (node {pl.node.name})")
        return ref_outs, "fallback"

    def _plain(self, st, args, kw, reference: bool = False):
        fn = st.ref.fn if reference else st.fn
        if reference:
            kw = _ref_kw(kw, st)
        try:
            return self._as_list(st, fn(*args, **kw)), None
        except (MemoryLimitError, RunTimeoutError, HandledFault, *PASS_THROUGH):
            raise
        except BaseException as e:  # noqa: BLE001
            return [], f"{type(e).__name__}: {e}"

    # -- tracing -----------------------------------------------------------------------------
    def _record(self, st, args, kw) -> OpRecord:
        pl = st.placement
        shapes, dtypes = zip(*[_desc(a) for a in args]) if args else ((), ())
        ws = 0
        try:
            ws = pl.variant.workspace(
                [a.shape if isinstance(a, np.ndarray) else () for a in args], kw
            )
        except Exception:  # noqa: BLE001 - a workspace rule that cannot evaluate reports 0
            ws = 0
        return OpRecord(
            node=pl.node.name,
            op_type=pl.node.op_type,
            device=pl.device,
            variant=pl.variant.name,
            input_shapes=list(shapes),
            input_dtypes=list(dtypes),
            workspace_bytes=ws,
            run=self.runs,
            origin=pl.node.origins,
        )

    def _finish(
        self, rec: OpRecord, outs, t_start: float, status: str, faults, ref_name: str
    ) -> None:
        t_end = time.perf_counter()
        rec.start_us = (t_start - self._t0) * 1e6
        # The kernel alone; the guard's scans and checks around it are reported apart, so a
        # traced profile does not charge them to the operator (NaN/Inf scans of a 3 MiB
        # output cost as much as a 3x3 max pool over it).
        kernel_us = min(self._kernel_s, t_end - t_start) * 1e6
        rec.exec_us = kernel_us
        rec.guard_us = (t_end - t_start) * 1e6 - kernel_us
        rec.status = status
        descs = [_desc(o) for o in outs]
        rec.output_shapes = [d[0] for d in descs]
        rec.output_dtypes = [d[1] for d in descs]
        if self.checks & {"nan", "inf"} and getattr(self, "_outs_finite", False) and not faults:
            rec.checks = {"nan": 0, "inf": 0}
        elif self.checks & {"nan", "inf"}:
            rec.checks = {
                "nan": sum(C.count_nan(o) for o in outs),
                "inf": sum(C.count_inf(o) for o in outs),
            }
        if faults:
            rec.error = "; ".join(f"{k}: {d}" for k, d in faults)
            if status == "fallback":
                rec.variant = f"{rec.variant} -> {ref_name}"
        self.records.append(rec)

    def report(self) -> dict[str, Any]:
        return {
            "variants": {k: v.as_dict() for k, v in self.stats.items()},
            "faults": [f.as_dict() for f in self.faults],
            "quarantine": dict(self.quarantine.entries),
            # the last failed write of quarantine_file (None when saved or not persisted)
            "quarantine_file_error": self.quarantine.persist_error,
        }
