"""Memory plan reports: a table, and a picture of the arena over time (SVG or matplotlib PNG)."""

from __future__ import annotations

import colorsys
import html
from typing import Any, Literal

from opwarden.errors import OptionsError, describe_bytes
from opwarden.plan.planner import MemoryPlan


def summary_lines(plan: MemoryPlan) -> list[str]:
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


def _color(i: int) -> str:
    r, g, b = colorsys.hls_to_rgb((i * 0.618033988749895) % 1.0, 0.6, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def svg(plan: MemoryPlan, width: int = 1000, height: int = 600) -> str:
    """The arena over time: x = step, y = offset, one rectangle per buffer."""
    pad_l, pad_b, pad_t = 70, 40, 30
    w, h = width - pad_l - 10, height - pad_b - pad_t
    steps = max(len(plan.steps), 1)
    top = max(plan.arena_bytes, 1)
    sx, sy = w / steps, h / top
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{pad_l}" y="18">arena {html.escape(describe_bytes(plan.arena_bytes))}, '
        f"lower bound {html.escape(describe_bytes(plan.lower_bound_bytes))}, "
        f"{len(plan.buffers)} buffers</text>",
    ]
    for i, b in enumerate(plan.buffers):
        x = pad_l + b.first * sx
        y = pad_t + h - (b.offset + b.nbytes) * sy
        bw = max((b.last - b.first + 1) * sx, 1.0)
        bh = max(b.nbytes * sy, 0.5)
        tip = html.escape(
            f"{b.name} ({b.producer}): {describe_bytes(b.nbytes)} at {b.offset}, "
            f"steps {b.first}-{b.last}"
        )
        out.append(
            f'<rect x="{x:.2f}" y="{y:.2f}" width="{bw:.2f}" height="{bh:.2f}" '
            f'fill="{_color(i)}" stroke="#333" stroke-width="0.3"><title>{tip}</title></rect>'
        )
    # axes
    out.append(
        f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="black"/>'
    )
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="black"/>')
    out.append(f'<text x="{pad_l + w / 2:.0f}" y="{height - 8}">step</text>')
    for k in range(5):
        frac = k / 4
        y = pad_t + h - frac * h
        out.append(
            f'<text x="4" y="{y + 4:.0f}">{html.escape(describe_bytes(frac * top))}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def save_picture(plan: MemoryPlan, path: str) -> str:
    """Write the arena picture: SVG for *.svg (no dependency), else PNG through matplotlib."""
    if path.lower().endswith(".svg"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg(plan))
        return path
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise OptionsError(
            f"writing {path!r} needs matplotlib (pip install 'opwarden[plot]'); "
            "or give a .svg path, which needs nothing"
        ) from None
    fig, ax = plt.subplots(figsize=(12, 6))
    for i, b in enumerate(plan.buffers):
        ax.add_patch(
            Rectangle(
                (b.first, b.offset),
                b.last - b.first + 1,
                b.nbytes,
                facecolor=_color(i),
                edgecolor="#333",
                linewidth=0.3,
            )
        )
    ax.set_xlim(0, max(len(plan.steps), 1))
    ax.set_ylim(0, max(plan.arena_bytes, 1))
    ax.set_xlabel("step")
    ax.set_ylabel("offset (bytes)")
    ax.set_title(
        f"arena {describe_bytes(plan.arena_bytes)}, lower bound "
        f"{describe_bytes(plan.lower_bound_bytes)}"
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
