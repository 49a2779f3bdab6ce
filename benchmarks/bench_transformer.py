"""A BERT-style encoder, opwarden vs ONNX Runtime side by side in one process.

    python benchmarks/bench_transformer.py [--layers 2] [--hidden 768] [--heads 12] [--seq 128]
                                           [--batch 1] [--runs 11] [--threads 2] [--opset 17]
                                           [--save PATH] [--json PATH]

The light zoo is nine CNNs; this is the other model family users bring. The encoder is built
here with onnx.helper and seeded random weights, in the op patterns the PyTorch exporter emits
for a BERT layer: MatMul + Add projections, Reshape/Transpose into heads, Q K^T scaled by a Div,
an additive mask, Softmax, the context MatMul and its Transpose/Reshape back, residual Adds,
LayerNormalization (opset 17; opset < 17 decomposes it into ReduceMean/Sub/Pow/Sqrt/Div) and the
exact Gelu written as x * 0.5 * (1 + Erf(x / sqrt 2)). Defaults: BERT-base widths (768, 12
heads, FFN 3072) at sequence 128, two layers (a layer's time is what matters; 12 layers only
take 6x longer).

Runs alternate (ours, ORT, ours, ...) after warm-up, 2 intra-op threads each, ORT's spinning
off; the report gives medians, the ratio ours/ORT and the largest output difference. `--save`
writes the model, e.g. for ``opwarden bench PATH --vs onnxruntime`` (per-op-type table).
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS (see bench_zoo.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import json
import math
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opwarden.cli.bench import (  # noqa: E402
    fault_line,
    fault_summary,
    interleave,
    max_abs_diff,
    ours_session,
    peer_runner,
    summarize,
)


class GraphBuilder:
    """Nodes and initializers of one graph, with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], scale: float) -> str:
        return self.const(base, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], base: str | None = None, **attrs) -> str:
        out = self.name(base or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _linear(b: GraphBuilder, x: str, d_in: int, d_out: int) -> str:
    w = b.weight("w", (d_in, d_out), 1.0 / math.sqrt(d_in))
    bias = b.weight("b", (d_out,), 0.02)
    return b.op("Add", [b.op("MatMul", [x, w]), bias])


def _layernorm(b: GraphBuilder, x: str, d: int, opset: int) -> str:
    gamma = b.const("gamma", (1.0 + 0.1 * b.rng.standard_normal(d)).astype(np.float32))
    beta = b.weight("beta", (d,), 0.1)
    if opset >= 17:
        return b.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)
    # The pre-17 export: (x - mean) / sqrt(var + eps) * gamma + beta.
    axes = {"axes": [-1]} if opset < 18 else {}
    mean = b.op("ReduceMean", [x], **axes)
    dev = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [dev, b.const("two", np.float32(2.0))])], **axes)
    std = b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.float32(1e-12))])])
    return b.op("Add", [b.op("Mul", [b.op("Div", [dev, std]), gamma]), beta])


def _heads(b: GraphBuilder, x: str, batch: int, seq: int, heads: int, dh: int, perm) -> str:
    shape = b.const("shape", np.array([batch, seq, heads, dh], np.int64))
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=perm)


def build_encoder(layers: int = 2, hidden: int = 768, heads: int = 12, seq: int = 128,
                  batch: int = 1, opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """The encoder: inputs `x` (batch, seq, hidden) float32 and `mask` (batch, seq) float32
    (1 = attend, 0 = padding); output `y` (batch, seq, hidden)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} must be a multiple of heads {heads}")
    b = GraphBuilder(np.random.default_rng(seed))
    dh = hidden // heads
    # The additive mask, (batch, 1, 1, seq): 0 where attended, -10000 where padded.
    m4 = b.op("Unsqueeze", ["mask", b.const("axes", np.array([1, 2], np.int64))])
    bias = b.op("Mul", [b.op("Sub", [b.const("one", np.float32(1.0)), m4]),
                        b.const("neg", np.float32(-10000.0))])
    x = "x"
    for _ in range(layers):
        q = _heads(b, _linear(b, x, hidden, hidden), batch, seq, heads, dh, [0, 2, 1, 3])
        k = _heads(b, _linear(b, x, hidden, hidden), batch, seq, heads, dh, [0, 2, 3, 1])
        v = _heads(b, _linear(b, x, hidden, hidden), batch, seq, heads, dh, [0, 2, 1, 3])
        scale = b.const("sqrt_dh", np.float32(math.sqrt(dh)))
        scores = b.op("Div", [b.op("MatMul", [q, k]), scale])
        probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, b.const("shape", np.array([batch, seq, hidden], np.int64))])
        x = _layernorm(b, b.op("Add", [_linear(b, ctx, hidden, hidden), x]), hidden, opset)
        h = _linear(b, x, hidden, 4 * hidden)
        erf = b.op("Erf", [b.op("Div", [h, b.const("sqrt2", np.float32(math.sqrt(2.0)))])])
        gelu = b.op("Mul", [b.op("Mul", [h, b.op("Add", [erf, b.const("one", np.float32(1.0))])]),
                            b.const("half", np.float32(0.5))])
        x = _layernorm(b, b.op("Add", [_linear(b, gelu, 4 * hidden, hidden), x]), hidden, opset)
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    graph = helper.make_graph(
        b.nodes, "bert_encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds(batch: int, seq: int, hidden: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded inputs: activations ~ N(0, 1), the last eighth of each sequence padded."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.float32)
    mask[:, seq - seq // 8:] = 0
    return {"x": rng.standard_normal((batch, seq, hidden)).astype(np.float32), "mask": mask}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save", metavar="PATH", help="write the model here")
    p.add_argument("--json", metavar="PATH", help="write the result here")
    a = p.parse_args(argv)
    model = build_encoder(a.layers, a.hidden, a.heads, a.seq, a.batch, a.opset)
    data = model.SerializeToString()
    if a.save:
        with open(a.save, "wb") as f:
            f.write(data)
    sess = ours_session(data, a.threads, None)
    ort = peer_runner("onnxruntime", data, a.threads)
    fd = feeds(a.batch, a.seq, a.hidden)
    times = interleave({"ours": lambda: sess.run(None, fd), "ort": lambda: ort(fd)}, a.runs,
                       a.warmup)
    diff = max_abs_diff(sess.run(None, fd), ort(fd))
    so, sp = summarize(times["ours"]), summarize(times["ort"])
    ratio = so["median_ms"] / sp["median_ms"]
    print(f"BERT-style encoder: {a.layers} layer(s), hidden {a.hidden}, {a.heads} heads, "
          f"sequence {a.seq}, batch {a.batch}, opset {a.opset}; {a.runs} alternated runs after "
          f"{a.warmup} warm-up, {a.threads} threads each")
    print(f"ours {so['median_ms']:.2f} ms (IQR {so['iqr_ms']:.2f}), ONNX Runtime "
          f"{sp['median_ms']:.2f} ms (IQR {sp['iqr_ms']:.2f}), ours/ORT {ratio:.2f}, "
          f"max |ours - ORT| {diff:.2e}")
    faults = fault_summary(sess)
    for f in faults:  # the guard reran these nodes on the reference kernel: a bug to report
        print(f"FAULT {fault_line(f)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "ours": so, "ort": sp, "ratio": ratio,
                       "max_abs_diff": diff, "faults": faults}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
