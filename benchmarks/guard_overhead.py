"""Cost of tracing and health checks on the light ResNet-50, measured side by side.

    python benchmarks/guard_overhead.py [--runs N] [--model NAME]

Four sessions on one model, runs interleaved (plain, trace, all checks + trace, default), medians
and ratios against the plain session (checks off, no trace).
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS: its threads stop busy-waiting ~0.4 ms after our last GEMM instead
# of ~0.1 s, so they do not steal the cores of the peer's run that follows (see
# opwarden/__init__.py; the peer's own spinning is turned off likewise).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import time

import numpy as np

import opwarden as ow
from opwarden import zoo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--model", default="resnet50", choices=zoo.LIGHT_MODELS)
    a = p.parse_args()
    model = zoo.build(a.model)
    data, feeds = model.SerializeToString(), zoo.feeds_for(model, seed=1)
    sessions = {
        "plain (checks off)": ow.InferenceSession(data, checks=()),
        "default (contract checks)": ow.InferenceSession(data),
        "trace": ow.InferenceSession(data, checks=(), trace=True),
        "all checks": ow.InferenceSession(data, checks="all"),
        "all checks + trace": ow.InferenceSession(data, checks="all", trace=True),
    }
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():
        s.run(None, feeds)  # warm-up
    for _ in range(a.runs):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[k].append(time.perf_counter() - t0)
    base = float(np.median(times["plain (checks off)"]))
    print(f"{a.model}: median of {a.runs} interleaved runs")
    for k, v in times.items():
        med = float(np.median(v))
        print(
            f"  {k:28s} {med * 1e3:8.1f} ms   x{med / base:5.3f}  ({(med / base - 1) * 100:+.1f}%)"
        )


if __name__ == "__main__":
    main()
