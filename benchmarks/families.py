"""The family benchmark: opwarden vs ONNX Runtime on real-width models of every family.

    python benchmarks/families.py [--families cnn,bert] [--batch 1,8,32] [--runs 5]
                                  [--threads 2] [--budget-s 90] [--smoke] [--json PATH]

Families: cnn (timm ResNet-50 at batch 1 and 8, EfficientNet-B0, MobileNetV3-large,
ConvNeXt-T, RegNetY-1.6GF), vit (ViT-S/16), bert (BERT-base and DistilBERT, seq 128, padded
mask), decoder (a GPT-2-small decode step with a KV cache), encoder (Whisper-base encoder,
wav2vec2-base, T5-small encoder), trees (scikit-learn random forest and gradient boosting,
LightGBM, XGBoost on 1k rows), quant (ORT quantize_dynamic BERT-base, quantize_static QDQ
ResNet-50 with uint8 and with int8 activations), fp16 (float16-converted ResNet-50 and
BERT-base). `--batch` adds the batch family: ResNet-50 and BERT-base at each listed batch,
with each ratio relative to its batch-1 ratio.

Every model is built from a config with seeded random weights, no download (builders in
benchmarks/families/), and cached under ~/.cache/opwarden/families/. Per model: build, check
opwarden's outputs against ORT's (zoo tolerance, see families/runner.py), warm both, then
alternate rounds ours/ORT, 2 intra-op threads each (ORT: inter-op 1, spinning off). A model
whose round takes long gets fewer runs (--budget-s per model; the table shows the count).
Rows: median ms, ours/ORT, the worst error against its tolerance, the output's spread across
a batch (0 would mean a constant model). Then per-family geomeans and the all-family geomean.

--smoke: tiny onnx.helper/scikit-learn versions of each family, 1 run, only what the
installed packages can build (the rest is skipped with the reason). For CI.

Benchmark on this machine with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for the command
(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/families.py ...); the JSON
records which OpenBLAS kernel ran (threadpoolctl).
"""

from __future__ import annotations

import os

# Before NumPy loads OpenBLAS (as in bench_zoo.py): its idle threads stop spinning soon after
# our last GEMM, so they do not steal the cores of ORT's run that follows.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (HERE, os.path.dirname(HERE)) if p not in sys.path]

from families import CASES, FAMILIES, OPT_IN  # noqa: E402
from families.runner import run_case  # noqa: E402

BATCH_MODELS = ("resnet50", "bert_base")
SMOKE_BATCH_MODELS = ("tiny_cnn", "tiny_bert")


def geomean(xs: list[float]) -> float | None:
    """Geometric mean of the positive values (None for none)."""
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def plan(families: list[str], smoke: bool, batches: list[int] | None) -> list[tuple]:
    """(case, batch, family label) for each row, families in the order given."""
    rows = []
    for fam in families:
        if fam == "batch":
            continue
        rows += [(c, b, fam) for c in CASES.values()
                 if c.family == fam and c.smoke == smoke for b in c.batches]
    if batches:
        for name in SMOKE_BATCH_MODELS if smoke else BATCH_MODELS:
            rows += [(CASES[name], b, "batch") for b in batches]
    return rows


def summarize_families(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-family geomeans of ours/ORT (timed rows only), their geomean, and the geomean over
    every timed row; the batch family's ratios relative to batch 1 are set on its rows."""
    fams: dict[str, list[float]] = {}
    for r in rows:
        if "ours_over_ort" in r:
            fams.setdefault(r["group"], []).append(r["ours_over_ort"])
    per = {f: geomean(v) for f, v in fams.items()}
    base = {r["model"]: r["ours_over_ort"] for r in rows
            if r["group"] == "batch" and r["batch"] == 1 and "ours_over_ort" in r}
    for r in rows:
        if r["group"] == "batch" and r["model"] in base and "ours_over_ort" in r:
            r["vs_batch1"] = round(r["ours_over_ort"] / base[r["model"]], 3)
    timed = [r["ours_over_ort"] for r in rows if "ours_over_ort" in r and r["group"] != "batch"]
    return {"families": per,
            "all_families": geomean([v for f, v in per.items() if f != "batch" and v]),
            "all_models": geomean(timed)}


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the BLAS libraries loaded (which OpenBLAS kernel runs)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keys = ("internal_api", "version", "architecture", "num_threads", "threading_layer")
    return [{k: i.get(k) for k in keys} for i in threadpool_info() if i.get("user_api") == "blas"]


def print_table(res: dict[str, Any]) -> None:
    """The rich table: one row per model, a geomean row closing each family."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Families: opwarden vs ONNX Runtime, {res['threads']} threads each, "
                    f"up to {res['runs']} alternated runs (ORT spinning off)")
    for col in ("family", "model", "batch", "ours ms", "ORT ms", "ours/ORT", "max err / tol",
                "ok", "spread", "runs", "note"):
        t.add_column(col, justify="left" if col in ("family", "model", "note", "ok") else "right")
    geo = res["geomean"]["families"]
    groups = list(dict.fromkeys(r["group"] for r in res["rows"]))
    for g in groups:
        for r in (r for r in res["rows"] if r["group"] == g):
            t.add_row(*_cells(r))
        gm = geo.get(g)
        t.add_row(g, "[b]geomean[/b]", "", "", "", f"[b]{gm:.2f}[/b]" if gm else "-",
                  "", "", "", "", "", end_section=True)
    allf, allm = res["geomean"]["all_families"], res["geomean"]["all_models"]
    t.add_row("all", "[b]geomean of families[/b]", "", "", "",
              f"[b]{allf:.2f}[/b]" if allf else "-", "", "", "", "", "")
    t.add_row("all", "geomean of models", "", "", "", f"{allm:.2f}" if allm else "-",
              "", "", "", "", "")
    Console(width=200).print(t)


def _cells(r: dict[str, Any]) -> list[str]:
    if "ours_over_ort" not in r:
        return [r["group"], r["model"], str(r["batch"]), "", "", "", "",
                f"[red]{r['status']}[/red]" if r["status"] != "skipped" else "skipped", "",
                "", r.get("error", "")[:90]]
    err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.2g} / {r['tol']:.2g}"
    ratio = f"{r['ours_over_ort']:.2f}"
    if "vs_batch1" in r:
        ratio += f" ({r['vs_batch1']:.2f}x b1)"
    ok = "yes" if r["agree"] else f"[red]NO[/red] {r['detail']}"
    nf = sum(f["count"] for f in r.get("faults", []))
    note = r["note"] + (f"; {nf} guard faults" if nf else "")
    sp = r.get("spread")
    return [r["group"], r["model"], str(r["batch"]), f"{r['ours']['median_ms']:.1f}",
            f"{r['ort']['median_ms']:.1f}", ratio, err, ok,
            "-" if sp is None or sp != sp else f"{sp:.2f}", str(r["runs"]), note]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", help=f"comma-separated subset of {','.join(FAMILIES)},batch "
                   f"(default: all of them); also {','.join(OPT_IN)}, only when named")
    p.add_argument("--batch", help="batch scaling: comma-separated batch sizes, e.g. 1,8,32")
    p.add_argument("--runs", type=int, default=5, help="alternated timed rounds per model")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (>= 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=90.0,
                   help="fewer runs for a model whose rounds would take longer than this")
    p.add_argument("--smoke", action="store_true", help="tiny models, 1 run (CI)")
    p.add_argument("--json", metavar="PATH", help="also write every number as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the suite; print the table; return (and with --json write) the result."""
    a = parse_args(argv)
    fams = a.families.split(",") if a.families else list(FAMILIES)
    unknown = [f for f in fams if f not in (*FAMILIES, *OPT_IN, "batch")]
    if unknown:
        raise SystemExit(f"unknown families {unknown}: choose from "
                         f"{','.join((*FAMILIES, *OPT_IN))},batch")
    runs, warmup = (1, 1) if a.smoke else (a.runs, max(1, a.warmup))
    batches = [int(b) for b in a.batch.split(",")] if a.batch else None
    if "batch" in fams and not batches:
        batches = [1, 8, 32]
    rows = []
    for case, batch, group in plan(fams, a.smoke, batches):
        t0 = time.perf_counter()
        r = run_case(case, batch, runs=runs, warmup=warmup, threads=a.threads,
                     budget_s=a.budget_s, log=lambda s: print(s, file=sys.stderr, flush=True))
        gc.collect()  # the two sessions of a real-width model hold hundreds of MB
        r["group"] = group
        r["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(r)
        print(_progress(r), file=sys.stderr, flush=True)
    import numpy as np
    import onnxruntime

    res = {"threads": a.threads, "runs": runs, "warmup": warmup, "smoke": a.smoke,
           "budget_s": a.budget_s, "numpy": np.__version__, "onnxruntime": onnxruntime.__version__,
           "blas": blas_info(), "openblas_env": {k: os.environ.get(k) for k in (
               "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_THREAD_TIMEOUT")},
           "rows": rows}
    res["geomean"] = summarize_families(rows)
    print_table(res)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return res


def _progress(r: dict[str, Any]) -> str:
    head = f"{r['group']}/{r['model']}@{r['batch']}: "
    if "ours_over_ort" not in r:
        return head + f"{r['status']}: {r.get('error', '')}"
    return head + (f"ours {r['ours']['median_ms']:.1f} ms, ORT {r['ort']['median_ms']:.1f} ms, "
                   f"ratio {r['ours_over_ort']:.2f}, agree {r['agree']} {r['detail']} "
                   f"({r['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
