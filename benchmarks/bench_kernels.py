"""Micro-benchmarks: opwarden's fast CPU kernels vs ONNX Runtime on single-node models.

For every distinct Conv of the light zoo (shapes from the models themselves) this times
ONNX Runtime (2 threads, NCHW, all its optimizations) against our NHWC kernel (input already in
NHWC, output into a preallocated buffer), our NCHW kernel and optionally the reference kernel,
alternating them, median of many runs. It prints GFLOP/s per shape and, per model, the ratio of
total convolution time (each shape weighted by how often it occurs) with the geometric mean.

    python benchmarks/bench_kernels.py [--models resnet50,vgg19] [--runs 15] [--ref]
                                       [--json out.json]

`--grouped`: instead, the grouped convolutions of ResNeXt-50 32x4d, RegNetX/Y and grouped 1x1s
(GROUPED_SHAPES) at batch 1 and 8: the route conv_nhwc took before the compiled grouped loop
(shifted GEMM or patch matrix) against that loop, alternated in one process.
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
import sys
import time
from collections import Counter
from functools import partial

import numpy as np
from onnx import TensorProto, helper, numpy_helper

LIGHT = ("resnet50", "vgg19", "densenet121", "inception_v1", "inception_v2", "shufflenet",
         "squeezenet", "bvlc_alexnet", "zfnet512")


def conv_shapes(name: str) -> Counter:
    """Distinct Conv configurations of a zoo model -> how many nodes have each."""
    from opwarden import zoo
    from opwarden.ir.load import load

    graph = load(zoo.build(name)).graph
    found: Counter = Counter()
    for n in graph.nodes:
        if n.op_type != "Conv":
            continue
        a = n.attrs
        ap = a.get("auto_pad", "NOTSET")
        key = (
            tuple(n.inputs[0].fact.shape),
            tuple(n.inputs[1].fact.shape),
            len(n.inputs) > 2 and n.inputs[2] is not None,
            int(a.get("group", 1)),
            tuple(a.get("strides", (1, 1))),
            tuple(a.get("pads", (0, 0, 0, 0))),
            tuple(a.get("dilations", (1, 1))),
            ap.decode() if isinstance(ap, bytes) else ap,
        )
        found[key] += 1
    return found


def _attrs(key) -> dict:
    _x, _w, _b, group, strides, pads, dil, ap = key
    d = {"group": group, "strides": list(strides), "dilations": list(dil), "auto_pad": ap}
    d["pads"] = list(pads) if ap == "NOTSET" else None
    return d


THREADS = 2


def _ort_session(key, w, b):
    import onnxruntime as ort

    xs, ws, has_b, *_ = key
    attrs = {k: v for k, v in _attrs(key).items() if v is not None}
    if attrs["auto_pad"] == "NOTSET":
        del attrs["auto_pad"]
    inits = [numpy_helper.from_array(w, "W")]
    inputs = ["X", "W"]
    if has_b:
        inits.append(numpy_helper.from_array(b, "B"))
        inputs.append("B")
    node = helper.make_node("Conv", inputs, ["Y"], kernel_shape=list(ws[2:]), **attrs)
    g = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(xs))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    # Spinning workers would starve OpenBLAS's threads between alternating runs (and vice versa
    # OpenBLAS spins little): with spinning on, both sides measure the other's idle threads.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _median_times(fns: dict, runs: int, budget_s: float) -> dict:
    """Alternate the callables (after a warm-up): median seconds of each, and (key+"_min") the
    fastest run, which on a machine shared with other work is the steadier estimate."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    start = time.perf_counter()
    for r in range(runs):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
        if r >= 4 and time.perf_counter() - start > budget_s:
            break
    res = {k: float(np.median(v)) for k, v in times.items()}
    res.update({k + "_min": float(np.min(v)) for k, v in times.items()})
    return res


def bench_conv(key, runs: int, budget_s: float, with_ref: bool) -> dict:
    from opwarden.kernels.cpu.conv import conv_nchw, conv_nhwc
    from opwarden.ops.conv import Conv

    xs, ws, has_b, *_ = key
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32) * np.float32(0.05)
    w.flags.writeable = False  # as initializers are: lets the kernel cache its packed weights
    b = rng.standard_normal(ws[0], dtype=np.float32) if has_b else None
    attrs = _attrs(key)
    sess = _ort_session(key, np.array(w), b)
    y_ref = sess.run(None, {"X": x})[0]
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    out_nhwc = np.empty((y_ref.shape[0],) + y_ref.shape[2:] + y_ref.shape[1:2], np.float32)
    out_nchw = np.empty_like(y_ref)
    err = max(
        float(np.abs(conv_nhwc(x_nhwc, w, b, **attrs, out=out_nhwc).transpose(0, 3, 1, 2)
                     - y_ref).max()),
        float(np.abs(conv_nchw(x, w, b, **attrs, out=out_nchw) - y_ref).max()),
    )
    fns = {
        "ort": lambda: sess.run(None, {"X": x}),
        "nhwc": lambda: conv_nhwc(x_nhwc, w, b, **attrs, out=out_nhwc),
        "nchw": lambda: conv_nchw(x, w, b, **attrs, out=out_nchw),
    }
    if with_ref:
        fns["ref"] = lambda: Conv(x, w, b, **attrs)
    t = _median_times(fns, runs, budget_s)
    flops = 2.0 * y_ref.size * math.prod(ws[1:])
    return {"flops": flops, "err": err, **{k: v for k, v in t.items()}}


# (x NCHW, W, group, stride, where from) for --grouped; 3x3 ones padded 1, 1x1 unpadded.
GROUPED_SHAPES = [
    ((1, 128, 56, 56), (128, 4, 3, 3), 32, 1, "resnext50 s1"),
    ((1, 256, 56, 56), (256, 8, 3, 3), 32, 2, "resnext50 s2 first"),
    ((1, 256, 28, 28), (256, 8, 3, 3), 32, 1, "resnext50 s2"),
    ((1, 512, 28, 28), (512, 16, 3, 3), 32, 2, "resnext50 s3 first"),
    ((1, 512, 14, 14), (512, 16, 3, 3), 32, 1, "resnext50 s3"),
    ((1, 1024, 14, 14), (1024, 32, 3, 3), 32, 2, "resnext50 s4 first"),
    ((1, 1024, 7, 7), (1024, 32, 3, 3), 32, 1, "resnext50 s4"),
    ((1, 24, 56, 56), (24, 8, 3, 3), 3, 1, "regnetx200 gw8"),
    ((1, 152, 14, 14), (152, 8, 3, 3), 19, 1, "regnetx200 gw8"),
    ((1, 64, 28, 28), (64, 16, 3, 3), 4, 1, "regnetx400 gw16"),
    ((1, 384, 14, 14), (384, 16, 3, 3), 24, 2, "regnetx400 gw16 first"),
    ((1, 120, 28, 28), (120, 24, 3, 3), 5, 1, "regnety1.6 gw24"),
    ((1, 336, 14, 14), (336, 24, 3, 3), 14, 1, "regnety1.6 gw24"),
    ((1, 432, 28, 28), (432, 48, 3, 3), 9, 1, "regnetx3.2 gw48"),
    ((1, 448, 14, 14), (448, 64, 3, 3), 7, 1, "regnety8 gw64"),
    ((1, 96, 28, 28), (384, 12, 1, 1), 8, 1, "shufflenet g8 1x1"),
    ((1, 240, 28, 28), (60, 80, 1, 1), 3, 1, "1x1 g3 mg20"),
    ((1, 256, 28, 28), (256, 8, 1, 1), 32, 1, "1x1 g32 cg8"),
]


def bench_grouped(runs: int, budget_s: float, batches=(1, 8)) -> None:
    """--grouped (module docstring): per shape and batch, median us of the old route and of
    the grouped loop, and their GFLOP/s."""
    from opwarden.kernels.cpu import conv as C
    from opwarden.kernels.cpu import conv_grouped as G

    rng = np.random.default_rng(0)
    print(f"{'shape':<24} {'x (NCHW)':<20} {'w':<17} s  {'old':<8} | {'old us':>8} "
          f"{'new us':>8} | old GF/s new GF/s  old/new")
    for xs0, ws, group, stride, what in GROUPED_SHAPES:
        for nb in batches:
            xs = (nb, *xs0[1:])
            k = ws[2]
            pads = [k // 2] * 4
            x = np.ascontiguousarray(rng.standard_normal(xs, dtype=np.float32)
                                     .transpose(0, 2, 3, 1))
            w = rng.standard_normal(ws, dtype=np.float32) * np.float32(0.05)
            w.flags.writeable = False
            b = rng.standard_normal(ws[0], dtype=np.float32)
            attrs = {"group": group, "strides": [stride] * 2, "pads": pads}
            taken = G.grouped_takes
            G.grouped_takes = lambda *a: False
            try:
                old = C.static_route(x.shape, ws, attrs)
            finally:
                G.grouped_takes = taken
            old_k, new_k = C.nhwc_kernel(old), C.nhwc_kernel("grouped")
            y0 = old_k(x, w, b, **attrs)
            y1, y2 = np.empty_like(y0), np.empty_like(y0)
            err = float(np.abs(new_k(x, w, b, **attrs, out=y1) - y0).max())
            t = _median_times({"old": partial(old_k, x, w, b, **attrs, out=y2),
                               "new": partial(new_k, x, w, b, **attrs, out=y1)}, runs, budget_s)
            flops = 2.0 * y0.size * math.prod(ws[1:])
            line = (f"{what:<24} {str(xs):<20} {str(ws):<17} {stride}  {old:<8} | "
                    f"{t['old'] * 1e6:8.0f} {t['new'] * 1e6:8.0f} | {flops / t['old'] / 1e9:8.1f} "
                    f"{flops / t['new'] / 1e9:8.1f} {t['old'] / t['new']:8.2f}")
            if err > 1e-3:
                line += f"  MISMATCH {err:.2g}"
            print(line, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(LIGHT))
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per shape at most")
    ap.add_argument("--ref", action="store_true", help="also time the reference kernel")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="statistic of the runs to compare (min is steadier on a busy machine)")
    ap.add_argument("--threads", type=int, default=2, help="threads for ORT and OpenBLAS")
    ap.add_argument("--grouped", action="store_true",
                    help="old route vs the compiled grouped loop on GROUPED_SHAPES (docstring)")
    args = ap.parse_args(argv)
    global THREADS
    THREADS = args.threads
    from opwarden.blas import set_blas_threads

    if not set_blas_threads(THREADS):
        print("warning: could not set the OpenBLAS thread count", file=sys.stderr)
    np.random.seed(0)
    if args.grouped:
        bench_grouped(args.runs, args.budget)
        return 0
    results, per_model = {}, {}
    print(f"{'model':<13} {'x':<18} {'w':<18} g  s  | {'ours':>7} {'ort':>7} GF/s | "
          f"nhwc/ort nchw/ort" + ("  ref/ort" if args.ref else ""))
    for name in args.models.split(","):
        shapes = conv_shapes(name)
        tot = Counter()
        for key, count in shapes.items():
            if key not in results:
                results[key] = bench_conv(key, args.runs, args.budget, args.ref)
            r = dict(results[key])
            if args.stat == "min":
                r.update({k: r[k + "_min"] for k in ("ort", "nhwc", "nchw", "ref") if k in r})
            for k in ("ort", "nhwc", "nchw", "ref"):
                if k in r:
                    tot[k] += count * r[k]
                    tot[k + "_min"] += count * r[k + "_min"]
            line = (f"{name:<13} {str(key[0]):<18} {str(key[1]):<18} {key[3]:<2} {key[4][0]}  | "
                    f"{r['flops'] / r['nhwc'] / 1e9:7.1f} {r['flops'] / r['ort'] / 1e9:7.1f} | "
                    f"{r['nhwc'] / r['ort']:8.2f} {r['nchw'] / r['ort']:8.2f}")
            if args.ref:
                line += f" {r['ref'] / r['ort']:8.2f}"
            if r["err"] > 1e-3:
                line += f"  MISMATCH {r['err']:.2g}"
            print(line, flush=True)
        per_model[name] = {k: v for k, v in tot.items()}
        print(f"== {name}: conv total ort {tot['ort'] * 1e3:.2f} ms, nhwc {tot['nhwc'] * 1e3:.2f} "
              f"ms ({tot['nhwc'] / tot['ort']:.2f}x), nchw {tot['nchw'] * 1e3:.2f} ms "
              f"({tot['nchw'] / tot['ort']:.2f}x)", flush=True)
    for k in ("nhwc", "nchw", "ref"):
        ratios = [v[k] / v["ort"] for v in per_model.values() if k in v]
        if ratios:
            gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(f"geometric mean of per-model conv time {k}/ort: {gm:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_model": per_model,
                       "shapes": [{"key": repr(k), **v} for k, v in results.items()]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
