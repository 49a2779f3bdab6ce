"""Memory plan reports: a table, and a picture of the arena over time (SVG or matplotlib PNG):
buffers labelled where they fit, step and byte axes, a legend of buffer kinds, the peak marked."""

from __future__ import annotations

from typing import Any, Literal

from opwarden.errors import OptionsError, describe_bytes
from opwarden.place.svg import document, esc, fit, heading, legend, nice_ticks
from opwarden.plan.planner import MemoryPlan


def summary_lines(plan: MemoryPlan) -> list[str]:
    """The plan in a few lines: arena against its lower bound and the naive size, buffers
    and steps, what kernels write in place, Concat slices, tensors sized at run time."""
    lb = plan.lower_bound_bytes
    ratio = plan.arena_bytes / lb if lb else 1.0
    lines = [
        f"arena {describe_bytes(plan.arena_bytes)} ({plan.arena_bytes} bytes), "
        f"lower bound {describe_bytes(lb)} (x{ratio:.3f}), "
        f"naive {describe_bytes(plan.naive_bytes)} "
        f"({plan.naive_bytes / max(plan.arena_bytes, 1):.1f}x the arena)",
        f"{len(plan.buffers)} buffers over {len(plan.steps)} steps; "
        f"{sum(b.materialized for b in plan.buffers)} written in place by kernels "
        f"({describe_bytes(plan.materialized_bytes)}); outputs "
        f"{describe_bytes(plan.outputs_bytes)} outside the arena",
    ]
    if plan.slices:
        cats = len(set(plan.slices.values()))
        lines.append(f"{len(plan.slices)} Concat inputs written straight into their slice of "
                     f"{cats} Concat outputs (not copied)")
    if plan.dynamic:
        shown = ", ".join(plan.dynamic[:6]) + (" ..." if len(plan.dynamic) > 6 else "")
        lines.append(f"{len(plan.dynamic)} tensors sized at run time (not planned): {shown}")
    return lines


def table(plan: MemoryPlan, limit: int | None = 40) -> Any:
    """A rich Table of the buffers, largest first."""
    from rich.table import Table

    t = Table(title="memory plan", show_lines=False)
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("buffer", "left"),
        ("producer", "left"),
        ("size", "right"),
        ("offset", "right"),
        ("steps", "right"),
        ("shares with", "left"),
    )
    for col, just in columns:
        t.add_column(col, justify=just)
    rows = sorted(plan.buffers, key=lambda b: (-b.nbytes, b.first))
    for b in rows[:limit] if limit else rows:
        t.add_row(
            b.name,
            b.producer,
            describe_bytes(b.nbytes),
            str(b.offset),
            f"{b.first}-{b.last}",
            ", ".join(b.values[1:]) if len(b.values) > 1 else "",
        )
    if limit and len(rows) > limit:
        t.caption = f"{len(rows) - limit} smaller buffers not shown (--all shows every buffer)"
    return t


# What a buffer's colour says (the legend): a tensor its producer's kernel writes in place,
# one copied in from the kernel's own result, a kernel workspace.
KINDS = (
    ("in place", "#56B4E9", "tensor its kernel writes in place"),
    ("copied", "#E69F00", "tensor copied in from its kernel's result"),
    ("workspace", "#CC79A7", "kernel workspace"),
)


def _kind(b: Any) -> int:
    if b.kind == "workspace":
        return 2
    return 0 if b.materialized else 1


def peak(plan: MemoryPlan) -> tuple[int, int]:
    """(step, bytes): the first step with the most bytes of buffers live at once."""
    steps = max(len(plan.steps), max((b.last + 1 for b in plan.buffers), default=0), 1)
    live = [0] * (steps + 1)
    for b in plan.buffers:  # +nbytes from its first step, -nbytes after its last
        live[b.first] += b.nbytes
        live[b.last + 1] -= b.nbytes
    best, at, run = -1, 0, 0
    for t in range(steps):
        run += live[t]
        if run > best:
            best, at = run, t
    return at, max(best, 0)


def _caption(plan: MemoryPlan, at: int, top: int) -> str:
    node = plan.steps[at] if at < len(plan.steps) else "?"
    lb = plan.lower_bound_bytes
    ratio = f" (x{plan.arena_bytes / lb:.3f})" if lb else ""
    return (f"arena {describe_bytes(plan.arena_bytes)}, lower bound {describe_bytes(lb)}{ratio}; "
            f"{len(plan.buffers)} buffers over {len(plan.steps)} steps; peak "
            f"{describe_bytes(top)} live at step {at} ({node})")


def svg(plan: MemoryPlan, width: int = 1100, height: int = 640, title: str = "") -> str:
    """The arena over time: x = step, y = offset, one rectangle per buffer, labelled with
    its name and size where they fit; step and byte axes, a legend of the buffer kinds, the
    peak step and the arena's top marked. Every rectangle has its details as a tooltip."""
    pad_l, pad_r, pad_t = 78, 20, 56
    steps = max(len(plan.steps), 1)
    at, top = peak(plan)
    body = heading(10, 20, f"Memory plan: {title}" if title else "Memory plan",
                   _caption(plan, at, top))
    items = [(c, label, "") for _, c, label in KINDS]
    items.append(("#D55E00", "peak: most bytes live at once", ""))
    leg, leg_h = legend(items, pad_l, height - 22, width - pad_l - pad_r)
    pad_b = 44 + leg_h
    w, h = width - pad_l - pad_r, height - pad_b - pad_t
    arena = max(plan.arena_bytes, 1)
    sx, sy = w / steps, h / arena
    for i, b in enumerate(plan.buffers):
        x, bw = pad_l + b.first * sx, max((b.last - b.first + 1) * sx, 1.0)
        y, bh = pad_t + h - (b.offset + b.nbytes) * sy, max(b.nbytes * sy, 0.5)
        fill = KINDS[_kind(b)][1]
        tip = (f"{b.name} ({b.producer}): {describe_bytes(b.nbytes)} at offset {b.offset}, "
               f"steps {b.first}-{b.last}")
        body.append(
            f'<g class="buffer"><title>{esc(tip)}</title><rect x="{x:.2f}" y="{y:.2f}" '
            f'width="{bw:.2f}" height="{bh:.2f}" fill="{fill}" '
            f'fill-opacity="{0.95 if i % 2 else 0.7}" stroke="#333" stroke-width="0.5"/>'
        )
        body += _buffer_label(b, x, y, bw, bh)
        body.append("</g>")
    body += _axes(plan, pad_l, pad_t, w, h, steps, arena)
    px = pad_l + (at + 0.5) * sx
    body.append(
        f'<g class="peak"><line x1="{px:.1f}" y1="{pad_t - 4}" x2="{px:.1f}" y2="{pad_t + h}" '
        'stroke="#D55E00" stroke-width="2" stroke-dasharray="6,3"/>'
        f'<text x="{min(px + 4, width - 150):.1f}" y="{pad_t - 6}" fill="#D55E00" '
        f'font-weight="bold">peak {esc(describe_bytes(top))} at step {at}</text></g>'
    )
    body += leg
    return document(width, height, f"Memory plan {title}".strip(), body)


def _label_lines(b: Any, bw: float, bh: float, size: float) -> list[str]:
    """The name and size to write inside a buffer's bw x bh px rectangle: one line, two
    where it is tall enough, or none where neither fits."""
    bytes_ = describe_bytes(b.nbytes)
    one = fit(b.name, bw - 4, size, f" {bytes_}") if bh >= size * 1.2 else ""
    if one.endswith(bytes_):
        return [one]
    if bh >= size * 2.5 and fit(bytes_, bw - 4, size) == bytes_:
        return [t for t in (fit(b.name, bw - 4, size), bytes_) if t]
    return [one] if one else []


def _buffer_label(b: Any, x: float, y: float, bw: float, bh: float) -> list[str]:
    return [f'<text class="label" x="{x + 2:.1f}" y="{y + 11 + 12 * k:.1f}" '
            f'font-size="10">{esc(t)}</text>'
            for k, t in enumerate(_label_lines(b, bw, bh, 10))]


def byte_ticks(top: float, n: int = 6) -> list[float]:
    """Round tick values in the binary unit that suits `top` (0, 512 KiB, 1 MiB, ...)."""
    unit = 1.0
    while top / unit >= 1024:
        unit *= 1024
    return [v * unit for v in nice_ticks(top / unit, n)]


def _axes(plan: MemoryPlan, x0: float, y0: float, w: float, h: float, steps: int,
          arena: int) -> list[str]:
    """Step ticks under the plot, byte ticks left of it, and the arena's top."""
    out = ['<g class="axis">',
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="black"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>']
    for v in nice_ticks(steps - 1, 12):
        if v > steps - 1 or v != int(v):
            continue
        tx = x0 + (v + 0.5) * w / steps
        out.append(f'<line x1="{tx:.1f}" y1="{y0 + h}" x2="{tx:.1f}" y2="{y0 + h + 4}" '
                   f'stroke="black"/><text class="tick" x="{tx:.1f}" y="{y0 + h + 16}" '
                   f'text-anchor="middle">{int(v)}</text>')
    out.append(f'<text x="{x0 + w / 2:.0f}" y="{y0 + h + 32}" text-anchor="middle">'
               "step (the order nodes run in)</text>")
    for v in byte_ticks(arena, 6):
        if v > arena:
            break
        ty = y0 + h - v * h / arena
        out.append(f'<line x1="{x0 - 4}" y1="{ty:.1f}" x2="{x0}" y2="{ty:.1f}" stroke="black"/>'
                   f'<text class="tick" x="{x0 - 6}" y="{ty + 4:.1f}" text-anchor="end">'
                   f"{esc(describe_bytes(v))}</text>")
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0 + w}" y2="{y0}" stroke="#666" '
               f'stroke-dasharray="2,2"/><text x="{x0 + w}" y="{y0 - 18}" text-anchor="end" '
               f'fill="#444">arena top: {esc(describe_bytes(plan.arena_bytes))}</text>')
    out.append("</g>")
    return out


def save_picture(plan: MemoryPlan, path: str, title: str = "") -> str:
    """Write the arena picture: SVG for *.svg (no dependency), else PNG through matplotlib."""
    if path.lower().endswith(".svg"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg(plan, title=title))
        return path
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptionsError(
            f"writing {path!r} needs matplotlib (pip install 'opwarden[plot]'); "
            "or give a .svg path, which needs nothing"
        ) from None
    fig, ax = plt.subplots(figsize=(13, 7))
    _draw(ax, plan, title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _draw(ax: Any, plan: MemoryPlan, title: str) -> None:
    """The SVG's picture on a matplotlib axes: buffers, labels, legend, peak."""
    from matplotlib.patches import Patch, Rectangle

    steps, arena = max(len(plan.steps), 1), max(plan.arena_bytes, 1)
    at, top = peak(plan)
    ax.set_xlim(0, steps)
    ax.set_ylim(0, arena)
    # pixels per step and per byte (13 x 7 in at 110 dpi, the axes ~78% of each), and
    # 7 pt text in pixels, to decide which labels fit
    px_w, px_h, size = 13 * 110 * 0.78 / steps, 7 * 110 * 0.77 / arena, 7 * 110 / 72
    for i, b in enumerate(plan.buffers):
        wid = b.last - b.first + 1
        ax.add_patch(Rectangle((b.first, b.offset), wid, b.nbytes,
                               facecolor=KINDS[_kind(b)][1], alpha=0.95 if i % 2 else 0.7,
                               edgecolor="#333", linewidth=0.4))
        lines = _label_lines(b, wid * px_w, b.nbytes * px_h, size)
        if lines:
            ax.text(b.first + 2 / px_w, b.offset + b.nbytes - 2 / px_h, "\n".join(lines),
                    fontsize=7, va="top")
    xt = [int(v) for v in nice_ticks(steps - 1, 12) if v <= steps - 1 and v == int(v)]
    ax.set_xticks([v + 0.5 for v in xt], [str(v) for v in xt])
    ax.axvline(at + 0.5, color="#D55E00", linestyle="--", linewidth=2)
    ax.text(at + 0.6, arena * 0.98, f"peak {describe_bytes(top)} at step {at}",
            color="#D55E00", fontweight="bold", va="top")
    ticks = [v for v in byte_ticks(arena, 6) if v <= arena]
    ax.set_yticks(ticks, [describe_bytes(v) for v in ticks])
    ax.set_xlabel("step (the order nodes run in)")
    ax.set_ylabel("arena offset")
    ax.set_title((f"Memory plan: {title}\n" if title else "Memory plan\n")
                 + _caption(plan, at, top), fontsize=10)
    handles = [Patch(facecolor=c, edgecolor="#333", label=label) for _, c, label in KINDS]
    ax.legend(handles=handles, loc="upper right", fontsize=8)
