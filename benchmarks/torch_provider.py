"""Time the light zoo on providers ["torch", "cpu"] against ONNX Runtime, side by side.

Both run with the same thread count (default 2); runs alternate in one process so machine
noise hits both alike; the table gives medians and the ratio ours/ORT, then the geometric mean.

    python benchmarks/torch_provider.py [--runs 10] [--threads 2] [--models resnet50,vgg19]
                                        [--providers torch,cpu] [--json out.json]
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS: its threads stop busy-waiting ~0.4 ms after our last GEMM instead
# of ~0.1 s, so they do not steal the cores of the peer's run that follows (see
# opwarden/__init__.py; the peer's own spinning is turned off likewise).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import json
import math
import statistics
import sys
import time


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def bench_model(name: str, providers: list[str], runs: int, threads: int) -> dict:
    """Median wall time of one inference: opwarden on `providers` and ONNX Runtime (CPU)."""
    import numpy as np
    import onnxruntime as ort

    import opwarden as ow
    from opwarden import zoo

    model = zoo.build(name, seed=0)
    data = model.SerializeToString()
    feeds = zoo.feeds_for(model, seed=1)
    t0 = time.perf_counter()
    ours = ow.InferenceSession(
        data, ow.SessionOptions(intra_op_num_threads=threads), providers=providers
    )
    prepare_s = time.perf_counter() - t0
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # No long spinning on either side: torch's OpenMP workers spin ~1 ms after a region
    # (GOMP_SPINCOUNT=30000, see opwarden/devices/torch_provider.py; ORT's times alternated with
    # ours measured no slower than with passive waiting), and a spinning ORT pool would steal
    # the shared cores from the other runtime's runs in this process.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    # Warm up both (first runs pay for plans, weight packing and page faults).
    for _ in range(2):
        got = ours.run(None, feeds)
        want = peer.run(None, feeds)
    err = max(
        float(np.abs(g - w).max() / (1e-3 * np.abs(w).max() + 1e-5)) for g, w in zip(got, want)
    )
    t_ours: list[float] = []
    t_ort: list[float] = []
    for _ in range(runs):
        t = time.perf_counter()
        ours.run(None, feeds)
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        peer.run(None, feeds)
        t_ort.append(time.perf_counter() - t)
    devices: dict[str, int] = {}
    for p in getattr(ours, "placements", []):
        devices[p.device] = devices.get(p.device, 0) + 1
    ms_ours, ms_ort = _median_ms(t_ours), _median_ms(t_ort)
    return {
        "model": name,
        "ours_ms": ms_ours,
        "ort_ms": ms_ort,
        "ratio": ms_ours / ms_ort,
        "err_over_tol": err,
        "nodes_by_device": devices,
        "prepare_s": prepare_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="", help="comma-separated (default: the light zoo)")
    ap.add_argument("--providers", default="torch,cpu")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args(argv)

    from opwarden import zoo
    from opwarden.devices import get_device

    providers = [p for p in args.providers.split(",") if p]
    if "torch" in providers:
        # First: the provider sets its OpenMP defaults before it imports torch.
        get_device("torch")
        from opwarden.kernels.torch import provider as torch_provider

        torch_provider.configure(args.threads)
    names = [m for m in args.models.split(",") if m] or list(zoo.LIGHT_MODELS)
    rows = []
    print(f"providers={providers} threads={args.threads} runs={args.runs}")
    print(f"{'model':<14}{'ours ms':>10}{'ORT ms':>10}{'ratio':>8}{'err/tol':>9}  devices")
    for name in names:
        r = bench_model(name, providers, args.runs, args.threads)
        rows.append(r)
        print(
            f"{name:<14}{r['ours_ms']:>10.2f}{r['ort_ms']:>10.2f}{r['ratio']:>8.3f}"
            f"{r['err_over_tol']:>9.3f}  {r['nodes_by_device']}",
            flush=True,
        )
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"geometric mean ratio {geo:.3f}; worst {worst['model']} {worst['ratio']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "geomean": geo, "providers": providers,
                       "threads": args.threads, "runs": args.runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
