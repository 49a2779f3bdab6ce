"""Fleet health: what every worker's guard learns, merged on one board and shared back.

A worker (a thread of `opwarden batch`, a Ray actor of `opwarden.ray`) owns one session. Before
each batch it pulls the quarantine entries the board learned since its last pull and adopts
them (`Quarantine.merge`), so a variant another worker quarantined is skipped from that batch
on. After each batch it pushes what its guard saw since the last push: per-variant counter
deltas, new fault records, its own new quarantine entries and (when tracing) its op records.
The board keeps them with the worker and node they came from, and notes when each worker
adopted each entry: a worker's calls of a variant after that time would be a broken promise.

The board is a plain object here (threads share it); `opwarden.ray` runs the same class as a
named Ray actor.
"""

from __future__ import annotations

import copy
import importlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opwarden.batch.rows import RowRunner
from opwarden.errors import InputError, OptionsError, OpwardenError
from opwarden.options import SessionOptions

MAX_FAULTS = 10_000  # fault records a board keeps (the counters count every one)
MAX_TRACE_EVENTS = 2_000_000
# Cheap output checks that keep a worker on the guarded loop: only that loop counts calls per
# variant, and a kernel that fails once is rerun there (the lean loop's rerun would hide it).
GUARDED_CHECKS = ("shape", "dtype")


class HealthBoard:
    """Merged counters, fault records, quarantine decisions and traces of a fleet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything: workers, counters, faults, quarantine, traces."""
        with self._lock:
            self.workers: dict[str, dict[str, Any]] = {}
            self.variants: dict[str, dict[str, Any]] = {}
            self.faults: list[dict[str, Any]] = []
            self.faults_dropped = 0
            # name -> {reason, worker, node, time, version, adopted: {worker: time}}
            self.quarantine: dict[str, dict[str, Any]] = {}
            self.version = 0
            self.trace: list[dict[str, Any]] = []

    def _worker(self, worker: str, node: str) -> dict[str, Any]:
        w = self.workers.get(worker)
        if w is None:
            w = self.workers[worker] = {"node": node, "row": len(self.workers) + 1,
                                        "batches": 0, "rows": 0, "first_seen": time.time()}
        w["last_seen"] = time.time()
        return w

    def pull(self, worker: str, node: str, version: int) -> tuple[int, dict[str, str]]:
        """The entries newer than `version` (reason by name) and the board's version now."""
        with self._lock:
            self._worker(worker, node)
            new = {k: q["reason"] for k, q in self.quarantine.items() if q["version"] > version}
            now = time.time()
            for k in new:
                self.quarantine[k]["adopted"].setdefault(worker, now)
            return self.version, new

    def push(self, worker: str, node: str, report: Mapping[str, Any]) -> None:
        """Merge one worker's report of a batch (see FleetWorker.report)."""
        with self._lock:
            w = self._worker(worker, node)
            w["batches"] += report.get("batches", 0)
            w["rows"] += report.get("rows", 0)
            if "start" in report:  # the worker's busy time and its first and last batch
                w["busy_s"] = w.get("busy_s", 0.0) + report["end"] - report["start"]
                w["first_start"] = min(w.get("first_start", report["start"]), report["start"])
                w["last_end"] = max(w.get("last_end", report["end"]), report["end"])
            for name, d in report.get("variants", {}).items():
                self._count(name, worker, d)
            for f in report.get("faults", []):
                if len(self.faults) < MAX_FAULTS:
                    # "node" is the graph node the fault record names; the machine is "cluster_node"
                    self.faults.append({**f, "worker": worker, "cluster_node": node})
                else:
                    self.faults_dropped += 1
            now = time.time()
            for name, reason in report.get("quarantine", {}).items():
                q = self.quarantine.get(name)
                if q is None:
                    self.version += 1
                    q = self.quarantine[name] = {
                        "reason": reason, "worker": worker, "node": node, "time": now,
                        "version": self.version, "adopted": {}}
                q["adopted"].setdefault(worker, now)
            room = MAX_TRACE_EVENTS - len(self.trace)
            events = report.get("trace", [])
            if events and room > 0:
                self.trace.extend({**e, "pid": w["row"]} for e in events[:room])

    def _count(self, name: str, worker: str, d: Mapping[str, Any]) -> None:
        v = self.variants.setdefault(name, {"calls": 0, "fallbacks": 0, "faults": {},
                                            "workers": {}})
        per = v["workers"].setdefault(worker, {"calls": 0, "fallbacks": 0, "faults": {}})
        for tgt in (v, per):
            tgt["calls"] += d.get("calls", 0)
            tgt["fallbacks"] += d.get("fallbacks", 0)
            for kind, n in d.get("faults", {}).items():
                tgt["faults"][kind] = tgt["faults"].get(kind, 0) + n

    def health(self) -> dict[str, Any]:
        """workers, variants (with per-worker counters), faults (each with its worker and
        cluster_node, beside the graph node it names),
        quarantine (who found each entry, when, and when each worker adopted it)."""
        with self._lock:
            return copy.deepcopy({
                "workers": self.workers, "variants": self.variants, "faults": self.faults,
                "faults_dropped": self.faults_dropped, "quarantine": self.quarantine})

    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome-trace events: one process row per worker, times in µs since the first."""
        with self._lock:
            events = [dict(e) for e in self.trace]
            rows = {w["row"]: (name, w["node"]) for name, w in self.workers.items()}
        t0 = min((e["ts"] for e in events), default=0.0)
        for e in events:
            e["ts"] -= t0
        meta = [{"name": "process_name", "ph": "M", "pid": row,
                 "args": {"name": f"worker {name} on {node}"}}
                for row, (name, node) in sorted(rows.items())]
        return meta + events


_SETUP_DONE: set[str] = set()  # setups this process has run (a kernel registers once)


def run_setup(setup: str | Callable[[], Any] | None) -> None:
    """Run a worker's setup once per process: a callable, an importable "module:function",
    or a module path (imported for what it registers)."""
    if setup is None:
        return
    if callable(setup):
        setup()
        return
    if not isinstance(setup, str) or not setup.strip():
        raise OptionsError(f"setup must be 'module:function', a module path or a callable, got "
                           f"{setup!r}")
    if setup in _SETUP_DONE:
        return
    mod_name, _, fn_name = setup.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the setup's
        raise OptionsError(f"setup {setup!r}: module {mod_name!r} cannot be imported: "
                           f"{type(e).__name__}: {e}") from None
    if fn_name:
        fn = getattr(mod, fn_name, None)
        if not callable(fn):
            raise OptionsError(f"setup {setup!r}: module {mod_name!r} has no function "
                               f"{fn_name!r}")
        fn()
    _SETUP_DONE.add(setup)


def worker_options(sess_options: SessionOptions | None, threads: int | None, guarded: bool,
                   session_kw: Mapping[str, Any]) -> SessionOptions:
    """A worker's own copy of the options: `threads` intra-op threads unless set, and (guarded)
    the output checks that keep it on the guarded loop."""
    opts = SessionOptions(**(sess_options.as_dict() if sess_options is not None else {}))
    for k, v in session_kw.items():
        setattr(opts, k, v)
    if threads and not opts.intra_op_num_threads:
        opts.intra_op_num_threads = int(threads)
    if guarded:
        have = [opts.checks] if isinstance(opts.checks, str) else list(opts.checks or ())
        opts.checks = tuple(dict.fromkeys([*have, "contract", *GUARDED_CHECKS]))
    return opts


class FleetWorker:
    """One worker's session, kept in step with a board through `link` (an object with the
    board's ``pull`` and ``push``; None: no fleet)."""

    def __init__(self, model: Any, *, providers: Any = None,
                 sess_options: SessionOptions | None = None, setup: Any = None,
                 output_names: Any = None, link: Any = None, worker: str = "worker",
                 node: str = "", threads: int | None = None, guarded: bool = True,
                 **session_kw: Any) -> None:
        from opwarden.session import InferenceSession

        run_setup(setup)
        self.worker, self.node, self.link = worker, node, link
        opts = worker_options(sess_options, threads, guarded, session_kw)
        self.version = 0
        self._started: float | None = None
        self._pending: dict[str, str] = {}
        if link is not None:  # adopt the fleet's quarantine before the first batch
            self._pull()
        self.session = InferenceSession(model, sess_options=opts, providers=providers)
        self.rows = RowRunner(self.session, output_names)
        self._reported_faults = 0
        self._reported_stats: dict[str, dict[str, Any]] = {}
        self._known: set[str] = set(self._pending)
        self.session.guard.quarantine.merge(self._pending)
        self._pending = {}

    def _pull(self) -> None:
        version, new = self.link.pull(self.worker, self.node, self.version)
        self.version = version
        self._pending.update(new)

    def sync_in(self) -> None:
        """Adopt what the board learned since the last pull."""
        if self.link is None:
            return
        self._pull()
        self._started = time.time()
        if self._pending:
            self._known |= set(self._pending)
            self.session.guard.quarantine.merge(self._pending)
            self._pending = {}

    def report(self, rows: int) -> dict[str, Any]:
        """What this worker's guard saw since the last report."""
        g = self.session.guard
        faults = g.faults[self._reported_faults:]
        self._reported_faults += len(faults)
        variants: dict[str, Any] = {}
        for name, st in list(g.stats.items()):
            now = st.as_dict()
            was = self._reported_stats.get(name, {"calls": 0, "fallbacks": 0, "faults": {}})
            d = {"calls": now["calls"] - was["calls"],
                 "fallbacks": now["fallbacks"] - was["fallbacks"],
                 "faults": {k: n - was["faults"].get(k, 0) for k, n in now["faults"].items()
                            if n != was["faults"].get(k, 0)}}
            if d["calls"] or d["fallbacks"] or d["faults"]:
                variants[name] = d
            self._reported_stats[name] = now
        found = {k: v for k, v in list(g.quarantine.entries.items()) if k not in self._known}
        self._known |= set(found)
        started, self._started = self._started, None
        times = {"start": started, "end": time.time()} if started is not None else {}
        return {"batches": 1, "rows": rows, "variants": variants, **times,
                "faults": [f.as_dict() for f in faults], "quarantine": found,
                "trace": self._trace_events()}

    def _trace_events(self) -> list[dict[str, Any]]:
        marks, self.rows.run_marks = self.rows.run_marks, []
        recs = self.session.guard.all_records
        events = []
        for i, (t_wall, first) in enumerate(marks):
            last = marks[i + 1][1] if i + 1 < len(marks) else len(recs)
            for r in recs[first:last]:
                events.append({"name": r.node, "cat": r.op_type, "ph": "X", "tid": 0,
                               "ts": t_wall * 1e6 + r.start_us, "dur": max(r.exec_us, 0.001),
                               "args": {"variant": r.variant, "status": r.status,
                                        "input_shapes": r.input_shapes, "error": r.error,
                                        "worker": self.worker, "node": self.node}})
        return events

    def run_batch(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Outputs for `batch` (RowRunner.run_batch) between a pull and a push."""
        self.sync_in()
        n = 0
        try:
            out = self.rows.run_batch(batch)
            n = len(next(iter(out.values()))) if out else 0
            return out
        finally:
            self.sync_out(n)

    def run_feed(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """One run (a whole feed), without syncing: the caller syncs around its batch."""
        return self.rows.run_feed(feeds)

    def sync_out(self, rows: int) -> None:
        """Push this batch's report to the board."""
        if self.link is not None:
            self.link.push(self.worker, self.node, self.report(rows))

    def run_items(self, kind: str, payload: list[dict[str, Any]]) -> list[tuple[bool, Any]]:
        """Per item, (True, outputs) or (False, why it failed): each "feed" item is one run,
        "row" items (Parquet rows) run as one batch, row by row where that batch fails."""
        self.sync_in()
        results: list[tuple[bool, Any]] = []
        try:
            if kind == "feed":
                results = [_attempt(self.rows.run_feed, feeds) for feeds in payload]
            else:
                results = self._rows(payload)
        finally:
            self.sync_out(sum(ok for ok, _ in results))
        return results

    def _rows(self, rows: list[dict[str, Any]]) -> list[tuple[bool, Any]]:
        ok, out = _attempt(lambda r: self.rows.run_batch(_columns(r)), rows)
        if ok:
            return [(True, {k: out[k][i] for k in self.rows.output_names})
                    for i in range(len(rows))]
        if len(rows) == 1:
            return [(False, out)]
        return [r for row in rows for r in self._rows([row])]


def _columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cols: dict[str, Any] = {}
    for k in rows[0]:
        vals = [r[k] for r in rows]
        try:
            cols[k] = np.stack(vals)
        except ValueError:  # ragged between rows: each row alone (the caller's fallback)
            raise InputError(f"column {k!r} has rows of different shapes "
                             f"{sorted({np.shape(v) for v in vals})}") from None
    return cols


def _attempt(fn: Callable[[Any], Any], arg: Any) -> tuple[bool, Any]:
    try:
        return True, fn(arg)
    except OpwardenError as e:
        return False, f"{type(e).__name__}: {e}"
    except (ValueError, TypeError, ArithmeticError, MemoryError) as e:
        return False, f"{type(e).__name__}: {e}"
