"""Server-rendered SVG line charts: no JavaScript library, nothing fetched from the internet.

The live refresh asks for the same SVG again (as JSON strings) rather than drawing in
the browser, so there is one renderer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import escape

WIDTH, HEIGHT = 520, 170
LEFT, RIGHT, TOP, BOTTOM = 56, 10, 22, 22
MAX_BRIDGED_GAP = 4  # empty buckets a line may cross


@dataclass
class Line:
    name: str
    values: Sequence[float | None]
    color: str


def percent(v: float) -> str:
    return f"{v * 100:.0f}%"


def millis(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s"


def _segments(points: list[tuple[float, float] | None]) -> list[list[tuple[float, float]]]:
    """Runs of points to join with a line. A few empty buckets are bridged (samples need not
    fall in every bucket); a longer gap (the process was down) breaks the line."""
    runs: list[list[tuple[float, float]]] = []
    run: list[tuple[float, float]] = []
    last = None
    for i, p in enumerate(points):
        if p is None:
            continue
        if last is not None and i - last > MAX_BRIDGED_GAP + 1:
            runs.append(run)
            run = []
        run.append(p)
        last = i
    if run:
        runs.append(run)
    return runs


def _clock(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).strftime("%H:%M")
    except ValueError:
        return ""


def line_chart(
    *, chart_id: str, title: str, lines: Sequence[Line], start: str, end: str,
    y_max: float | None = None, y_format: Callable[[float], str] = percent,
) -> str:
    """An SVG chart of equally spaced points; y from 0 to y_max (or the data's maximum)."""
    values = [v for line in lines for v in line.values if v is not None]
    top = y_max if y_max is not None else (max(values) if values else 1.0) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = max((len(line.values) for line in lines), default=1)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)
        y = TOP + plot_h * (1 - min(max(v / top, 0.0), 1.0))
        return round(x, 1), round(y, 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'data-points="{len(values)}">',
        f'<text x="{LEFT}" y="14" class="chart-title">{escape(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{y + 4}" text-anchor="end">'
                     f"{escape(y_format(top * frac))}</text>")
    parts.append(f'<text class="axis" x="{LEFT}" y="{HEIGHT - 6}">{escape(_clock(start))}</text>')
    parts.append(f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 6}" text-anchor="end">'
                 f"{escape(_clock(end))}</text>")
    legend_x = WIDTH - RIGHT
    for line in reversed(lines):
        parts.append(f'<text class="legend" x="{legend_x}" y="14" text-anchor="end" '
                     f'fill="{line.color}">{escape(line.name)}</text>')
        legend_x -= 8 + 7 * len(line.name)
    if not values:
        parts.append(f'<text class="empty" x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" '
                     'text-anchor="middle">no samples yet</text>')
    for line in lines:
        points = [None if v is None else xy(i, v) for i, v in enumerate(line.values)]
        for run in _segments(points):
            if len(run) > 1:
                coords = " ".join(f"{x},{y}" for x, y in run)
                parts.append(f'<polyline class="series" fill="none" stroke="{line.color}" '
                             f'points="{coords}"/>')
        for p in points:
            if p is not None:
                parts.append(f'<circle class="point" cx="{p[0]}" cy="{p[1]}" r="2" '
                             f'fill="{line.color}"/>')
    parts.append("</svg>")
    return "".join(parts)


def dashboard_charts(points: dict) -> dict[str, str]:
    """The three charts of the dashboard from history.series()."""
    common = {"start": points["start"], "end": points["end"]}
    return {
        "hit_rate": line_chart(
            chart_id="chart-hit-rate", title="Prefix cache hit rate (tokens)", y_max=1.0,
            lines=[Line("hit rate", points["hit_rate"], "#2e7d32")], **common),
        "blocks": line_chart(
            chart_id="chart-blocks", title="KV blocks (share of pool)", y_max=1.0,
            lines=[Line("used", points["kv_usage"], "#c62828"),
                   Line("cached free", points["cached_free"], "#1565c0")], **common),
        "ttft": line_chart(
            chart_id="chart-ttft", title="Time to first token", y_format=millis,
            lines=[Line("p50", points["ttft_p50"], "#6a1b9a"),
                   Line("p95", points["ttft_p95"], "#ef6c00")], **common),
    }
