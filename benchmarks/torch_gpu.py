"""The light zoo and a BERT-base encoder on CUDA through the torch provider, vs torch eager on
the same GPU (the ONNX model converted by onnx2torch, when installed) and vs ORT on the CPU (2
threads); prints per-model times and ratios. Exits cleanly saying "no CUDA device" without one.

    python benchmarks/torch_gpu.py [--reps 20] [--models squeezenet,resnet50] [--no-bert]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402


def _eager(model, feeds):
    """Torch eager on the GPU: each ONNX node as the matching torch call (onnx2torch when
    installed), else None."""
    try:
        import onnx2torch  # type: ignore[import-not-found]
        import torch
    except ImportError:
        return None
    net = onnx2torch.convert(model).cuda().eval()
    args = [torch.from_numpy(v).cuda() for v in feeds.values()]

    def run():
        with torch.inference_mode():
            net(*args)
        torch.cuda.synchronize()
    return run


def measure(model, feeds, reps: int) -> dict[str, float]:
    import onnxruntime as ort
    import torch

    import opwarden as ow

    data = model.SerializeToString()
    ours = ow.InferenceSession(data, providers=["torch", "cpu"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    def ours_run():
        ours.run(None, feeds)
        torch.cuda.synchronize()
    run = {"ours": ours_run, "ort_cpu": lambda: peer.run(None, feeds)}
    eager = _eager(model, feeds)
    if eager is not None:
        run["eager"] = eager
    for fn in run.values():
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in run}
    for _ in range(reps):
        for k, fn in run.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", default="bvlc_alexnet,inception_v1,resnet50,shufflenet,squeezenet")
    ap.add_argument("--no-bert", action="store_true")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no CUDA device (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    from opwarden import zoo

    cases = [(n, zoo.build(n, seed=0)) for n in args.models.split(",")]
    if not args.no_bert:
        import bench_transformer as bt

        cases.append(("bert-base", bt.build_encoder(layers=12, hidden=768, heads=12, seq=128)))
    r_eager, r_ort = [], []
    for name, model in cases:
        feeds = (zoo.feeds_for(model, seed=1) if name != "bert-base"
                 else __import__("bench_transformer").feeds(1, 128, 768))
        t = measure(model, feeds, args.reps)
        line = f"{name:16} ours {t['ours'] * 1e3:8.2f} ms  ort-cpu {t['ort_cpu'] * 1e3:8.2f} ms"
        r_ort.append(t["ours"] / t["ort_cpu"])
        if "eager" in t:
            r_eager.append(t["ours"] / t["eager"])
            line += f"  eager {t['eager'] * 1e3:8.2f} ms  ours/eager {r_eager[-1]:.3f}"
        print(line + f"  ours/ort-cpu {r_ort[-1]:.3f}")

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
    print(f"geomean ours/eager {geo(r_eager):.3f}, ours/ORT-CPU {geo(r_ort):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
