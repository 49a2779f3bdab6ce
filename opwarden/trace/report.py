"""Reports over op records: per-op-type table, top anomalies, flame graph SVG (drawn with
place/svg.py's helpers: titled, a time axis, labels where they fit, a legend of op types).

A record's work (``estimate``: FLOPs and bytes moved, what the roofline bounds and `opwarden
bench`'s op table read) takes its FLOPs from the operator's declared cost rule (``OpDef.flops``,
declared beside the operator in its ops file); an operator without one counts one FLOP per
output element.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import numpy as np

from opwarden.ops import REGISTRY
from opwarden.place.svg import (
    colours,
    document,
    esc,
    fit,
    heading,
    legend,
    nice_ticks,
    text_colour,
    tick_label,
)
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
    """The least time (µs) the record's work can take at the machine's peaks: its FLOPs at
    peak compute or its bytes at peak bandwidth, whichever takes longer."""
    flops, size = estimate(rec)
    return max(flops / (peaks["gflops"] * 1e3), size / (peaks["gbps"] * 1e3))


def expand_regions(records: list[OpRecord]) -> list[OpRecord]:
    """`records` with each compiled region's record (one with ``covers``: its nodes' times from
    OpenVINO's profiling) replaced by one record per covered node, so operators show rather
    than one region. What the per-node times leave of the region's own time stays on the
    region's record (its boundary and dispatch); per-node times summing to more than the
    region's (OpenVINO counts parallel layers apart) are scaled to it."""
    import dataclasses

    if not any(r.covers for r in records):
        return records
    out: list[OpRecord] = []
    for r in records:
        if not r.covers:
            out.append(r)
            continue
        inner = sum(max(float(c.get("exec_us") or 0.0), 0.0) for c in r.covers)
        scale = r.exec_us / inner if inner > r.exec_us > 0 else 1.0
        t = r.start_us
        for c in r.covers:
            us = max(float(c.get("exec_us") or 0.0), 0.0) * scale
            out.append(dataclasses.replace(
                r, node=c["node"], op_type=c["op_type"], exec_us=us, start_us=t, guard_us=0.0,
                origin=[c["node"]], covers=[]))
            t += us
        out.append(dataclasses.replace(r, exec_us=max(r.exec_us - inner * scale, 0.0),
                                       start_us=t, covers=[]))
    return out


def by_op_type(records: list[OpRecord]) -> list[dict[str, Any]]:
    """count, total/mean/max µs and share of the kernels' time per op type, largest first;
    guard_us: the guard's checks around those kernels (not in the kernel times); a compiled
    region's nodes count as their operators (expand_regions)."""
    records = expand_regions(records)
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
            # ranked by the time lost against the bound: a 80 µs op at 500x loses less than a
            # 18 ms one at 5x
            est = f"{bound:.0f}" if bound >= 10 else f"{bound:.2g}"
            reason = f"{ratio:.1f}x its roofline estimate ({est} µs)"
            score = r.exec_us - bound
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


def _ms(us: float) -> str:
    ms = us / 1e3
    if ms >= 100:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _flame_rows(records: list[OpRecord]) -> tuple[int, list[tuple[str, float, list]]]:
    """(runs, [(op type, µs per run, [(node, µs per run, origin)] largest first)] largest
    first): the time of each op type and node, averaged over the runs the records hold."""
    records = expand_regions(records)  # a compiled region's nodes as their operators
    runs = max(len({r.run for r in records}), 1)
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    origin: dict[str, list[str]] = {}
    for r in records:
        by_type[r.op_type][r.node] += r.exec_us / runs
        origin.setdefault(r.node, list(getattr(r, "origin", None) or []))
    rows = [
        (t, sum(nodes.values()),
         [(n, us, origin[n]) for n, us in sorted(nodes.items(), key=lambda kv: -kv[1])])
        for t, nodes in by_type.items()
    ]
    return runs, sorted(rows, key=lambda row: -row[1])


def flame_svg(records: list[OpRecord], path: str, width: int = 1200,
              title: str | None = None) -> str:
    """A flame graph of kernel time per run as an SVG file; returns path.

    Three rows: all operators, each op type, each node (widths in proportion to their mean
    time per run). Boxes show their name and time where the text fits and a tooltip always
    (a node's tooltip lists the model nodes it stands for); a time axis in ms, and a legend
    of op types with their colours and times. `title` names the model and the run.
    """
    runs, types = _flame_rows(records)
    total = sum(t[1] for t in types) or 1.0
    left, right, row_h, top = 10, 10, 22, 52
    span = width - left - right
    col = colours([t[0] for t in types])
    body = heading(left, 20, f"Flame graph: {title or 'opwarden profile'}",
                   f"kernel time per run, mean of {runs} run(s): {_ms(total)} "
                   "(guard checks apart); hover a box for its details")

    def box(x: float, w: float, level: int, label: str, us: float, fill: str,
            tip: str = "", cls: str = "") -> str:
        y = top + level * (row_h + 2)
        text = fit(label, w - 6, 11, f" {_ms(us)}")
        tip = f"{label}: {_ms(us)} per run ({100 * us / total:.1f}%){tip}"
        return (
            f'<g class="{cls}"><title>{esc(tip)}</title><rect x="{x:.1f}" y="{y}" '
            f'width="{max(w, 0.5):.1f}" height="{row_h}" fill="{fill}" stroke="white"/>'
            + (f'<text class="label" x="{x + 3:.1f}" y="{y + 15}" '
               f'fill="{text_colour(fill)}">{esc(text)}</text>' if text else "")
            + "</g>"
        )

    body.append(box(left, span, 0, "all operators", total, "#dddddd", cls="root"))
    x = float(left)
    for op_type, t_us, nodes in types:
        w = span * t_us / total
        body.append(box(x, w, 1, op_type, t_us, col[op_type], cls="op-type"))
        nx = x
        for node, us, origin in nodes:
            nw = span * us / total
            parts = f"; stands for {', '.join(origin)}" if origin and origin != [node] else ""
            body.append(box(nx, nw, 2, node, us, col[op_type], f" [{op_type}]{parts}", "node"))
            nx += nw
        x += w
    axis_y = top + 3 * (row_h + 2) + 4
    body += _time_axis(left, axis_y, span, total)
    items = [(col[t], f"{t} {_ms(us)} ({100 * us / total:.0f}%)", "") for t, us, _ in types]
    leg, leg_h = legend(items, left, axis_y + 34, span)
    body += leg
    return _write(path, document(width, axis_y + 40 + leg_h, f"Flame graph: {title or ''}",
                                 body))


def _time_axis(x0: float, y: float, span: float, total_us: float) -> list[str]:
    """A horizontal axis under the rows: ticks in ms from 0 to the total time."""
    total_ms = total_us / 1e3
    out = [f'<g class="axis"><line x1="{x0}" y1="{y}" x2="{x0 + span}" y2="{y}" '
           'stroke="#333"/>']
    for v in nice_ticks(total_ms, 8):
        if v > total_ms * 1.0001:
            break
        tx = x0 + span * v / total_ms if total_ms else x0
        out.append(f'<line x1="{tx:.1f}" y1="{y}" x2="{tx:.1f}" y2="{y + 5}" stroke="#333"/>'
                   f'<text class="tick" x="{tx:.1f}" y="{y + 17}" text-anchor="middle">'
                   f"{tick_label(v)}</text>")
    out.append(f'<text x="{x0 + span:.1f}" y="{y + 30}" text-anchor="end" fill="#444">'
               "time per run (ms)</text></g>")
    return out


def _write(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
