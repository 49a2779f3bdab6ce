"""One row of the family table: build (or load) a case, check opwarden against ONNX Runtime,
then time both alternated in this process.

Correctness follows the light-zoo test (tests/test_zoo.py): an output agrees when
max|ours - ort| <= rel * max|ort| + 1e-5, with rel = 1e-3 for float32 models and trees, and
1e-2 for quantized and fp16 models (as benchmarks/export_real.py judges its quantized
variants: a one-ulp float difference before a QuantizeLinear, or an fp16 rounding of an
intermediate, moves a value by a whole step). Integer outputs (tree labels) must be equal.

Quantized and fp16 models flip whole quantization steps (or fp16 ulps) between any two correct
implementations, and those flips compound through the layers: ONNX Runtime's own outputs with
all graph optimizations and with none differ by one output quantization step on the QDQ
ResNet-50 (0.18 with logits near 18) and by 0.036 on the dynamic-quantized BERT's pooler.
For these kinds an output's tolerance is never below 1.5x that ORT-vs-ORT gap: which ties
flip also moves with the thread count (ours on BERT-qdyn: max error 0.082 at default threads,
0.091 at 2, against ORT's own 0.086, with mean errors all 0.0148), so ours agrees when it is
about as far from ORT as ORT is from itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from families.base import Case, missing_modules, model_bytes, spread

REL_TOL = {"f32": 1e-3, "tree": 1e-3, "quant": 1e-2, "fp16": 1e-2}
GAP_SLACK = 1.5


def _err(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


def compare(got: list[Any], want: list[Any], kind: str,
            floor: list[float] | None = None) -> dict[str, Any]:
    """Ours against ORT's outputs: the float output nearest its tolerance (max abs error and
    that tolerance), and whether every output agrees (with what differs when one does not).
    `floor[k]`: ORT's gap to itself on output k; the tolerance is at least GAP_SLACK times it."""
    rel = REL_TOL[kind]
    res: dict[str, Any] = {"max_abs_err": None, "tol": None, "agree": True, "detail": ""}
    if len(got) != len(want):
        return {**res, "agree": False, "detail": f"{len(got)} outputs, ORT has {len(want)}"}
    worst = -1.0
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return {**res, "agree": False,
                    "detail": f"output {k}: {g.dtype}{g.shape}, ORT {w.dtype}{w.shape}"}
        if w.size == 0:
            continue
        if w.dtype.kind in "iub":
            bad = int(np.count_nonzero(g != w))
            if bad:
                res.update(agree=False, detail=f"output {k}: {bad} of {w.size} integers differ")
            continue
        err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
        if not np.isfinite(err) and np.array_equal(np.isnan(g), np.isnan(w)):
            err = 0.0  # NaN where ORT has NaN
        tol = rel * float(np.max(np.abs(w)))
        if floor is not None and np.isfinite(floor[k]):
            tol = max(tol, floor[k] * GAP_SLACK)
        tol += 1e-5
        if not err <= tol:
            res.update(agree=False, detail=f"output {k}: max err {err:.3g} > tol {tol:.3g}")
        if not err / tol <= worst:
            worst = err / tol if np.isfinite(err) else float("inf")
            res.update(max_abs_err=err, tol=tol)
    return res


def ort_self_gap(data: bytes, feeds: Any, want: list[Any], threads: int) -> list[float]:
    """Per output, max |ORT with all graph optimizations - ORT with none| (NaN if not float)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    plain = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    gaps = []
    for a, b in zip(want, plain):
        a, b = np.asarray(a), np.asarray(b)
        ok = a.shape == b.shape and a.size and a.dtype.kind == "f"
        gaps.append(float(np.max(np.abs(a.astype(np.float64) - b))) if ok else float("nan"))
    return gaps


def _timed(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def run_case(case: Case, batch: int, *, runs: int, warmup: int, threads: int,
             budget_s: float, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, check and time one case at one batch size; failures become the row's status."""
    from opwarden.cli.bench import fault_summary, interleave, ours_session, peer_runner, summarize

    row: dict[str, Any] = {"model": case.name, "family": case.family, "batch": batch,
                           "kind": case.kind, "note": case.note, "status": "ok"}
    missing = missing_modules(case)
    if missing:
        return {**row, "status": "skipped", "error": f"not installed: {', '.join(missing)}"}
    try:
        data, info = model_bytes(case, log)
    except Exception as e:  # a builder failure is a row of the table, not the end of the run
        return {**row, "status": "build failed", "error": _err(e)}
    row.update(info, size_mb=round(len(data) / 2**20, 1))
    feeds = case.feeds(batch, 0)
    try:
        ort = peer_runner("onnxruntime", data, threads)
        want = ort(feeds)
        row["spread"] = spread(want[0] if batch > 1 else ort(case.feeds(2, 7))[0])
        floor = ort_self_gap(data, feeds, want, threads) if case.kind in ("quant", "fp16") else None
        row["ort_self_gap"] = floor
    except Exception as e:
        return {**row, "status": "ORT failed", "error": _err(e)}
    t0 = time.perf_counter()
    try:
        sess = ours_session(data, threads)
    except Exception as e:
        return {**row, "status": "opwarden load failed", "error": _err(e)}
    row["load_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    try:
        t_ours = _timed(lambda: sess.run(None, feeds))  # the first run also compiles
        got = sess.run(None, feeds)
    except Exception as e:
        return {**row, "status": "opwarden run failed", "error": _err(e)}
    row.update(compare(got, want, case.kind, floor))
    round_s = t_ours + _timed(lambda: ort(feeds))
    n = max(1, min(runs, int(budget_s / max(round_s, 1e-9))))
    try:
        times = interleave({"ours": partial(sess.run, None, feeds), "ort": partial(ort, feeds)},
                           n, max(0, warmup - 1))
    except Exception as e:
        return {**row, "status": "opwarden run failed", "error": _err(e)}
    row.update(runs=n, ours=summarize(times["ours"]), ort=summarize(times["ort"]),
               faults=fault_summary(sess))
    row["ours_over_ort"] = round(row["ours"]["median_ms"] / row["ort"]["median_ms"], 4)
    return row
