"""Stress one shared quarantine file: N writer processes add distinct entries for D seconds while
a reader process keeps creating sessions on the same file; then count what was lost.

    python benchmarks/quarantine_stress.py [--procs 2] [--seconds 30] [--path DIR/q.json]

Exits 1 when any entry is missing, a write failed or a session could not be created.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
import warnings


def _writer(path: str, tag: str, seconds: float, start, results) -> None:
    from opwarden.guard.faults import Quarantine

    q = Quarantine(path)
    failures, worst = 0, 0.0
    start.wait()
    end, n = time.monotonic() + seconds, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # counted through persist_error
        while time.monotonic() < end:
            t = time.perf_counter()
            q.add(f"{tag}.{n}", f"stress entry {n} of {tag}")
            worst = max(worst, time.perf_counter() - t)
            failures += q.persist_error is not None
            n += 1
    results.put(("writer", tag, n, failures, worst))


def _reader(path: str, stop, start, results) -> None:
    import numpy as np
    from onnx import TensorProto, helper

    import opwarden as ow

    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", f32, [4])],
        [helper.make_tensor_value_info("y", f32, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    x = np.ones(4, np.float32)
    made, failed, errors = 0, 0, []
    start.wait()
    while not stop.is_set():
        try:
            ow.InferenceSession(data, quarantine_file=path).run(None, {"x": x})
            made += 1
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            failed += 1
            if len(errors) < 3:
                errors.append(f"{type(e).__name__}: {e}")
    results.put(("reader", made, failed, errors))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=2, help="writer processes")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each writes")
    ap.add_argument("--path", help="the quarantine file (default: a fresh temp folder)")
    args = ap.parse_args()
    path = args.path or os.path.join(tempfile.mkdtemp(prefix="qstress-"), "q.json")

    ctx = mp.get_context("spawn")
    start = ctx.Barrier(args.procs + 2)
    stop, results = ctx.Event(), ctx.Queue()
    tags = [f"p{i}" for i in range(args.procs)]
    writers = [
        ctx.Process(target=_writer, args=(path, t, args.seconds, start, results)) for t in tags
    ]
    reader = ctx.Process(target=_reader, args=(path, stop, start, results))
    for p in (*writers, reader):
        p.start()
    start.wait()
    t0 = time.monotonic()
    got = [results.get() for _ in writers]  # before join: a full queue would block the child
    wall = time.monotonic() - t0
    stop.set()
    got.append(results.get())
    for p in (*writers, reader):
        p.join()

    counts = {g[1]: g[2] for g in got if g[0] == "writer"}
    failures = sum(g[3] for g in got if g[0] == "writer")
    worst = max(g[4] for g in got if g[0] == "writer")
    _, made, failed, errors = next(g for g in got if g[0] == "reader")
    with open(path, encoding="utf-8") as f:
        on_disk = set(json.load(f)["variants"])
    want = {f"{t}.{n}" for t, c in counts.items() for n in range(c)}
    lost = len(want - on_disk)
    crashed = [p.name for p in (*writers, reader) if p.exitcode != 0]

    print(f"file: {path} ({os.path.getsize(path)} bytes)")
    print(f"writers: {args.procs} x {args.seconds:g} s, wall {wall:.1f} s")
    for t in tags:
        print(f"  {t}: {counts[t]} entries added")
    print(f"entries written {len(want)}, in the file {len(on_disk & want)}, lost {lost}")
    print(f"write failures {failures}, slowest add {worst * 1e3:.1f} ms")
    print(f"sessions created meanwhile {made}, failed {failed}")
    for e in errors:
        print(f"  {e}")
    if crashed:
        print(f"crashed: {crashed}")
    return 1 if lost or failures or failed or crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
