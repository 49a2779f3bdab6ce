"""Drawing helpers the pictures share: the placement graph (place/picture.py), the memory plan
(plan/report.py) and the flame graph (trace/report.py).

Plain SVG text with no dependency. Colours come from colour-blind-safe palettes (Okabe and
Ito's eight, then Paul Tol's muted set); a key (an op type, a device) keeps its colour from one
picture to the next where it can: common op types have fixed colours, others take a colour
from a hash of their name, moving to the next free one only on a clash within one picture.
Text widths are estimated (no font metrics without a renderer): labels are drawn only where
the estimate fits, and every box keeps its full text as a hover tooltip too.
"""

from __future__ import annotations

import html
import math
import zlib

# Okabe-Ito (less black), then Paul Tol's "muted" scheme: distinguishable under the common
# colour-vision deficiencies; dark text stays readable on every one of them.
PALETTE = (
    "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
    "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#AA4499", "#882255",
    "#332288", "#BBBBBB",
)
# Light text reads better on these (dark) palette entries.
_DARK = {"#0072B2", "#117733", "#882255", "#332288", "#AA4499", "#D55E00"}
# Fixed colours for the op types most models spend their time in, so a FusedConv is the same
# blue in every flame graph.
FIXED = {
    "FusedConv": "#0072B2", "Conv": "#56B4E9", "FusedGemm": "#009E73", "Gemm": "#44AA99",
    "MatMul": "#117733", "FusedMatMul": "#999933", "FusedElementwise": "#E69F00",
    "MaxPool": "#CC79A7", "AveragePool": "#AA4499", "Relu": "#F0E442", "Concat": "#D55E00",
    "Add": "#DDCC77", "BatchNormalization": "#88CCEE", "Softmax": "#CC6677",
    "DeviceCopy": "#BBBBBB", "Transpose": "#882255", "Reshape": "#332288",
}
FONT = "DejaVu Sans, Verdana, Arial, sans-serif"


def esc(s: object) -> str:
    """`s` as SVG text or attribute content."""
    return html.escape(str(s), quote=True)


def colours(keys: list[str], fixed: dict[str, str] | None = None) -> dict[str, str]:
    """A distinct palette colour per key (stable across pictures where there is no clash)."""
    fixed = FIXED if fixed is None else fixed
    out: dict[str, str] = {}
    used: set[str] = set()
    for k in keys:
        c = fixed.get(k)
        if c is not None and c not in used:
            out[k] = c
            used.add(c)
    free = [c for c in PALETTE if c not in used]
    for k in keys:
        if k in out:
            continue
        if not free:  # more keys than colours: reuse, still by hash
            out[k] = PALETTE[zlib.crc32(k.encode()) % len(PALETTE)]
            continue
        c = free[zlib.crc32(k.encode()) % len(free)]
        free.remove(c)
        out[k] = c
    return out


def text_colour(fill: str) -> str:
    """Black or white, whichever reads on `fill`."""
    return "#ffffff" if fill in _DARK else "#000000"


def text_width(s: str, size: float) -> float:
    """Estimated width in pixels of `s` in the sans-serif font at `size` px."""
    return len(s) * size * _EM


_EM = 0.62  # DejaVu Sans' mean advance per character, in font sizes (digits 0.64, a-z 0.6)


def fit(label: str, width: float, size: float, suffix: str = "") -> str:
    """`label` + `suffix`, the label shortened with an ellipsis to fit `width` px; the label
    alone when the suffix leaves under 4 characters of it; '' when not 3 characters fit."""
    if text_width(label + suffix, size) <= width:
        return label + suffix
    n = int((width - text_width(suffix, size)) / (size * _EM)) - 1
    if suffix and n >= 4:
        return label[:n] + "…" + suffix
    if suffix:
        return fit(label, width, size)
    n = int(width / (size * _EM)) - 1
    return label[:n] + "…" if n >= 3 else ""


def nice_ticks(top: float, n: int = 6) -> list[float]:
    """Round tick values from 0 to at least `top`, about `n` of them (1, 2, 5 times 10^k)."""
    if top <= 0:
        return [0.0]
    raw = top / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    k = math.ceil(top / step - 1e-9)
    return [i * step for i in range(k + 1)]


def tick_label(v: float) -> str:
    """A tick value without trailing zeros."""
    return f"{v:.3f}".rstrip("0").rstrip(".") if v else "0"


def document(width: float, height: float, title: str, body: list[str]) -> str:
    """An SVG document: white background, `title` as its accessible title, then `body`."""
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}" font-size="11">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="white"/>',
        *body,
        "</svg>",
    ])


def heading(x: float, y: float, text: str, sub: str = "") -> list[str]:
    """The picture's visible title (bold) and a smaller line under it."""
    out = [f'<text class="title" x="{x}" y="{y}" font-size="15" font-weight="bold">'
           f"{esc(text)}</text>"]
    if sub:
        out.append(f'<text class="subtitle" x="{x}" y="{y + 17}" font-size="11" '
                   f'fill="#444">{esc(sub)}</text>')
    return out


def legend(items: list[tuple[str, str, str]], x: float, y: float, width: float
           ) -> tuple[list[str], float]:
    """Swatches with labels, flowing in rows within `width`: items are (colour, label, css
    class of the swatch's outline: "" or "dashed"); returns (elements, height used)."""
    out = ['<g class="legend">']
    cx, cy, row = x, y, 18
    for fill, label, style in items:
        w = 16 + text_width(label, 11) + 18
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + row
        dash = ' stroke-dasharray="3,2" stroke-width="2"' if style == "dashed" else ""
        out.append(
            f'<rect x="{cx:.1f}" y="{cy:.1f}" width="12" height="12" fill="{fill}" '
            f'stroke="#333"{dash}/>'
            f'<text class="legend-entry" x="{cx + 16:.1f}" y="{cy + 10:.1f}">{esc(label)}</text>'
        )
        cx += w
    out.append("</g>")
    return out, (cy - y) + row if items else 0.0
