"""A line chart as inline SVG text: lines with markers, optional ± bands, axes, ticks, legend.

No fonts, images or scripts are referenced: the markup renders the same offline in any browser.
Coordinates are in CSS pixels; ``line_chart`` returns one ``<svg>`` element (HTML-embeddable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif"
GRID = "#e3e3e3"
AXIS = "#555555"
TEXT = "#222222"

LEFT, RIGHT, TOP, BOTTOM = 64, 18, 34, 46  # margins around the plot area, px
LEGEND_ROW = 20  # px per legend entry, below the plot


@dataclass
class Point:
    """One marker: ``y`` at ``x``, a band ``y ± spread`` (None: no band), a hover ``note``."""

    x: float
    y: float
    spread: float | None = None
    note: str = ""


@dataclass
class Line:
    """One series on a chart: its legend ``label``, CSS ``colour``, ``points`` (ascending x) and an
    optional SVG ``dash`` pattern (``"6 3"``)."""

    label: str
    colour: str
    points: list[Point] = field(default_factory=list)
    dash: str | None = None


def nice_step(span: float, count: int, integer: bool = False) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten; no 2.5 and at least 1 if ``integer``)
    giving about ``count`` intervals in ``span``."""
    raw = span / max(count, 1)
    if integer and raw <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for mantissa in (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10):
        if mantissa * power >= raw * 0.999:
            return mantissa * power
    return 10 * power


def ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (about ``count`` intervals); whole numbers if ``integer``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"tick range must be finite, got {lo}..{hi}")
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = 1.0 if integer or lo == 0 else abs(lo) * 0.05
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, count, integer)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def tick_text(value: float, step: float) -> str:
    """``value`` with as many decimals as ``step`` needs (``0.25`` -> 2, ``5`` -> 0)."""
    decimals = 0
    while decimals < 10 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    text = f"{value:.{decimals}f}"
    return "0" if text.strip("-0.") == "" else text


def tick_labels(values: list[float]) -> list[str]:
    """Labels of evenly spaced ticks; from 10 000 up in thousands, millions or billions
    (``170k``, ``1.5M``) so that they stay short."""
    step = values[1] - values[0] if len(values) > 1 else 1.0
    largest = max(abs(v) for v in values)
    for scale, suffix, least in ((1e9, "G", 1e9), (1e6, "M", 1e6), (1e3, "k", 1e4)):
        if largest >= least:
            return [tick_text(v / scale, step / scale) + ("" if v == 0 else suffix) for v in values]
    return [tick_text(v, step) for v in values]


def line_chart(lines: list[Line], *, title: str, x_label: str, y_label: str, width: int = 720,
               height: int = 340, legend: bool = True, integer_x: bool = True) -> str:
    """An SVG chart of ``lines`` (``width`` x ``height`` px plot frame, plus one legend row per
    line below it when ``legend``). Bands are drawn under their line at 18 % opacity."""
    all_points = [p for line in lines for p in line.points]
    total_height = height + (LEGEND_ROW * len(lines) + 8 if legend and lines else 0)
    out = [f'<svg class="chart" width="{width}" height="{total_height}" '
           f'viewBox="0 0 {width} {total_height}" role="img" aria-label="{escape(title)}" '
           f'style="{FONT}">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{width}" height="{total_height}" fill="#ffffff"/>',
           f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14" font-weight="600" '
           f'fill="{TEXT}">{escape(title)}</text>']
    x0, x1, y0, y1 = LEFT, width - RIGHT, height - BOTTOM, TOP  # pixel box: y grows downwards
    if not all_points:
        out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" '
                   f'stroke="{AXIS}"/>')
        out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{(y0 + y1) / 2:.1f}" text-anchor="middle" '
                   f'font-size="13" fill="{AXIS}">no data</text>')
    else:
        xs = [p.x for p in all_points]
        lows = [p.y - (p.spread or 0.0) for p in all_points]
        highs = [p.y + (p.spread or 0.0) for p in all_points]
        x_ticks = ticks(min(xs), max(xs), count=min(8, max(1, int(max(xs) - min(xs)))), integer=integer_x)
        y_ticks = ticks(min(lows), max(highs), count=5)
        x_min, x_max, y_min, y_max = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

        def px(x: float) -> float:
            return x0 + (x - x_min) / (x_max - x_min) * (x1 - x0)

        def py(y: float) -> float:
            return y0 - (y - y_min) / (y_max - y_min) * (y0 - y1)

        for value, text in zip(y_ticks, tick_labels(y_ticks), strict=True):
            y = py(value)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="{GRID}"/>')
            out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                       f'fill="{TEXT}">{text}</text>')
        for value, text in zip(x_ticks, tick_labels(x_ticks), strict=True):
            x = px(value)
            out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 5}" stroke="{AXIS}"/>')
            out.append(f'<text x="{x:.1f}" y="{y0 + 18}" text-anchor="middle" font-size="11" '
                       f'fill="{TEXT}">{text}</text>')
        out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" '
                   f'stroke="{AXIS}"/>')
        for line in lines:
            out.extend(_line_markup(line, px, py))
    out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{height - 8}" text-anchor="middle" font-size="12" '
               f'fill="{TEXT}">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16 {(y0 + y1) / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12" fill="{TEXT}">{escape(y_label)}</text>')
    if legend:
        for i, line in enumerate(lines):
            y = height + 4 + i * LEGEND_ROW
            dash = f' stroke-dasharray="{line.dash}"' if line.dash else ""
            out.append(f'<line x1="{x0}" y1="{y + 8}" x2="{x0 + 28}" y2="{y + 8}" stroke="{line.colour}" '
                       f'stroke-width="3"{dash}/>')
            out.append(f'<text x="{x0 + 36}" y="{y + 12}" font-size="12" fill="{TEXT}">'
                       f"{escape(line.label)}</text>")
    out.append("</svg>")
    return "\n".join(out)


def _line_markup(line: Line, px, py) -> list[str]:
    out = []
    banded = [p for p in line.points if p.spread]
    if len(banded) >= 2:
        upper = [f"{px(p.x):.1f},{py(p.y + p.spread):.1f}" for p in banded]
        lower = [f"{px(p.x):.1f},{py(p.y - p.spread):.1f}" for p in reversed(banded)]
        out.append(f'<polygon class="band" points="{" ".join(upper + lower)}" fill="{line.colour}" '
                   f'fill-opacity="0.18" stroke="none"/>')
    dash = f' stroke-dasharray="{line.dash}"' if line.dash else ""
    if len(line.points) >= 2:
        coords = " ".join(f"{px(p.x):.1f},{py(p.y):.1f}" for p in line.points)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{line.colour}" stroke-width="2.2" '
                   f'stroke-linejoin="round"{dash}/>')
    for p in line.points:
        out.append(f'<circle cx="{px(p.x):.1f}" cy="{py(p.y):.1f}" r="3.2" fill="{line.colour}">'
                   f"<title>{escape(p.note or f'{line.label}: {p.y:g} at {p.x:g}')}</title></circle>")
    return out
