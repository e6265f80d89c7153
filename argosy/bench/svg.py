"""Small inline SVG charts (line and scatter) with nice axis ticks: no plotting library needed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
MAX_POINTS = 2000  # per series: more adds bytes, not information, at this size


@dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float]
    color: str | None = None


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)  # the ticks cover [lo, hi]
    return [round(i * step, 12) for i in range(first, max(last, first + 1) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.3g}"
    return f"{v:.6g}" if v == int(v) else f"{v:.3g}"


def thin(xs: list[float], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """Every k-th point, keeping the last (a CDF must still reach 1)."""
    if len(xs) <= limit:
        return xs, ys
    k = math.ceil(len(xs) / limit)
    idx = list(range(0, len(xs), k))
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Decades covering [lo, hi] (values already log10)."""
    first, last = math.floor(lo + 1e-9), math.ceil(hi - 1e-9)
    return [float(t) for t in range(first, max(last, first + 1) + 1)]


def _to_log(s: Series, log_x: bool, log_y: bool) -> Series:
    pairs = [(math.log10(x) if log_x else x, math.log10(y) if log_y else y)
             for x, y in zip(s.xs, s.ys, strict=False) if (not log_x or x > 0) and (not log_y or y > 0)]
    return Series(s.name, [x for x, _ in pairs], [y for _, y in pairs], s.color)


def chart(series: list[Series], title: str, x_label: str, y_label: str, *, kind: str = "line",
          width: int = 560, height: int = 300, y_min: float | None = 0.0, log_x: bool = False, log_y: bool = False,
          hlines: tuple[tuple[float, str], ...] = ()) -> str:
    """hlines: (y, label) reference lines across the plot (an SLO). Log axes drop points <= 0."""
    left, right, top, bottom = 64, 16, 42, 46
    pw, ph = width - left - right, height - top - bottom
    if log_x or log_y:
        series = [_to_log(s, log_x, log_y) for s in series]
        hlines = tuple((math.log10(y) if log_y else y, label) for y, label in hlines if not log_y or y > 0)
        y_min = None if log_y else y_min
    pts = [(x, y) for s in series for x, y in zip(s.xs, s.ys, strict=False)] + [(None, y) for y, _ in hlines]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f'<text x="{width / 2}" y="18" text-anchor="middle" class="title">{escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "\n".join(out)
    xs_all = [p[0] for p in pts if p[0] is not None] or [0.0]
    lo_y = min(p[1] for p in pts) if y_min is None else min(y_min, min(p[1] for p in pts))
    xt = (_log_ticks if log_x else nice_ticks)(min(xs_all), max(xs_all))
    yt = (_log_ticks if log_y else nice_ticks)(lo_y, max(p[1] for p in pts))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    sx = lambda x: left + (x - x0) / ((x1 - x0) or 1) * pw
    sy = lambda y: top + ph - (y - y0) / ((y1 - y0) or 1) * ph
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for t in xt:
        out.append(f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{top + ph}" class="grid"/>'
                   f'<text x="{sx(t):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                   f'{f"{10 ** t:g}" if log_x else _fmt(t)}</text>')
    for t in yt:
        out.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + pw}" y2="{sy(t):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">'
                   f'{f"{10 ** t:g}" if log_y else _fmt(t)}</text>')
    for y, label in hlines:
        out.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + pw}" y2="{sy(y):.1f}" stroke="#d62728" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"/><text x="{left + pw - 4}" y="{sy(y) - 5:.1f}" '
                   f'text-anchor="end" class="legend" fill="#d62728">{escape(label)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(y_label)}</text>')
    for i, s in enumerate(series):
        color = s.color or COLORS[i % len(COLORS)]
        xs, ys = thin(list(s.xs), list(s.ys))
        if kind == "scatter":
            out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}" fill-opacity="0.6"/>'
                       for x, y in zip(xs, ys, strict=False))
        else:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=False))
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8"/>')
            if len(xs) <= 12:  # few points (a sweep): mark them
                out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>'
                           for x, y in zip(xs, ys, strict=False))
        lx = left + sum(24 + 6.5 * len(p.name) for p in series[:i])  # one row above the plot
        out.append(f'<rect x="{lx:.0f}" y="{top - 15}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14:.0f}" y="{top - 6}" class="legend">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def cdf(values: list[float]) -> tuple[list[float], list[float]]:
    v = sorted(values)
    n = len(v)
    return v, [(i + 1) / n for i in range(n)]
