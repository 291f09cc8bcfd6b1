"""Small charts drawn on the server as inline SVG: no script, no external asset. Each is a
<figure> with a caption, an SVG with <title> and <desc>, and its numbers as a table, so a
screen reader or a text browser gets the same data. Every mark carries its value
(`data-series`, `data-value`) and a <title> tooltip."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

#: Drawing size (SVG user units; the SVG scales to its box).
WIDTH = 480
HEIGHT = 170
#: Plot margins: left (y labels), right, top, bottom (x labels).
LEFT, RIGHT, TOP, BOTTOM = 40, 8, 10, 22
#: Colours of the series, in order (readable on white, distinct for most colour vision).
PALETTE = ("#1f6feb", "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#bf3989", "#57606a")


@dataclass
class Series:
    """One series: its label, its key (`data-series`), and a value per x position (None:
    nothing known there, drawn as a gap)."""

    label: str
    key: str
    values: Sequence[float | None]
    color: str = PALETTE[0]
    dashed: bool = False


@dataclass
class Row:
    """One horizontal bar: a label, a value on a 0..`top` scale and the text shown."""

    label: str
    value: float
    text: str
    color: str = PALETTE[0]


def _nice_top(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above `value` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


def _number(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _frame(chart_id: str, title: str, desc: str, body: list[str]) -> str:
    return (
        f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" preserveAspectRatio="xMinYMin meet">'
        f'<title id="{chart_id}-title">{escape(title)}</title>'
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>' + "".join(body) + "</svg>"
    )


def _axes(top: float, labels: Sequence[str]) -> list[str]:
    """Grid lines with y labels at 0, half and top; x labels at the first, middle, last."""
    plot_h = HEIGHT - TOP - BOTTOM
    out = []
    for frac in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - frac)
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d0d7de" stroke-width="1"/>'
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#57606a">{_number(top * frac)}</text>'
        )
    if labels:
        step = (WIDTH - LEFT - RIGHT) / len(labels)
        for i in sorted({0, len(labels) // 2, len(labels) - 1}):
            x = LEFT + step * (i + 0.5)
            out.append(
                f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11" '
                f'fill="#57606a">{escape(labels[i])}</text>'
            )
    return out


def _legend(series: Sequence[Series]) -> str:
    items = "".join(
        f'<li><span class="swatch{" dashed" if s.dashed else ""}" '
        f'style="background:{s.color}"></span>{escape(s.label)}</li>'
        for s in series
    )
    return f'<ul class="legend">{items}</ul>'


def _table(caption: str, labels: Sequence[str], series: Sequence[Series]) -> str:
    head = "".join(f"<th scope='col'>{escape(s.label)}</th>" for s in series)
    rows = "".join(
        f"<tr><th scope='row'>{escape(label)}</th>"
        + "".join(
            f"<td>{'-' if s.values[i] is None else _number(s.values[i] or 0)}</td>" for s in series
        )
        + "</tr>"
        for i, label in enumerate(labels)
    )
    return (
        f'<details class="chart-data"><summary>The numbers</summary><table>'
        f"<caption>{escape(caption)}</caption><thead><tr><th scope='col'>time</th>{head}</tr>"
        f"</thead><tbody>{rows}</tbody></table></details>"
    )


def _figure(chart_id: str, title: str, svg: str, extra: str, attrs: dict[str, object]) -> Markup:
    data = "".join(f' data-{k}="{escape(str(v))}"' for k, v in attrs.items())
    return Markup(
        f'<figure class="chart" id="{chart_id}"{data}><figcaption>{escape(title)}</figcaption>'
        f"{svg}{extra}</figure>"
    )


def _plot(labels: Sequence[str], series: Sequence[Series]) -> tuple[float, float, float, list[str]]:
    """The y scale's top, the plot's height, the width per label, and the axes drawn."""
    top = _nice_top(max((v or 0 for s in series for v in s.values), default=0))
    step = (WIDTH - LEFT - RIGHT) / max(1, len(labels))
    return top, HEIGHT - TOP - BOTTOM, step, _axes(top, labels)


def _chart(
    chart_id: str, title: str, desc: str, labels: Sequence[str], series: Sequence[Series],
    body: list[str], attrs: dict[str, object],
) -> Markup:  # fmt: skip
    svg = _frame(chart_id, title, desc, body)
    return _figure(chart_id, title, svg, _legend(series) + _table(title, labels, series), attrs)


def bar_chart(
    chart_id: str,
    title: str,
    desc: str,
    labels: Sequence[str],
    series: Sequence[Series],
    **attrs: object,
) -> Markup:
    """Grouped bars: one group per label, one bar per series."""
    top, plot_h, step, body = _plot(labels, series)
    width = step * 0.8 / max(1, len(series))
    for i, label in enumerate(labels):
        for j, s in enumerate(series):
            v = s.values[i] or 0
            h = plot_h * v / top
            x = LEFT + step * i + step * 0.1 + width * j
            body.append(
                f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{width:.1f}" '
                f'height="{h:.1f}" fill="{s.color}" data-series="{escape(s.key)}" '
                f'data-value="{_number(v)}"><title>{escape(label)}: {_number(v)} '
                f"{escape(s.label)}</title></rect>"
            )
    return _chart(chart_id, title, desc, labels, series, body, attrs)


def line_chart(
    chart_id: str,
    title: str,
    desc: str,
    labels: Sequence[str],
    series: Sequence[Series],
    **attrs: object,
) -> Markup:
    """Lines with a dot per known value; unknown values (None) leave a gap."""
    top, plot_h, step, body = _plot(labels, series)
    for s in series:
        runs: list[list[str]] = [[]]
        for i, v in enumerate(s.values):
            if v is None:
                runs.append([])
                continue
            x, y = LEFT + step * (i + 0.5), TOP + plot_h * (1 - v / top)
            runs[-1].append(f"{x:.1f},{y:.1f}")
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{s.color}" '
                f'data-series="{escape(s.key)}" data-value="{_number(v)}"><title>'
                f"{escape(labels[i])}: {_number(v)} {escape(s.label)}</title></circle>"
            )
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        body += [
            f'<polyline points="{" ".join(run)}" fill="none" stroke="{s.color}" '
            f'stroke-width="2"{dash}/>'
            for run in runs
            if len(run) > 1
        ]
    return _chart(chart_id, title, desc, labels, series, body, attrs)


def hbar_chart(
    chart_id: str, title: str, desc: str, rows: Sequence[Row], top: float, **attrs: object
) -> Markup:
    """One horizontal bar per row on a 0..`top` scale, its text beside it."""
    label_w, bar_w, text_w, row_h = 175, 190, 165, 22
    width, height = label_w + bar_w + text_w, TOP + row_h * max(1, len(rows)) + 4
    body = []
    for i, r in enumerate(rows):
        y = TOP + row_h * i
        w = bar_w * min(1.0, r.value / top) if top > 0 else 0
        body.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"{escape(r.label)}</text>"
            f'<rect x="{label_w}" y="{y + 4}" width="{bar_w}" height="14" fill="#eaeef2"/>'
            f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="14" fill="{r.color}" '
            f'data-series="{escape(r.label)}" data-value="{r.value:.3f}">'
            f"<title>{escape(r.label)}: {escape(r.text)}</title></rect>"
            f'<text x="{label_w + bar_w + 6}" y="{y + 15}" font-size="12">{escape(r.text)}</text>'
        )
    svg = _frame(chart_id, title, desc, body).replace(
        f'viewBox="0 0 {WIDTH} {HEIGHT}"', f'viewBox="0 0 {width} {height}"', 1
    )
    table = (
        '<details class="chart-data"><summary>The numbers</summary><table>'
        f"<caption>{escape(title)}</caption><tbody>"
        + "".join(
            f"<tr><th scope='row'>{escape(r.label)}</th><td>{escape(r.text)}</td></tr>"
            for r in rows
        )
        + "</tbody></table></details>"
    )
    return _figure(chart_id, title, svg, table, attrs)
