"""Quantized models, opwarden vs ONNX Runtime side by side in one process.

    python benchmarks/quantized.py [--models qdq_resnet50,dyn_bert] [--runs 7] [--threads 2]
                                   [--layers 2] [--seq 128] [--disable qdq_fusion] [--json PATH]

Two models, the forms onnxruntime.quantization writes:
- qdq_resnet50: the light zoo's ResNet-50 (seeded weights, calibrated BatchNorm) through
  quantize_static in QDQ format (per-channel int8 weights, uint8 activations, MinMax over four
  seeded calibration batches);
- dyn_bert: the BERT-base-width encoder of bench_transformer.py (`--layers`, sequence
  `--seq`) through quantize_dynamic (int8 weights: DynamicQuantizeLinear + MatMulInteger on
  every MatMul with a constant weight).

Both are built offline and cached under ~/.cache/opwarden-bench (never committed). Runs
alternate (ours, ORT, ours, ...) after warm-up, 2 intra-op threads each, ORT's spinning off;
the report gives medians, the ratio ours/ORT and the largest output difference. `--disable`
names passes to switch off (e.g. qdq_fusion, to see what the fusion buys). Unset
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for this command on the benchmark machine.
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS (see bench_zoo.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import hashlib
import json
import sys
import tempfile

import numpy as np
import onnx
import onnx.version_converter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_transformer import build_encoder, feeds  # noqa: E402

from opwarden import zoo  # noqa: E402
from opwarden.cli.bench import (  # noqa: E402
    fault_line,
    fault_summary,
    interleave,
    max_abs_diff,
    ours_session,
    peer_runner,
    summarize,
)

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "opwarden-bench")


def _cached(key: str, build) -> bytes:
    """The model bytes cached under `key` (built and written on a miss)."""
    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"{key}.onnx")
    if not os.path.exists(path):
        data = build()
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    with open(path, "rb") as f:
        return f.read()


def qdq_resnet50() -> tuple[bytes, dict[str, np.ndarray]]:
    """The light ResNet-50 quantized to QDQ, and a seeded feed."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    base = zoo.build("resnet50")
    # The zoo file is IR 3 (initializers listed as inputs, partly): the quantizer's opset
    # converter needs a modern graph, so the initializers leave the inputs.
    inits = {t.name for t in base.graph.initializer}
    keep = [i for i in base.graph.input if i.name not in inits]
    del base.graph.input[:]
    base.graph.input.extend(keep)
    base.ir_version = 7
    # Per-channel DequantizeLinear needs opset 13 (the quantizer writes `axis` at any opset).
    base = onnx.version_converter.convert_version(base, 13)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([zoo.feeds_for(base, seed=100 + i) for i in range(4)])

        def get_next(self):
            return next(self.it, None)

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "q.onnx")
            onnx.save(base, src)
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            with open(dst, "rb") as f:
                return f.read()

    return _cached("qdq_resnet50", build), zoo.feeds_for(base, seed=1)


def dyn_bert(layers: int, seq: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """The BERT-base-width encoder quantized with quantize_dynamic, and a seeded feed."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "q.onnx")
            onnx.save(build_encoder(layers, 768, 12, seq), src)
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"])
            with open(dst, "rb") as f:
                return f.read()

    key = "dyn_bert_" + hashlib.sha1(f"{layers},{seq}".encode()).hexdigest()[:8]
    return _cached(key, build), feeds(1, seq, 768)


def measure(name: str, data: bytes, fd, a) -> dict:
    """Alternated runs of one model: medians, ratio, largest difference, faults."""
    opts = {"disabled_passes": a.disable} if a.disable else {}
    sess = ours_session(data, a.threads, None, **opts)
    ort = peer_runner("onnxruntime", data, a.threads)
    times = interleave({"ours": lambda: sess.run(None, fd), "ort": lambda: ort(fd)}, a.runs,
                       a.warmup)
    diff = max_abs_diff(sess.run(None, fd), ort(fd))
    so, sp = summarize(times["ours"]), summarize(times["ort"])
    ratio = so["median_ms"] / sp["median_ms"]
    print(f"{name}: ours {so['median_ms']:.2f} ms (IQR {so['iqr_ms']:.2f}), ONNX Runtime "
          f"{sp['median_ms']:.2f} ms (IQR {sp['iqr_ms']:.2f}), ours/ORT {ratio:.2f}, "
          f"max |ours - ORT| {diff:.2e}", flush=True)
    faults = fault_summary(sess)
    for f in faults:  # the guard reran these nodes on the reference kernel: a bug to report
        print(f"FAULT {fault_line(f)}")
    return {"ours": so, "ort": sp, "ratio": ratio, "max_abs_diff": diff, "faults": faults}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qdq_resnet50,dyn_bert")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2, help="dyn_bert's encoder layers")
    p.add_argument("--seq", type=int, default=128, help="dyn_bert's sequence length")
    p.add_argument("--disable", type=lambda s: [x for x in s.split(",") if x], default=[],
                   help="comma-separated passes to switch off in our session")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    a = p.parse_args(argv)
    builders = {"qdq_resnet50": qdq_resnet50, "dyn_bert": lambda: dyn_bert(a.layers, a.seq)}
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in builders]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {sorted(builders)}")
    print(f"{a.runs} alternated runs after {a.warmup} warm-up, {a.threads} threads each, "
          f"ORT's spinning off")
    out = {}
    for name in names:
        data, fd = builders[name]()
        out[name] = measure(name, data, fd, a)
    ratios = [r["ratio"] for r in out.values()]
    if len(ratios) > 1:
        print(f"geomean ours/ORT {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
