"""The light zoo table: opwarden vs ONNX Runtime vs onnx.reference, side by side in one process.

    python benchmarks/bench_zoo.py [--models a,b] [--runs 10] [--threads 2] [--providers torch,cpu]
                                   [--ref-runs 1] [--ref-models a,b] [--ort-spinning] [--md PATH]
                                   [--json PATH]

For each of the nine randomized light CNNs (opwarden.zoo, seeded weights): ours and ONNX Runtime
alternate (ours, ort, ours, ort, ...) after warm-up, 2 intra-op threads each by default; medians,
IQRs, the ratio ours/ort and the largest output difference. onnx.reference is seconds per model,
so it is timed separately with few runs (default: one timed run, no warm-up, on every model;
--ref-models limits it to a subset, --ref-runs 0 skips it); the table says how many runs it got.
Geometric means of ours/ort and reference/ours close the table (over the models that have them).
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
from functools import partial
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opwarden import zoo  # noqa: E402
from opwarden.cli.bench import (  # noqa: E402
    fault_line,
    fault_summary,
    interleave,
    make_feeds,
    max_abs_diff,
    ours_session,
    peer_runner,
    summarize,
)


def geomean(xs: list[float]) -> float | None:
    """Geometric mean of the positive values (None for none)."""
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _model_bytes(name: str, zoo_dir: str | None) -> bytes:
    if zoo_dir:
        path = os.path.join(zoo_dir, f"{name}.onnx")
        if os.path.exists(path):
            with open(path, "rb") as f:
                return f.read()
    return zoo.build(name, seed=0).SerializeToString()


def bench_model(
    name: str,
    *,
    runs: int,
    warmup: int,
    threads: int,
    providers: list[str] | None,
    ref_runs: int,
    session_options: dict[str, Any],
    zoo_dir: str | None = None,
    ort_spinning: bool = False,
) -> dict[str, Any]:
    """One row of the table."""
    data = _model_bytes(name, zoo_dir)
    t0 = time.perf_counter()
    sess = ours_session(data, threads, providers, **session_options)
    load_ms = (time.perf_counter() - t0) * 1e3
    ort = peer_runner("onnxruntime", data, threads, spinning=ort_spinning)
    feeds = make_feeds(sess)
    times = interleave(
        {"ours": partial(sess.run, None, feeds), "ort": partial(ort, feeds)}, runs, warmup
    )
    row: dict[str, Any] = {
        "model": name,
        "nodes": len(getattr(sess, "placements", ())),  # after the graph passes
        "load_ms": round(load_ms, 1),
        "ours": summarize(times["ours"]),
        "ort": summarize(times["ort"]),
        "max_abs_diff": max_abs_diff(sess.run(None, feeds), ort(feeds)),
        "ref": None,
        "faults": fault_summary(sess),  # guard fallbacks during the timed runs (none expected)
    }
    row["ours_over_ort"] = round(row["ours"]["median_ms"] / row["ort"]["median_ms"], 4)
    if ref_runs > 0:
        ref = peer_runner("reference", data, threads)
        rt = interleave({"ref": partial(ref, feeds)}, ref_runs, 0)["ref"]
        row["ref"] = {**summarize(rt), "runs": ref_runs, "warmup": 0}
        row["ref_over_ours"] = round(row["ref"]["median_ms"] / row["ours"]["median_ms"], 2)
        row["ref_over_ort"] = round(row["ref"]["median_ms"] / row["ort"]["median_ms"], 2)
    return row


def markdown(res: dict[str, Any]) -> str:
    """The result as a markdown table with a summary line."""
    lines = [
        f"Light zoo, {res['threads']} threads each, providers {','.join(res['providers'])}, "
        f"{res['runs']} alternated runs after {res['warmup']} warm-up (ours vs ONNX Runtime"
        f"{', its spinning workers on' if res.get('ort_spinning') else ', spinning off'}); "
        f"onnx.reference: {res['ref_runs']} timed run(s), no warm-up, not alternated.",
        "",
        "| model | ours ms (IQR) | ORT ms (IQR) | ours/ORT | reference ms | ref/ours | ref/ORT "
        "| max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["models"]:
        o, t, ref = r["ours"], r["ort"], r["ref"]
        refc = (
            f"{ref['median_ms']:.0f} | {r['ref_over_ours']:.1f}x | {r['ref_over_ort']:.0f}x"
            if ref
            else "- | - | -"
        )
        diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.2g}"
        lines.append(
            f"| {r['model']} | {o['median_ms']:.1f} ({o['iqr_ms']:.1f}) | "
            f"{t['median_ms']:.1f} ({t['iqr_ms']:.1f}) | {r['ours_over_ort']:.2f} | {refc} | "
            f"{diff} |"
        )
    g = res["geomean"]

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines.append(
        f"| **geomean** | | | **{fmt(g['ours_over_ort'], '.2f')}** | | "
        f"**{fmt(g['ref_over_ours'], '.1f')}x** | {fmt(g['ref_over_ort'], '.0f')}x | |"
    )
    worst = max(res["models"], key=lambda r: r["ours_over_ort"])
    lines += [
        "",
        f"worst ours/ORT: {worst['model']} {worst['ours_over_ort']:.2f}; "
        f"slowest-vs-reference speed-up: "
        + (
            f"{min(r['ref_over_ours'] for r in res['models'] if r['ref']):.1f}x"
            if any(r["ref"] for r in res["models"])
            else "-"
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", help="comma-separated subset of " + ",".join(zoo.LIGHT_MODELS))
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--providers", help="opwarden providers, e.g. torch,cpu (default cpu)")
    p.add_argument("--ref-runs", type=int, default=1, help="onnx.reference timed runs (0: skip)")
    p.add_argument("--ref-models", help="comma-separated subset timed with onnx.reference")
    p.add_argument("--checks", help="opwarden session checks (comma-separated or 'none')")
    p.add_argument("--optimization-level", type=int, choices=range(4), metavar="{0..3}")
    p.add_argument("--zoo-dir", help="read prebuilt models (benchmarks/zoo.py) from here")
    p.add_argument("--ort-spinning", action="store_true",
                   help="leave ONNX Runtime's busy-waiting workers on (its default; they then "
                        "keep a core busy into our next run)")
    p.add_argument("--md", metavar="PATH", help="also write the markdown table here")
    p.add_argument("--json", metavar="PATH", help="also write every number as JSON here")
    a = p.parse_args()
    models = a.models.split(",") if a.models else list(zoo.LIGHT_MODELS)
    ref_models = set(a.ref_models.split(",")) if a.ref_models else set(models)
    opts: dict[str, Any] = {}
    if a.checks is not None:
        opts["checks"] = () if a.checks in ("", "none") else tuple(a.checks.split(","))
    if a.optimization_level is not None:
        opts["optimization_level"] = a.optimization_level
    providers = a.providers.split(",") if a.providers else None
    rows = []
    for name in models:
        t0 = time.perf_counter()
        row = bench_model(
            name,
            runs=a.runs,
            warmup=a.warmup,
            threads=a.threads,
            providers=providers,
            ref_runs=a.ref_runs if name in ref_models else 0,
            session_options=opts,
            zoo_dir=a.zoo_dir,
            ort_spinning=a.ort_spinning,
        )
        rows.append(row)
        print(
            f"{name}: ours {row['ours']['median_ms']:.1f} ms, ort {row['ort']['median_ms']:.1f} "
            f"ms, ratio {row['ours_over_ort']:.2f}"
            + (f", reference {row['ref']['median_ms']:.0f} ms" if row["ref"] else "")
            + f" ({time.perf_counter() - t0:.0f} s)"
            + "".join(f"\n  FAULT {fault_line(f)}" for f in row["faults"]),
            file=sys.stderr,
        )
    res = {
        "threads": a.threads,
        "providers": providers or ["cpu"],
        "runs": a.runs,
        "warmup": a.warmup,
        "ref_runs": a.ref_runs,
        "session_options": opts,
        "ort_spinning": a.ort_spinning,
        "numpy": np.__version__,
        "models": rows,
        "geomean": {
            "ours_over_ort": geomean([r["ours_over_ort"] for r in rows]),
            "ref_over_ours": geomean([r["ref_over_ours"] for r in rows if r["ref"]]),
            "ref_over_ort": geomean([r["ref_over_ort"] for r in rows if r["ref"]]),
        },
    }
    md = markdown(res)
    print(md)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(md + "\n")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
