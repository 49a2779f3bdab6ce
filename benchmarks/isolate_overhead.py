"""Per-call cost of running a custom kernel isolated (SessionOptions.isolate) vs in-process.

    python benchmarks/isolate_overhead.py [--calls N]

One-node models of a custom Relu-like operator on a tiny input (1x1000 float32, 4 KB) and a
medium one (512x512 float32, 1 MiB); each model in two sessions (in-process, isolated), calls
interleaved, medians over N session runs. The isolated call adds the copies into and out of
shared memory and a pipe round trip to the worker process.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto, helper

import opwarden as ow


@ow.op("BenchRelu", domain="bench.isolate", inputs=["X: T"], outputs=["Y: T"],
       types={"T": ["float32"]})
def BenchRelu(X):
    return np.maximum(X, 0)


@BenchRelu.kernel(name="benchrelu.cpu.fast", priority=10)
def _fast(X):
    return np.maximum(X, np.float32(0))


def _model(shape: list[int]) -> bytes:
    node = helper.make_node("BenchRelu", ["x"], ["y"], name="relu", domain="bench.isolate")
    graph = helper.make_graph(
        [node], "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("bench.isolate", 1)])
    return m.SerializeToString()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    cases = {"tiny 1x1000 f32 (4 KB)": [1, 1000], "medium 512x512 f32 (1 MiB)": [512, 512]}
    print(f"median of {a.calls} interleaved session runs per case")
    for label, shape in cases.items():
        data = _model(shape)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        sessions = {
            "in-process": ow.InferenceSession(data),
            "isolated": ow.InferenceSession(data, isolate=["benchrelu.cpu.fast"]),
        }
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for s in sessions.values():
            for _ in range(20):  # warm-up (the worker is forked at the first call)
                s.run(None, {"x": x})
        for _ in range(a.calls):
            for k, s in sessions.items():
                t0 = time.perf_counter()
                s.run(None, {"x": x})
                times[k].append(time.perf_counter() - t0)
        base = float(np.median(times["in-process"]))
        iso = float(np.median(times["isolated"]))
        print(f"  {label}")
        print(f"    in-process {base * 1e6:8.1f} us/call")
        print(f"    isolated   {iso * 1e6:8.1f} us/call   x{iso / base:5.2f}  "
              f"(+{(iso - base) * 1e6:.1f} us per call)")
        for s in sessions.values():
            s.close()


if __name__ == "__main__":
    main()
