"""Ours with providers=["openvino", "cpu"] vs OpenVINO's own whole-model compiled run vs ORT,
2 threads each, alternated per repetition; prints per-model times and the ratios (geomean over
the light zoo), then a BERT-base encoder (bench_transformer.build_encoder).

    python benchmarks/openvino_zoo.py [--reps 24] [--models squeezenet,resnet50] [--no-bert]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import openvino as ov  # noqa: E402

import opwarden as ow  # noqa: E402
from opwarden import zoo  # noqa: E402
from opwarden.cli.bench import peer_runner  # noqa: E402

THREADS = 2
DEFAULT = ("bvlc_alexnet", "inception_v1", "resnet50", "shufflenet", "squeezenet")


def _runners(data: bytes, feeds: dict[str, np.ndarray]):
    ours = ow.InferenceSession(data, providers=["openvino", "cpu"],
                               intra_op_num_threads=THREADS)
    peer = peer_runner("onnxruntime", data, THREADS)  # its spinning off, as every bench
    core = ov.Core()
    cm = core.compile_model(core.read_model(data), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": THREADS,
        "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False})  # as the regions' config
    req = cm.create_infer_request()
    vals = list(feeds.values())
    return {
        "ours": lambda: ours.run(None, feeds),
        "openvino": lambda: req.infer(vals, share_inputs=True),
        "ort": lambda: peer(feeds),
    }


def measure(data: bytes, feeds: dict[str, np.ndarray], reps: int) -> dict[str, float]:
    """Median seconds per run of each runner, the runners alternated within a repetition in
    every order in turn, so that each follows each other equally often (whatever one leaves
    behind, warm caches or threads still awake, falls on every other runner alike)."""
    run = _runners(data, feeds)
    for fn in run.values():  # warm: compile, plan, first-touch
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in run}
    orders = list(itertools.permutations(run))
    for i in range(reps):
        for k in orders[i % len(orders)]:
            t = time.perf_counter()
            run[k]()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=24)
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--no-bert", action="store_true")
    args = ap.parse_args(argv)
    r_ort, r_ov = [], []
    print(f"{'model':16} {'ours ms':>9} {'ov ms':>9} {'ort ms':>9} {'ours/ort':>9} {'ours/ov':>8}")
    for name in args.models.split(","):
        m = zoo.build(name, seed=0)
        t = measure(m.SerializeToString(), zoo.feeds_for(m, seed=1), args.reps)
        r_ort.append(t["ours"] / t["ort"])
        r_ov.append(t["ours"] / t["openvino"])
        print(f"{name:16} {t['ours'] * 1e3:9.2f} {t['openvino'] * 1e3:9.2f} {t['ort'] * 1e3:9.2f} "
              f"{r_ort[-1]:9.3f} {r_ov[-1]:8.3f}")
    print(f"light zoo geomean: ours/ORT {_geo(r_ort):.3f} (target <= 0.9), "
          f"ours/OpenVINO-whole {_geo(r_ov):.3f} (target <= 1.1)")
    if not args.no_bert:
        import bench_transformer as bt

        model = bt.build_encoder(layers=12, hidden=768, heads=12, seq=128)
        t = measure(model.SerializeToString(), bt.feeds(1, 128, 768), max(args.reps // 4, 3))
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"BERT-base encoder: ours {ms['ours']:.1f} ms, OpenVINO {ms['openvino']:.1f}"
              f" ms, ORT {ms['ort']:.1f} ms; ours/ORT {t['ours'] / t['ort']:.3f} (target <= "
              f"1.0), ours/OpenVINO {t['ours'] / t['openvino']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
