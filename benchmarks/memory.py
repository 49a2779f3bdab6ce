"""Peak memory of one load+run, opwarden vs ONNX Runtime, each in a fresh process.

    python benchmarks/memory.py [--models resnet50 vgg19 densenet121] [--zoo DIR]

For each model and runtime a child process imports the runtime, records its RSS, loads the model
file, runs it once on seeded input, and reports peak RSS (VmHWM) minus RSS after imports. The
table prints both figures in MiB and the ratio ours / ORT (target of issue 4: <= 0.7).
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS: its threads stop busy-waiting ~0.4 ms after our last GEMM instead
# of ~0.1 s, so they do not steal the cores of the peer's run that follows (see
# opwarden/__init__.py; the peer's own spinning is turned off likewise).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys
def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
import numpy as np
runtime, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runtime == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
else:
    import opwarden
base = rss("VmRSS:")
if runtime == "ort":
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
else:
    s = opwarden.InferenceSession(path)
    inp = s.get_inputs()[0]
shape = [batch if not isinstance(d, int) else d for d in inp.shape]
x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
loaded = rss("VmRSS:")
s.run(None, {inp.name: x})
print(json.dumps({"base": base, "loaded": loaded - base, "peak": rss("VmHWM:") - base}))
"""


def measure(runtime: str, path: str, batch: int = 1) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, runtime, path, str(batch)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{runtime} on {path} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


DYNAMIC_CHILD = r"""
import sys
import numpy as np
import onnx
import opwarden
from opwarden import zoo
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
m = zoo.build(sys.argv[1])
for v in list(m.graph.input) + list(m.graph.output):
    v.type.tensor_type.shape.dim[0].dim_param = "N"
s = opwarden.InferenceSession(m.SerializeToString())
name = s.get_inputs()[0].name
shape = s.get_inputs()[0].shape
rng = np.random.default_rng(0)
marks = {}
for i in range(1, 201):
    n = (i - 1) % 50 + 1
    x = rng.standard_normal([n] + list(shape[1:])).astype(np.float32)
    s.run(None, {name: x})
    if i in (50, 100, 150, 200):
        marks[i] = rss()
print(marks[50], marks[100], marks[150], marks[200], s.memory.plans_built, s.memory.arena_bytes)
"""


def dynamic(model: str) -> None:
    """200 runs with batch sizes cycling 1..50: RSS must not grow after the first cycle."""
    out = subprocess.run(
        [sys.executable, "-c", DYNAMIC_CHILD, model], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    r50, r100, r150, r200, plans, arena = (int(v) for v in out.stdout.split()[-6:])
    mib = 1 << 20
    print(f"{model}: RSS after run 50 {r50 / mib:.1f} MiB, 100 {r100 / mib:.1f}, "
          f"150 {r150 / mib:.1f}, 200 {r200 / mib:.1f} MiB; run200/run50 = {r200 / r50:.3f}; "
          f"plans built {plans}, arena {arena / mib:.1f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", nargs="*", default=["resnet50", "vgg19", "densenet121"])
    p.add_argument("--zoo", default=os.path.join(os.path.dirname(__file__), "zoo"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--dynamic", metavar="MODEL", help="the 200-run dynamic batch check instead")
    a = p.parse_args()
    if a.dynamic:
        dynamic(a.dynamic)
        return
    from opwarden import zoo

    os.makedirs(a.zoo, exist_ok=True)
    rows = []
    mib = 1 << 20
    for name in a.models:
        path = os.path.join(a.zoo, f"{name}.onnx")
        if not os.path.exists(path):
            import onnx

            onnx.save(zoo.build(name), path)
        ours, ort = measure("opwarden", path), measure("ort", path)
        rows.append({
            "model": name,
            "file_mib": os.path.getsize(path) / mib,
            "opwarden_peak_mib": ours["peak"] / mib,
            "ort_peak_mib": ort["peak"] / mib,
            "ratio": ours["peak"] / ort["peak"],
        })
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'model':<14}{'file MiB':>10}{'opwarden MiB':>14}{'ORT MiB':>10}{'ratio':>8}")
    for r in rows:
        print(f"{r['model']:<14}{r['file_mib']:>10.1f}{r['opwarden_peak_mib']:>14.1f}"
              f"{r['ort_peak_mib']:>10.1f}{r['ratio']:>8.2f}")


if __name__ == "__main__":
    main()
