"""Per-operator audit: single-node models, opwarden (providers cpu) vs ONNX Runtime, side by side.

The light zoo exercises a CNN's handful of operators; this script times everything else a user's
model may lean on (transformer blocks: Erf/Gelu, LayerNormalization, Softmax, batched MatMul,
reductions, elementwise math) on mid-sized float32 tensors, runs alternated in one process,
2 threads each, and prints the medians and ours/ORT per case, worst first. Outputs are compared
too (max abs difference, relative to the output's scale).

    python benchmarks/ops.py [--runs 15] [--only Erf,Gelu] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS: its threads stop busy-waiting soon after our last GEMM, so they
# do not steal the cores of the peer's run that follows (see benchmarks/bench_zoo.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import json
import math
import statistics
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 20
ROWS, COLS = 128, 3072  # a BERT-base FFN activation (sequence 128)
NCHW = (1, 64, 56, 56)


def _case(name, op, inputs, attrs=None, inits=None, opset=OPSET, nout=1):
    """(name, model bytes, feeds). inputs: {name: array} fed at run time; inits: initializers."""
    inits = inits or {}
    node = helper.make_node(op, [*inputs, *inits], [f"y{i}" for i in range(nout)], **(attrs or {}))
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(nout)]
    graph = helper.make_graph([node], name, ins, outs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return name, model.SerializeToString(), inputs


def cases(rng: np.random.Generator) -> list[tuple[str, bytes, dict]]:
    def f32(*shape, lo=None, hi=None):
        if lo is not None:
            return rng.uniform(lo, hi, shape).astype(np.float32)
        return (rng.standard_normal(shape) * 2).astype(np.float32)

    x = f32(ROWS, COLS)
    pos = f32(ROWS, COLS, lo=0.01, hi=10.0)
    row = f32(COLS)
    img = f32(*NCHW)
    out: list = []
    for op in ("Abs", "Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Softsign", "Softplus",
               "Elu", "Selu", "Celu", "Mish", "HardSigmoid", "HardSwish", "Sign", "Floor",
               "Round", "Sin", "Cos", "Atan", "Asinh", "ThresholdedRelu", "LeakyRelu",
               "IsNaN", "Shrink"):
        out.append(_case(op, op, {"x": x}))
    for op in ("Log", "Sqrt", "Reciprocal"):
        out.append(_case(op, op, {"x": pos}))
    out.append(_case("Gelu", "Gelu", {"x": x}))
    out.append(_case("Gelu tanh", "Gelu", {"x": x}, {"approximate": "tanh"}))
    out.append(_case("Clip", "Clip", {"x": x}, inits={"lo": np.float32(-1), "hi": np.float32(1)}))
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        out.append(_case(f"{op} row", op, {"a": x, "b": row}))
    out.append(_case("Pow 2", "Pow", {"a": pos}, inits={"e": np.float32(2.0)}))
    out.append(_case("Pow 0.5", "Pow", {"a": pos}, inits={"e": np.float32(0.5)}))
    out.append(_case("PRelu", "PRelu", {"a": x}, inits={"s": np.abs(row) * 0.1}))
    out.append(_case("Greater", "Greater", {"a": x, "b": row}))
    out.append(_case("Where", "Where", {"c": x > 0, "a": x, "b": pos}))
    for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ReduceLogSumExp"):
        out.append(_case(f"{op} -1", op, {"x": x}, inits={"axes": np.array([-1], np.int64)}))
    out.append(_case("ArgMax -1", "ArgMax", {"x": x}, {"axis": -1}))
    out.append(_case("Softmax -1", "Softmax", {"x": x}, {"axis": -1}))
    out.append(_case("LogSoftmax -1", "LogSoftmax", {"x": x}, {"axis": -1}))
    out.append(_case("LayerNorm", "LayerNormalization", {"x": x},
                     {"axis": -1, "epsilon": 1e-5}, inits={"g": row, "b": f32(COLS)}))
    out.append(_case("InstanceNorm", "InstanceNormalization", {"x": img},
                     inits={"g": f32(64), "b": f32(64)}))
    out.append(_case("BatchNorm", "BatchNormalization", {"x": img},
                     inits={"g": f32(64), "b": f32(64), "m": f32(64),
                            "v": f32(64, lo=0.5, hi=2.0)}))
    out.append(_case("MatMul 128x768x3072", "MatMul", {"a": f32(ROWS, 768)},
                     inits={"w": f32(768, COLS) * 0.05}))
    out.append(_case("MatMul batched 12x128x64x128", "MatMul",
                     {"a": f32(12, ROWS, 64), "b": f32(12, 64, ROWS)}))
    out.append(_case("Gemm 128x768x768", "Gemm", {"a": f32(ROWS, 768)},
                     {"transB": 1}, inits={"w": f32(768, 768) * 0.05, "c": f32(768)}))
    out.append(_case("Transpose 0213", "Transpose", {"x": f32(ROWS, 12, 64, 8)},
                     {"perm": [0, 2, 1, 3]}))
    out.append(_case("Concat -1", "Concat", {"a": x, "b": x}, {"axis": -1}))
    out.append(_case("Gather rows", "Gather",
                     {"t": f32(30522, 64), "i": rng.integers(0, 30522, (ROWS,))}, {"axis": 0}))
    out.append(_case("Cast f16", "Cast", {"x": x}, {"to": TensorProto.FLOAT16}))
    out.append(_case("CumSum -1", "CumSum", {"x": x}, inits={"a": np.array(-1, np.int64)}))
    out.append(_case("TopK 8", "TopK", {"x": x}, {"axis": -1},
                     inits={"k": np.array([8], np.int64)}, nout=2))
    out.append(_case("Expand", "Expand", {"x": row},
                     inits={"s": np.array([ROWS, COLS], np.int64)}))
    out.append(_case("Tile", "Tile", {"x": f32(ROWS, 768)},
                     inits={"r": np.array([1, 4], np.int64)}))
    out.append(_case("Pad reflect", "Pad", {"x": img},
                     {"mode": "reflect"}, inits={"p": np.array([0, 0, 2, 2, 0, 0, 2, 2],
                                                               np.int64)}))
    out.append(_case("Resize nearest x2", "Resize", {"x": img},
                     {"mode": "nearest"}, inits={"r": np.array([], np.float32),
                                                 "s": np.array([1, 1, 2, 2], np.float32)}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated case names or op types")
    p.add_argument("--json", default="", help="also write the rows here")
    a = p.parse_args(argv)

    from opwarden.cli.bench import fault_line, fault_summary, interleave, ours_session, peer_runner

    rng = np.random.default_rng(0)
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    rows = []
    for name, data, feeds in cases(rng):
        if only and name not in only and name.split()[0] not in only:
            continue
        ours = ours_session(data, a.threads)
        peer = peer_runner("onnxruntime", data, a.threads)
        res: dict = {}

        def run_ours(ours=ours, feeds=feeds, res=res):
            res["ours"] = ours.run(None, feeds)

        def run_ort(peer=peer, feeds=feeds, res=res):
            res["ort"] = peer(feeds)

        times = interleave({"ours": run_ours, "ort": run_ort}, a.runs, a.warmup)
        t_ours = statistics.median(times["ours"]) * 1e3
        t_ort = statistics.median(times["ort"]) * 1e3
        err = 0.0
        for u, v in zip(res["ours"], res["ort"]):
            u, v = np.asarray(u), np.asarray(v)
            if u.dtype.kind == "f" or v.dtype.kind == "f":
                d = np.abs(u.astype(np.float64) - v.astype(np.float64))
                scale = max(1.0, float(np.nanmax(np.abs(v.astype(np.float64)), initial=0.0)))
                err = max(err, float(np.nanmax(d, initial=0.0)) / scale)
            else:
                err = max(err, float(np.count_nonzero(u != v)))
        faults = fault_summary(ours)  # guard fallbacks: the time is then not the kernel's
        rows.append({"case": name, "ours_ms": t_ours, "ort_ms": t_ort,
                     "ratio": t_ours / t_ort, "rel_err": err, "faults": faults})
        print(f"  {name:32s} {t_ours:9.3f} {t_ort:9.3f} {t_ours / t_ort:8.2f}"
              + "".join(f"  FAULT {fault_line(f)}" for f in faults),
              file=sys.stderr)
    rows.sort(key=lambda r: -r["ratio"])
    print(f"{a.runs} alternated runs, {a.threads} threads each, float32, medians in ms")
    print("| case | ours ms | ORT ms | ours/ORT | max rel diff |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['ours_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} "
              f"| {r['rel_err']:.1e} |")
    ratios = [r["ratio"] for r in rows]
    if ratios:
        gm = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
        print(f"\ngeomean ours/ORT over {len(ratios)} cases: {gm:.2f}; "
              f"worst {rows[0]['case']} {rows[0]['ratio']:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
