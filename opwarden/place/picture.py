"""The placement picture: the main graph drawn top to bottom, each node coloured by the device
that runs it, fallbacks outlined and captioned with their reason, inserted copies and layout
conversions drawn as pills. `opwarden explain MODEL --svg FILE` writes it.

A layered layout of our own (no Graphviz needed): a node's row is one below its deepest
producer; within a row nodes are ordered by the mean position of their producers, which keeps
a chain straight and branches side by side. Each box's tooltip holds everything `explain`
says of the node.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from opwarden.place.svg import (
    colours,
    document,
    esc,
    fit,
    heading,
    legend,
    text_colour,
    text_width,
)

DEVICE_COLOURS = {"cpu": "#56B4E9", "edge-npu": "#E69F00", "torch": "#009E73",
                  "openvino": "#CC79A7"}
FALLBACK = "#D55E00"
# What placement inserts besides the model's work: drawn as pills.
PILLS = ("copy", "transpose", "view")
BOX_W, BOX_H, GAP_X, ROW_H = 176, 40, 16, 78


def _layers(pls: list[Any]) -> list[list[int]]:
    """Rows of placement indices: each node one row below its deepest producer among them,
    ordered in its row by the mean column of its producers."""
    producer: dict[int, int] = {}
    for i, p in enumerate(pls):
        for v in p.node.outputs:
            if v is not None:
                producer[id(v)] = i
    preds = [sorted({producer[id(v)] for v in p.node.inputs
                     if v is not None and id(v) in producer and producer[id(v)] != i})
             for i, p in enumerate(pls)]
    depth = [0] * len(pls)
    for i in range(len(pls)):  # placements are in topological order
        depth[i] = 1 + max((depth[j] for j in preds[i] if j < i), default=-1)
    rows: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    col: dict[int, float] = {}
    for i in range(len(pls)):
        rows[depth[i]].append(i)
    for row in rows:
        row.sort(key=lambda i: (sum(col.get(j, 0.0) for j in preds[i]) / len(preds[i])
                                if preds[i] else 0.0))
        for k, i in enumerate(row):
            col[i] = k - (len(row) - 1) / 2
    return rows


def placement_svg(pls: list[Any], report: dict[str, Any] | None = None, title: str = "") -> str:
    """The placement picture of the main graph's placements `pls` (see the module docstring);
    `report`: the placement report (its device order decides what is a fallback)."""
    graph = pls[0].node.graph if pls else None
    # A compiled region is drawn as the nodes it covers (each placement says which region).
    regions = sum(1 for p in pls if p.inserted == "region")
    pls = [p for p in pls if p.node.graph is graph and p.inserted != "region"]
    devs = list((report or {}).get("devices") or dict.fromkeys(p.device for p in pls))
    first = devs[0] if devs else "cpu"
    col = colours(devs + sorted({p.device for p in pls} - set(devs)), DEVICE_COLOURS)
    rows = _layers(pls)
    per_row = max((len(r) for r in rows), default=1)
    width = max(per_row * (BOX_W + GAP_X) + 40, 760)
    top = 92
    pos: dict[int, tuple[float, float]] = {}
    for d, row in enumerate(rows):
        x0 = (width - len(row) * (BOX_W + GAP_X) + GAP_X) / 2
        for k, i in enumerate(row):
            pos[i] = (x0 + k * (BOX_W + GAP_X), top + d * ROW_H)
    falls = [p for p in pls if p.inserted not in PILLS and p.device != first]
    inserted = Counter(p.inserted for p in pls if p.inserted in PILLS)
    runs = sum(1 for p in pls if p.inserted not in PILLS and p.device == first)
    sub = (f"{first} runs {runs} of {runs + len(falls)} nodes; {len(falls)} fall back"
           + "".join(f"; {n} {k}(s) inserted" for k, n in sorted(inserted.items()))
           + (f"; {regions} compiled region(s)" if regions else "")
           + "; hover a node for its variant and reasons")
    body = heading(20, 22, f"Placement: {title}" if title else "Placement", sub)
    body.append('<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" '
                'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" '
                'fill="#777"/></marker></defs>')
    items = [(col[d], f"{d} ({sum(1 for p in pls if p.device == d)} nodes)", "") for d in col]
    items += [("#ffffff", "fallback: off the first device, reason under it", "dashed"),
              ("#eeeeee", "pill: inserted by placement (copy, layout)", "")]
    leg, _ = legend(items, 20, 58, width - 40)
    body += leg
    body += _edges(pls, pos)
    # graph inputs that are data (an initializer listed as an input is a weight)
    ins = {id(v) for v in graph.inputs if v.const is None} if graph is not None else set()
    outs = {id(v) for v in graph.outputs} if graph is not None else set()
    for i, p in enumerate(pls):
        body += _box(p, *pos[i], col[p.device], p in falls)
        body += _io(p, *pos[i], ins, outs, p in falls)
    height = top + len(rows) * ROW_H + 10
    return document(width, height, f"Placement {title}".strip(), body)


def _edges(pls: list[Any], pos: dict[int, tuple[float, float]]) -> list[str]:
    producer = {id(v): i for i, p in enumerate(pls) for v in p.node.outputs if v is not None}
    out = ['<g class="edges" fill="none" stroke="#999" stroke-width="1.2">']
    for i, p in enumerate(pls):
        for v in {id(v): v for v in p.node.inputs if v is not None}.values():
            j = producer.get(id(v))
            if j is None or j == i:
                continue
            (x1, y1), (x2, y2) = pos[j], pos[i]
            x1, x2, y1 = x1 + BOX_W / 2, x2 + BOX_W / 2, y1 + BOX_H
            mid = (y1 + y2) / 2
            out.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} '
                       f'{x2:.1f},{y2 - 1:.1f}" marker-end="url(#arrow)"><title>'
                       f"{esc(v.name)}</title></path>")
    out.append("</g>")
    return out


def _box(p: Any, x: float, y: float, fill: str, fallback: bool) -> list[str]:
    """One node: name, op type and variant; a fallback's reason under it."""
    n = p.node
    origin = n.origins
    tip = [f"{n.name} ({n.op_type}) on {p.device}, variant {p.variant.name}, "
           f"layout {p.layout}"]
    if origin and origin != [n.name]:
        tip.append(f"stands for: {', '.join(origin)}")
    if getattr(p, "region", None):
        tip.append(f"compiled in region {p.region}")
    if p.reason:
        tip.append(f"{'inserted ' + p.inserted if p.inserted else 'reason'}: {p.reason}")
    ink = text_colour(fill)
    out = [f'<g class="node{" fallback" if fallback else ""}'
           f'{" inserted" if p.inserted in PILLS else ""}"><title>{esc(chr(10).join(tip))}</title>']
    if p.inserted in PILLS:
        h = 26
        out.append(f'<rect x="{x + 18:.1f}" y="{y + 7:.1f}" width="{BOX_W - 36}" height="{h}" '
                   f'rx="13" fill="{fill}" fill-opacity="0.55" stroke="#555"/>')
        what = (f"copy to {n.attrs.get('dst', '?')}" if p.inserted == "copy"
                else f"layout {p.inserted}")
        label = fit(what, BOX_W - 48, 10)
        out.append(f'<text class="label" x="{x + BOX_W / 2:.1f}" y="{y + 24:.1f}" '
                   f'font-size="10" text-anchor="middle">{esc(label)}</text></g>')
        return out
    stroke = (f'stroke="{FALLBACK}" stroke-width="3" stroke-dasharray="6,3"' if fallback
              else 'stroke="#333"')
    out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="4" '
               f'fill="{fill}" {stroke}/>')
    out.append(f'<text class="label" x="{x + 6:.1f}" y="{y + 16:.1f}" font-weight="bold" '
               f'fill="{ink}">{esc(fit(n.name, BOX_W - 12, 12))}</text>')
    out.append(f'<text x="{x + 6:.1f}" y="{y + 32:.1f}" font-size="10" fill="{ink}">'
               f"{esc(fit(f'{n.op_type} · {p.variant.name}', BOX_W - 12, 10))}</text>")
    if fallback:
        for k, line in enumerate(_wrap(f"fallback: {p.reason or 'not on the first device'}",
                                       BOX_W + 10, 9, 2)):
            out.append(f'<text class="reason" x="{x:.1f}" y="{y + BOX_H + 11 + 10 * k:.1f}" '
                       f'font-size="9" fill="{FALLBACK}">{esc(line)}</text>')
    out.append("</g>")
    return out


def _io(p: Any, x: float, y: float, ins: set[int], outs: set[int], fallback: bool
        ) -> list[str]:
    """The graph inputs a node reads (above it) and the graph outputs it writes (below)."""
    out = []
    read = [v.name for v in p.node.inputs if v is not None and id(v) in ins]
    wrote = [v.name for v in p.node.outputs if v is not None and id(v) in outs]
    if read:
        out.append(f'<text class="graph-input" x="{x + 2:.1f}" y="{y - 4:.1f}" font-size="9" '
                   f'fill="#444">{esc(fit("input " + ", ".join(read), BOX_W, 9))}</text>')
    if wrote:
        dy = BOX_H + (33 if fallback else 12)
        out.append(f'<text class="graph-output" x="{x + 2:.1f}" y="{y + dy:.1f}" '
                   f'font-size="9" fill="#444">'
                   f'{esc(fit("output " + ", ".join(wrote), BOX_W, 9))}</text>')
    return out


def _wrap(text: str, width: float, size: float, lines: int) -> list[str]:
    """`text` in at most `lines` lines of `width` px, the last shortened with an ellipsis."""
    words, out, cur = text.split(), [], ""
    for i, w in enumerate(words):
        trial = f"{cur} {w}".strip()
        if cur and text_width(trial, size) > width:
            out.append(cur)
            cur = w
            if len(out) == lines - 1:
                return out + [fit(" ".join([cur, *words[i + 1:]]), width, size)]
        else:
            cur = trial
    return out + [fit(cur, width, size)] if cur else out


def save_placement_svg(pls: list[Any], path: str, report: dict[str, Any] | None = None,
                       title: str = "") -> str:
    """Write the placement picture (see `placement_svg`) to `path`; returns path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(placement_svg(pls, report, title))
    return path
