"""The summary of a placement: per-device node counts, fallbacks with reasons, inserted nodes,
and where each model node went.

Built from `InferenceSession.explain()` rows and the placement report; the session's
`explain_summary` and the `opwarden explain` rendering in `cli/devices.py` both use it. Each
row's ``origin`` lists the model nodes that executed node stands for (a fused node lists all
its parts); the model nodes no executed node stands for are in ``removed``, with the pass that
removed them (constant folding, dead code, identities, cancelled transposes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def summarize(rows: list[dict[str, Any]], report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Summary of an explanation: per-device counts, fallbacks with reasons, inserted nodes."""
    report = report or {}
    devs = report.get("devices") or []
    model_rows = [r for r in rows if not r.get("inserted")]
    first = devs[0] if devs else (model_rows[0]["device"] if model_rows else "cpu")
    by_device = Counter(r["device"] for r in model_rows)
    falls = [
        {
            "name": r["name"],
            "op_type": r["op_type"],
            "device": r["device"],
            "reason": r.get("reason") or "",
        }
        for r in model_rows
        if r["device"] != first
    ]
    inserted = Counter(r["inserted"] for r in rows if r.get("inserted"))
    n = len(model_rows)
    text = f"{first} runs {by_device.get(first, 0)} of {n} nodes"
    if falls:
        where = Counter(f["device"] for f in falls)
        dest = ", ".join(f"{k} ({v})" if len(where) > 1 else k for k, v in where.items())
        items = "; ".join(f"{f['name']} ({f['op_type']}): {f['reason']}" for f in falls[:10])
        more = f"; and {len(falls) - 10} more" if len(falls) > 10 else ""
        text += f"; {len(falls)} fall back to {dest}: {items}{more}"
    transposes = report.get("transposes_inserted", inserted.get("transpose", 0))
    copies = report.get("copies_inserted", inserted.get("copy", 0))
    text += f". Inserted: {transposes} transpose(s), {copies} copy node(s)"
    if report.get("views_inserted"):
        text += f", {report['views_inserted']} layout view(s) (no data moved)"
    if report.get("transposes_cancelled"):
        text += f"; {report['transposes_cancelled']} model transpose(s) cancelled"
    if report.get("channel_shuffles_nhwc"):
        text += f"; {report['channel_shuffles_nhwc']} channel shuffle(s) kept in NHWC"
        if report.get("channel_shuffles_folded"):
            text += f" ({report['channel_shuffles_folded']} folded into depthwise convolutions)"
    decomposed = sorted({r["decomposed_from"] for r in model_rows if r.get("decomposed_from")})
    if decomposed:
        text += f"; decomposed: {', '.join(decomposed)}"
    fused, removed = provenance(rows, report)
    if fused:
        text += (f"; {len(fused)} node(s) stand for "
                 f"{sum(len(v) for v in fused.values())} model nodes (fused)")
    if removed:
        by_pass: dict[str, list[str]] = {}
        for name, step in removed.items():
            by_pass.setdefault(step, []).append(name)
        # names where there are few (a user looking for one finds it), counts otherwise
        parts = [f"{k}: {', '.join(v) if len(v) <= 6 else len(v)}"
                 for k, v in sorted(by_pass.items(), key=lambda kv: -len(kv[1]))]
        text += f"; {len(removed)} model node(s) removed ({'; '.join(parts)})"
    from opwarden.place.regions import degrade_text  # the openvino device's precision

    text += degrade_text(rows, report)
    sim = report.get("simulated") or []
    if sim:
        text += f". SIMULATED: {', '.join(sim)} (device profile executed on the host)"
    return {
        "text": text,
        "first_device": first,
        "nodes": n,
        "by_device": dict(by_device),
        "fallbacks": falls,
        "transposes_inserted": transposes,
        "copies_inserted": copies,
        "views_inserted": report.get("views_inserted", 0),
        "transposes_cancelled": report.get("transposes_cancelled", 0),
        "nhwc_nodes": report.get("nhwc_nodes", 0),
        "channel_shuffles_nhwc": report.get("channel_shuffles_nhwc", 0),
        "channel_shuffles_folded": report.get("channel_shuffles_folded", 0),
        "decomposed": decomposed,
        "simulated": sim,
        "fused": fused,
        "removed": removed,
    }


def provenance(
    rows: list[dict[str, Any]], report: dict[str, Any] | None = None
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(executed node -> the model nodes it stands for, for nodes standing for several or for
    one under another name; model node -> the pass that removed it, for the model nodes no
    executed node stands for)."""
    fused = {r["name"]: list(r["origin"]) for r in rows
             if r.get("origin") and r["origin"] != [r["name"]]}
    carried = {o for r in rows for o in r.get("origin") or ()}
    removed = {k: v for k, v in ((report or {}).get("removed") or {}).items()
               if k not in carried}
    return fused, removed

