"""Tree ensembles: opwarden against onnxruntime on sklearn forests, 1k-row batches, 2 threads
each, ORT's spinning off; opwarden's compiled path (opwarden.native) and its NumPy fallback
(the same script rerun in a child process with OPWARDEN_NATIVE=0).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/trees.py [--rounds 5]

Prints per model the median ms of each and the ratios ours/ORT. The models are fitted on
seeded random data on every run (a few seconds), nothing is downloaded or cached.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

THREADS = 2
ROWS = 1000
FEATURES = 20


def build_models(folder: Path) -> list[str]:
    """Fit the sklearn forests and save them as ONNX (ai.onnx.ml opset 3); their names."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn import ensemble as E

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, FEATURES)).astype(np.float32)
    y = x[:, 0] * 2 + np.sin(3 * x[:, 1]) + 0.1 * rng.standard_normal(4000)
    labels = (x[:, 0] > 0).astype(int) + (x[:, 2] > 0.5).astype(int)
    seed = {"random_state": 0}
    models = {
        "rf_reg_100_d12": E.RandomForestRegressor(n_estimators=100, max_depth=12, **seed),
        "gb_reg_500_d6": E.GradientBoostingRegressor(n_estimators=500, max_depth=6, **seed),
        "et_reg_300_d10": E.ExtraTreesRegressor(n_estimators=300, max_depth=10, **seed),
        "rf_clf3_200_d10": E.RandomForestClassifier(n_estimators=200, max_depth=10, **seed),
        "gb_clf2_300_d5": E.GradientBoostingClassifier(n_estimators=300, max_depth=5, **seed),
    }
    targets = {"rf_clf3_200_d10": labels, "gb_clf2_300_d5": labels > 0}
    for name, m in models.items():
        m.fit(x, targets.get(name, y))
    for name, m in models.items():
        opts = {id(m): {"zipmap": False}} if hasattr(m, "classes_") else None
        onx = to_onnx(m, initial_types=[("X", FloatTensorType([None, FEATURES]))],
                      options=opts, target_opset={"": 17, "ai.onnx.ml": 3})
        (folder / f"{name}.onnx").write_bytes(onx.SerializeToString())
    return list(models)


def _median_ms(fn, rounds: int, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t) / reps * 1e3)
    return statistics.median(times)


def measure(folder: Path, names: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Per model {ours, ort} median ms, the two alternated round by round."""
    import onnxruntime as ort

    import opwarden

    x = np.random.default_rng(1).standard_normal((ROWS, FEATURES)).astype(np.float32)
    out = {}
    for name in names:
        blob = (folder / f"{name}.onnx").read_bytes()
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        theirs = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        ours = opwarden.InferenceSession(
            blob, opwarden.SessionOptions(intra_op_num_threads=THREADS))
        a, b = [], []
        for _ in range(rounds):
            a.append(_median_ms(lambda s=ours: s.run(None, {"X": x}), 1))
            b.append(_median_ms(lambda s=theirs: s.run(None, {"X": x}), 1))
        out[name] = {"ours": statistics.median(a), "ort": statistics.median(b)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # folder of built models: measure only
    args = ap.parse_args()
    if args.child:
        folder = Path(args.child)
        names = sorted(p.stem for p in folder.glob("*.onnx"))
        print(json.dumps(measure(folder, names, args.rounds)))
        return 0
    from opwarden import native

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        names = sorted(build_models(folder))
        env = dict(os.environ, OPWARDEN_NATIVE="0")
        child = subprocess.run([sys.executable, __file__, "--child", tmp, "--rounds",
                                str(args.rounds)], env=env, capture_output=True, text=True,
                               check=True)
        before = json.loads(child.stdout.strip().splitlines()[-1])
        after = measure(folder, names, args.rounds)
    print(f"kernel path: {native.status()['reason']}; {ROWS} rows, {THREADS} threads each, "
          f"median of {args.rounds} rounds")
    print(f"{'model':18s} {'ORT ms':>8s} {'NumPy ms':>9s} {'ratio':>7s} {'native ms':>10s} "
          f"{'ratio':>7s}")
    ratios_b, ratios_a = [], []
    for name in names:
        b, a = before[name], after[name]
        rb, ra = b["ours"] / b["ort"], a["ours"] / a["ort"]
        ratios_b.append(rb)
        ratios_a.append(ra)
        print(f"{name:18s} {a['ort']:8.2f} {b['ours']:9.1f} {rb:6.1f}x {a['ours']:10.2f} "
              f"{ra:6.2f}x")
    gm = lambda v: float(np.exp(np.mean(np.log(v))))  # noqa: E731
    print(f"{'geomean':18s} {'':8s} {'':9s} {gm(ratios_b):6.1f}x {'':10s} {gm(ratios_a):6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
