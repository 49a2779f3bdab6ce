"""Per-node dispatch overhead: a chain of tiny Add/Relu/Mul nodes, ours vs ONNX Runtime.

    python benchmarks/dispatch.py [--nodes 600] [--runs 200] [--threads 2] [--json PATH]

The model is one (1, 16) float32 tensor pushed through NODES nodes cycling Add(c), Relu, Mul(c),
so the kernels cost next to nothing and the time is the runtime's own overhead. ONNX Runtime runs
with its graph optimizations disabled (ORT_DISABLE_ALL), so it executes every node too; ours runs
at optimization_level=0 for the same reason (and, for information, with every pass on, where a
fusion pass may collapse the chain). All runners alternate in one process. Reported: median run
time / NODES (µs per node, the issue's measure) and the slope between a NODES-node chain and a
NODES/10-node chain (per-node cost without the fixed per-run cost). A bare NumPy loop of the same
ufunc calls with out= is the floor.
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS: its threads stop busy-waiting ~0.4 ms after our last GEMM instead
# of ~0.1 s, so they do not steal the cores of the peer's run that follows (see
# opwarden/__init__.py; the peer's own spinning is turned off likewise).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opwarden.cli.bench import interleave, ours_session  # noqa: E402

WIDTH = 16


def chain_model(nodes: int, width: int = WIDTH, opset: int = 17) -> onnx.ModelProto:
    """x -> Add(c) -> Relu -> Mul(c) -> Add(c) -> ... (`nodes` nodes) -> y."""
    add_c = numpy_helper.from_array(np.full(width, 0.01, np.float32), "add_c")
    mul_c = numpy_helper.from_array(np.full(width, 0.99, np.float32), "mul_c")
    body, prev = [], "x"
    for i in range(nodes):
        out = "y" if i == nodes - 1 else f"t{i}"
        kind = i % 3
        if kind == 0:
            body.append(helper.make_node("Add", [prev, "add_c"], [out], name=f"add{i}"))
        elif kind == 1:
            body.append(helper.make_node("Relu", [prev], [out], name=f"relu{i}"))
        else:
            body.append(helper.make_node("Mul", [prev, "mul_c"], [out], name=f"mul{i}"))
        prev = out
    graph = helper.make_graph(
        body,
        f"chain{nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        initializer=[add_c, mul_c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def numpy_floor(nodes: int, width: int = WIDTH) -> Callable[[np.ndarray], np.ndarray]:
    """The same chain as bare NumPy ufunc calls into preallocated buffers (the floor)."""
    add_c = np.full(width, 0.01, np.float32)
    mul_c = np.full(width, 0.99, np.float32)
    bufs = [np.empty((1, width), np.float32) for _ in range(2)]
    calls = []
    for i in range(nodes):
        kind = i % 3
        if kind == 0:
            calls.append((np.add, add_c))
        elif kind == 1:
            calls.append((np.maximum, np.float32(0)))
        else:
            calls.append((np.multiply, mul_c))

    def run(x: np.ndarray) -> np.ndarray:
        cur = x
        for i, (f, c) in enumerate(calls):
            out = bufs[i & 1]
            f(cur, c, out=out)
            cur = out
        return cur

    return run


def ort_runner(data: bytes, threads: int) -> Callable[[dict[str, Any]], Any]:
    """ONNX Runtime with every graph optimization off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return lambda feeds: s.run(None, feeds)


def measure(nodes: int = 600, runs: int = 200, warmup: int = 20, threads: int = 2) -> dict:
    """µs per node for every runner on a `nodes` chain and the slope against nodes // 10."""
    short = max(nodes // 10, 1)
    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    feeds = {"x": x}
    runners: dict[str, Callable[[], Any]] = {}
    configs = {
        "onnxruntime (ORT_DISABLE_ALL)": None,
        "opwarden (optimization_level=0)": {"optimization_level": 0},
        "opwarden (optimization_level=0, checks off)": {"optimization_level": 0, "checks": ()},
        "opwarden (default options, all passes)": {},
    }
    expect = None
    for n in (nodes, short):
        data = chain_model(n).SerializeToString()
        for name, opts in configs.items():
            if opts is None:
                f = ort_runner(data, threads)
            else:
                s = ours_session(data, threads, **opts)
                f = partial(s.run, None)
            if n == nodes:
                got = f(feeds)[0]
                expect = got if expect is None else expect
                np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6, err_msg=name)
            runners[f"{name}|{n}"] = partial(f, feeds)
        runners[f"numpy ufunc loop (floor)|{n}"] = partial(numpy_floor(n), x)
    times = interleave(runners, runs, warmup)
    rows = []
    for name in [*configs, "numpy ufunc loop (floor)"]:
        t_long = float(np.median(times[f"{name}|{nodes}"])) * 1e6
        t_short = float(np.median(times[f"{name}|{short}"])) * 1e6
        rows.append(
            {
                "runner": name,
                "run_us": round(t_long, 2),
                "us_per_node": round(t_long / nodes, 3),
                "slope_us_per_node": round((t_long - t_short) / (nodes - short), 3)
                if nodes > short
                else None,
            }
        )
    return {"nodes": nodes, "short_nodes": short, "runs": runs, "threads": threads, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=600)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    a = p.parse_args()
    res = measure(a.nodes, a.runs, a.warmup, a.threads)
    print(
        f"{a.nodes}-node Add/Relu/Mul chain, (1, {WIDTH}) float32, median of {a.runs} "
        f"alternated runs, {a.threads} threads\n"
    )
    print("| runner | run µs | µs/node | slope µs/node |")
    print("|---|---:|---:|---:|")
    for r in res["rows"]:
        slope = "" if r["slope_us_per_node"] is None else f"{r['slope_us_per_node']:.3f}"
        print(f"| {r['runner']} | {r['run_us']:.0f} | {r['us_per_node']:.3f} | {slope} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
