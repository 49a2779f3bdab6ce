"""The batch runner behind `opwarden batch`: items in, outputs out, failures named.

Batches of `batch_size` items go to a thread pool. A thread reads its batch's files (so reads
overlap other batches' runs), hands the loaded items to a free executor, and writes the
outputs. An executor is ``fn(kind, payload) -> [(ok, outputs | reason)]``: in-process, a
`FleetWorker` of its own (one session per thread, all sharing one `HealthBoard`); under Ray,
an actor (`opwarden.ray.jobs`). A file that cannot be read or run is reported by name and
skipped; the run goes on.
"""

from __future__ import annotations

import os
import platform
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from opwarden.batch.files import (
    BAD_FILE_ERRORS,
    Inputs,
    Item,
    check_row,
    load_feed,
    output_path,
    write_outputs,
    write_parquet,
)
from opwarden.batch.fleet import FleetWorker, HealthBoard
from opwarden.errors import InputError, OpwardenError

Executor = Callable[[str, list[dict[str, Any]]], list[tuple[bool, Any]]]


@dataclass
class BatchResult:
    """What a batch run did: items done, failures by name, the fleet's health."""

    total: int
    done: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    seconds: float = 0.0
    health: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


class _Job:
    def __init__(self, inputs: Inputs, out_dir: str, input_names: list[str],
                 output_names: list[str], progress: Callable[[int, int], None] | None) -> None:
        self.inputs, self.out_dir = inputs, out_dir
        self.input_names, self.output_names = input_names, output_names
        self.progress = progress
        self.result = BatchResult(len(inputs.items), ignored=list(inputs.ignored))
        self.rows: list[tuple[int, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def fail(self, item: Item, why: str) -> None:
        with self.lock:
            self.result.failed.append((item.name, why))
        self._tick()

    def _tick(self) -> None:
        if self.progress is not None:
            with self.lock:
                done, bad = self.result.done, len(self.result.failed)
            self.progress(done, bad)

    def load(self, items: list[Item]) -> tuple[list[Item], list[dict[str, Any]]]:
        good, payload = [], []
        for it in items:
            try:
                data = load_feed(it, self.input_names) if it.kind == "feed" else check_row(it)
            except (OpwardenError, *BAD_FILE_ERRORS) as e:
                self.fail(it, f"cannot be read: {type(e).__name__}: {e}")
                continue
            good.append(it)
            payload.append(data)
        return good, payload

    def finish(self, items: list[Item], results: list[tuple[bool, Any]]) -> None:
        for it, (ok, got) in zip(items, results):
            if not ok:
                self.fail(it, f"failed: {got}")
                continue
            if it.kind == "row":
                with self.lock:
                    self.rows.append((it.row, got))
            else:
                path = output_path(self.out_dir, it, len(self.output_names))
                try:
                    write_outputs(path, got)
                except OSError as e:
                    self.fail(it, f"output {path!r} cannot be written: {e.strerror or e}")
                    continue
                with self.lock:
                    self.result.outputs.append(path)
            with self.lock:
                self.result.done += 1
            self._tick()


def _duplicates(job: _Job) -> list[Item]:
    """Items whose output name another item already takes (a.npy and a.npz)."""
    seen: dict[str, str] = {}
    keep = []
    for it in job.inputs.items:
        if it.kind == "feed":
            out = output_path(job.out_dir, it, len(job.output_names))
            if out in seen:
                job.fail(it, f"its output {os.path.basename(out)} is already {seen[out]}'s")
                continue
            seen[out] = it.name
        keep.append(it)
    return keep


def run_items(inputs: Inputs, out_dir: str, executors: Sequence[Executor], *,
              input_names: list[str], output_names: list[str], batch_size: int = 8,
              threads: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> BatchResult:
    """Run every item through `executors` (each used by one thread at a time); outputs go to
    `out_dir`. `threads` (default: one per executor) may exceed the executors: the extra
    threads read and write while the executors run."""
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise InputError(f"output folder {out_dir!r} cannot be created: {e.strerror or e}") \
            from None
    job = _Job(inputs, out_dir, input_names, output_names, progress)
    items = _duplicates(job)
    free: queue.Queue[Executor] = queue.Queue()
    for ex in executors:
        free.put(ex)

    def one(batch: list[Item]) -> None:
        good, payload = job.load(batch)
        if not good:
            return
        kind = good[0].kind
        ex = free.get()
        try:
            results = ex(kind, payload)
        except Exception as e:  # noqa: BLE001 - a lost worker fails its batch, not the run
            results = [(False, f"worker failed: {type(e).__name__}: {e}")] * len(good)
        finally:
            free.put(ex)
        job.finish(good, results)

    t0 = time.perf_counter()
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    n_threads = max(1, threads or len(executors))
    with ThreadPoolExecutor(n_threads, thread_name_prefix="opwarden-batch") as pool:
        for f in [pool.submit(one, b) for b in batches]:
            f.result()
    if inputs.parquet is not None and job.rows:
        path = os.path.join(out_dir, inputs.parquet + ".parquet")
        write_parquet(path, job.rows, output_names)
        job.result.outputs.append(path)
    job.result.seconds = time.perf_counter() - t0
    job.result.failed.sort()
    return job.result


def local_workers(model: Any, n: int, board: HealthBoard, *, threads_each: int | None = None,
                  **kw: Any) -> list[FleetWorker]:
    """`n` in-process workers (one session each) sharing `board`; a bad model raises here."""
    cpus = os.cpu_count() or 1
    each = threads_each or max(1, cpus // max(n, 1))
    return [FleetWorker(model, link=board, worker=f"thread-{i}", node=platform.node(),
                        threads=each, **kw) for i in range(n)]
