"""Reports over op records: per-op-type table, top anomalies, flame graph SVG.

A record's work (``estimate``: FLOPs and bytes moved, what the roofline bounds and `opwarden
bench`'s op table read) takes its FLOPs from the operator's declared cost rule (``OpDef.flops``,
declared beside the operator in its ops file); an operator without one counts one FLOP per
output element.
"""

from __future__ import annotations

import html
import math
import time
from collections import defaultdict
from typing import Any

import numpy as np

from opwarden.ops import REGISTRY
from opwarden.trace.records import OpRecord

_PEAKS: dict[str, float] = {}


def _fastest(fn, reps: int = 7) -> float:
    """Seconds of the fastest of `reps` calls of fn, after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def machine_peaks() -> dict[str, float]:
    """Compute peak (GFLOP/s, sgemm 1024) and memory bandwidth (GB/s, 16 MiB copy), measured
    once: the fastest of several repetitions each, so a moment of load on a shared machine
    does not become the peak (a 512 sgemm timed as one block of 5 once read 98 GFLOP/s on a
    machine whose best 1024 sgemm runs at 270)."""
    if not _PEAKS:
        n = 1024
        a = np.ones((n, n), np.float32)
        c = np.empty_like(a)
        x = np.ones(16 << 20, np.uint8)
        y = np.empty_like(x)
        flops = 2 * n**3 / _fastest(lambda: np.matmul(a, a, out=c))
        bw = 2 * x.nbytes / _fastest(lambda: np.copyto(y, x))
        _PEAKS.update(gflops=flops / 1e9, gbps=bw / 1e9)
    return dict(_PEAKS)


def _elems(shape: Any) -> int:
    if not isinstance(shape, list):
        return 0
    return int(math.prod(d for d in shape if isinstance(d, int)))


_ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}


def op_flops(rec: OpRecord) -> float:
    """FLOPs of one record: its operator's cost rule (OpDef.flops; a record names no domain:
    the first operator of its type that declares one) on the recorded shapes, one per output
    element where there is none or the rule says the shapes do not tell; 0 where the shapes
    do not fit the rule."""
    rule = next((o.flops_fn for o in REGISTRY.named(rec.op_type) if o.flops_fn), None)
    outs = rec.output_shapes
    try:
        flops = rule(rec.input_shapes, outs) if rule is not None else None
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        return 0.0
    return float(sum(_elems(s) for s in outs)) if flops is None else float(flops)


def estimate(rec: OpRecord) -> tuple[float, float]:
    """(FLOPs, bytes moved) for a record, from its shapes (FLOPs: ``op_flops``)."""
    views = getattr(rec, "output_views", None) or []
    if views and all(views):
        return 0.0, 0.0  # views of the inputs: nothing computed, nothing moved
    size = sum(
        _elems(s) * _ITEMSIZE.get(d, 1)
        for s, d in zip(rec.input_shapes + rec.output_shapes, rec.input_dtypes + rec.output_dtypes)
    )
    return op_flops(rec), float(size)


def roofline_us(rec: OpRecord, peaks: dict[str, float]) -> float:
    flops, size = estimate(rec)
    return max(flops / (peaks["gflops"] * 1e3), size / (peaks["gbps"] * 1e3))


def by_op_type(records: list[OpRecord]) -> list[dict[str, Any]]:
    """count, total/mean/max µs and share of the kernels' time per op type, largest first;
    guard_us: the guard's checks around those kernels (not in the kernel times)."""
    groups: dict[str, list[float]] = defaultdict(list)
    guard: dict[str, float] = defaultdict(float)
    for r in records:
        groups[r.op_type].append(r.exec_us)
        guard[r.op_type] += r.guard_us
    total = sum(sum(v) for v in groups.values()) or 1.0
    rows = [
        {
            "op_type": k,
            "count": len(v),
            "total_us": sum(v),
            "mean_us": sum(v) / len(v),
            "max_us": max(v),
            "share": sum(v) / total,
            "guard_us": guard[k],
        }
        for k, v in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["total_us"])


def anomalies(records: list[OpRecord], faults: list[Any], top: int = 5) -> list[dict[str, Any]]:
    """The most anomalous operators: faults first, then NaN/Inf, then slowest vs roofline."""
    peaks = machine_peaks()
    scored: list[tuple[float, dict[str, Any]]] = []
    fault_nodes = {}
    for f in faults:
        fault_nodes.setdefault(f.node, f)
    seen = set()
    for r in records:
        if r.node in seen:
            continue
        reason, score = "", 0.0
        if r.node in fault_nodes:
            f = fault_nodes[r.node]
            reason, score = f"fault ({f.check}, {f.action}): {f.detail}", 1e12
        elif r.status != "ok":
            reason, score = f"{r.status}: {r.error}", 1e11
        elif r.checks.get("nan") or r.checks.get("inf"):
            reason = f"{r.checks.get('nan', 0)} NaN, {r.checks.get('inf', 0)} Inf in outputs"
            score = 1e10
        else:
            bound = roofline_us(r, peaks)
            ratio = r.exec_us / bound if bound > 0 else 0.0
            reason, score = f"{ratio:.1f}x its roofline estimate ({bound:.0f} µs)", ratio
        seen.add(r.node)
        scored.append(
            (
                score,
                {
                    "node": r.node,
                    "op_type": r.op_type,
                    "variant": r.variant,
                    "exec_us": r.exec_us,
                    "reason": reason,
                },
            )
        )
    scored.sort(key=lambda t: -t[0])
    return [d for _, d in scored[:top]]


def flame_svg(records: list[OpRecord], path: str, width: int = 1200) -> str:
    """A flame graph (run ▸ op type ▸ node) of total time as an SVG file; returns path."""
    by_type: dict[str, list[OpRecord]] = defaultdict(list)
    for r in records:
        by_type[r.op_type].append(r)
    total = sum(r.exec_us for r in records) or 1.0
    row_h, rows = 18, []

    def box(x: float, w: float, level: int, label: str, us: float, hue: int) -> str:
        y = (2 - level) * (row_h + 2) + 4
        title = html.escape(f"{label}: {us:.0f} µs ({100 * us / total:.1f}%)")
        text = html.escape(label) if w > 40 else ""
        return (
            f'<g><title>{title}</title><rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" '
            f'height="{row_h}" fill="hsl({hue},70%,60%)" stroke="white"/>'
            f'<text x="{x + 3:.1f}" y="{y + 13}" font-size="11" font-family="monospace">'
            f"{text[: int(w / 7)]}</text></g>"
        )

    rows.append(box(0, width, 0, "run", total, 20))
    x = 0.0
    for i, (op_type, recs) in enumerate(
        sorted(by_type.items(), key=lambda t: -sum(r.exec_us for r in t[1]))
    ):
        t_us = sum(r.exec_us for r in recs)
        w = width * t_us / total
        hue = (i * 47) % 360
        rows.append(box(x, w, 1, op_type, t_us, hue))
        nx = x
        agg: dict[str, float] = defaultdict(float)
        for r in recs:
            agg[r.node] += r.exec_us
        for node, us in sorted(agg.items(), key=lambda t: -t[1]):
            nw = width * us / total
            rows.append(box(nx, nw, 2, node, us, hue))
            nx += nw
        x += w
    height = 3 * (row_h + 2) + 8
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">' + "".join(rows) + "</svg>"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg)
    return path
