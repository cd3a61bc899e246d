"""Deterministic SVG charts for the reports: a line chart and a grouped bar chart.

Written by hand rather than with a plotting library so that the same data gives the same
bytes: a fixed canvas, a fixed palette, coordinates rounded to two decimals, generic font
families only (nothing is loaded from anywhere) and every text XML-escaped. Each function
returns a standalone SVG document's text; ``for_html`` turns one into an element to inline
in an HTML page. Each series is one ``<g class="series" data-series="NAME">`` so tests and
readers can find it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

WIDTH = 720
HEIGHT = 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 24, 64, 72
_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
            "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
_NS = ' xmlns="http://www.w3.org/2000/svg"'

Point = tuple[float, float]


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _n(value: float) -> str:
    """A coordinate: two decimals, no trailing zeros, never ``-0``."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks if span > 0 else 1.0
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10.0 * magnitude


def _y_axis(top_value: float, *, percent: bool) -> tuple[float, list[float]]:
    """The axis maximum and its ticks: 0-100 % for rates, a nice round top for counts."""
    if percent:
        return 1.0, [i / 5 for i in range(6)]
    step = _nice_step(top_value)
    if top_value >= 1:
        step = max(step, 1.0)
    top = step * max(1, math.ceil(top_value / step - 1e-9))
    return top, [step * i for i in range(round(top / step) + 1)]


def _tick_label(value: float, *, percent: bool) -> str:
    if percent:
        return f"{value * 100:.0f}%"
    return f"{value:g}"


def _value_label(value: float, *, percent: bool) -> str:
    if percent:
        return f"{value * 100:.1f}%"
    return f"{value:g}"


class _Canvas:
    def __init__(self, title: str) -> None:
        self.parts: list[str] = [
            f'<svg{_NS} width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role="img" aria-label="{_esc(title)}" font-family="sans-serif" font-size="12">',
            f"<title>{_esc(title)}</title>",
            f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
            f'<text x="{WIDTH // 2}" y="22" text-anchor="middle" font-size="15" '
            f'font-weight="bold">{_esc(title)}</text>',
        ]

    @property
    def plot_left(self) -> float:
        return float(_LEFT)

    @property
    def plot_right(self) -> float:
        return float(WIDTH - _RIGHT)

    @property
    def plot_top(self) -> float:
        return float(_TOP)

    @property
    def plot_bottom(self) -> float:
        return float(HEIGHT - _BOTTOM)

    def y_of(self, value: float, top: float) -> float:
        span = self.plot_bottom - self.plot_top
        return self.plot_bottom - (value / top if top else 0.0) * span

    def legend(self, names: Sequence[str]) -> None:
        x = self.plot_left
        for i, name in enumerate(names):
            color = _PALETTE[i % len(_PALETTE)]
            self.parts.append(
                f'<g class="legend-item"><rect x="{_n(x)}" y="34" width="12" height="12" '
                f'fill="{color}"/><text x="{_n(x + 16)}" y="44">{_esc(name)}</text></g>')
            x += 28 + 7 * len(name)

    def y_axis(self, top: float, ticks: Sequence[float], label: str, *, percent: bool) -> None:
        left, right = self.plot_left, self.plot_right
        self.parts.append('<g class="axis y-axis">')
        for tick in ticks:
            y = _n(self.y_of(tick, top))
            self.parts.append(
                f'<line x1="{_n(left)}" y1="{y}" x2="{_n(right)}" y2="{y}" stroke="#e0e0e0"/>'
                f'<text x="{_n(left - 6)}" y="{y}" dy="4" text-anchor="end">'
                f"{_esc(_tick_label(tick, percent=percent))}</text>")
        mid = _n((self.plot_top + self.plot_bottom) / 2)
        self.parts.append(
            f'<line x1="{_n(left)}" y1="{_n(self.plot_top)}" x2="{_n(left)}" '
            f'y2="{_n(self.plot_bottom)}" stroke="#333333"/>'
            f'<text x="16" y="{mid}" text-anchor="middle" transform="rotate(-90 16 {mid})">'
            f"{_esc(label)}</text></g>")

    def x_axis(self, ticks: Sequence[tuple[float, str]], label: str, *, slant: bool) -> None:
        bottom = self.plot_bottom
        self.parts.append(
            f'<g class="axis x-axis"><line x1="{_n(self.plot_left)}" y1="{_n(bottom)}" '
            f'x2="{_n(self.plot_right)}" y2="{_n(bottom)}" stroke="#333333"/>')
        for x, text in ticks:
            xs, ys = _n(x), _n(bottom + 16)
            self.parts.append(f'<line x1="{xs}" y1="{_n(bottom)}" x2="{xs}" '
                              f'y2="{_n(bottom + 4)}" stroke="#333333"/>')
            if slant:
                self.parts.append(f'<text x="{xs}" y="{ys}" text-anchor="end" '
                                  f'transform="rotate(-20 {xs} {ys})">{_esc(text)}</text>')
            else:
                self.parts.append(
                    f'<text x="{xs}" y="{ys}" text-anchor="middle">{_esc(text)}</text>')
        self.parts.append(f'<text x="{_n((self.plot_left + self.plot_right) / 2)}" '
                          f'y="{HEIGHT - 10}" text-anchor="middle">{_esc(label)}</text></g>')

    def empty(self) -> None:
        self.parts.append(f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle" '
                          f'fill="#777777">no data</text>')

    def done(self) -> str:
        return "\n".join([*self.parts, "</svg>"]) + "\n"


def line_chart(title: str, series: Sequence[tuple[str, Sequence[Point]]], *,
               x_label: str, y_label: str, percent: bool = True) -> str:
    """Lines over a numeric x axis, one per ``(name, points)``; rates by default (0-100 %).
    A series with one point is drawn as its marker only."""
    canvas = _Canvas(title)
    points = [p for _, pts in series for p in pts]
    if not points:
        canvas.empty()
        return canvas.done()
    canvas.legend([name for name, _ in series])
    xs = sorted({x for x, _ in points})
    x_min, x_max = xs[0], xs[-1]
    if x_min == x_max:
        x_min, x_max = x_min - 1, x_max + 1
    left, right = canvas.plot_left + 12, canvas.plot_right - 12

    def x_of(x: float) -> float:
        return left + (x - x_min) / (x_max - x_min) * (right - left)

    top, y_ticks = _y_axis(max(y for _, y in points), percent=percent)
    canvas.y_axis(top, y_ticks, y_label, percent=percent)
    if len(xs) <= 12:
        x_ticks = xs
    else:
        step = _nice_step(x_max - x_min, 8)
        first = math.ceil(x_min / step) * step
        x_ticks = [first + i * step for i in range(int((x_max - first) / step + 1e-9) + 1)]
    canvas.x_axis([(x_of(x), f"{x:g}") for x in x_ticks], x_label, slant=False)
    for i, (name, pts) in enumerate(series):
        color = _PALETTE[i % len(_PALETTE)]
        ordered = sorted(pts)
        canvas.parts.append(f'<g class="series" data-series="{_esc(name)}">')
        if len(ordered) > 1:
            path = " ".join(f"{_n(x_of(x))},{_n(canvas.y_of(y, top))}" for x, y in ordered)
            canvas.parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                                f'stroke-width="2"/>')
        for x, y in ordered:
            canvas.parts.append(
                f'<circle cx="{_n(x_of(x))}" cy="{_n(canvas.y_of(y, top))}" r="3.5" '
                f'fill="{color}"><title>{_esc(name)} at {x:g}: '
                f"{_esc(_value_label(y, percent=percent))}</title></circle>")
        canvas.parts.append("</g>")
    return canvas.done()


def bar_chart(title: str, groups: Sequence[str],
              series: Sequence[tuple[str, Sequence[float | None]]], *,
              x_label: str, y_label: str, percent: bool = True) -> str:
    """Grouped bars: one group per entry of ``groups``, one bar per ``(name, values)`` in
    each (``values[i]`` belongs to ``groups[i]``; None draws no bar). Rates by default."""
    canvas = _Canvas(title)
    values = [v for _, vs in series for v in vs if v is not None]
    if not groups or not series or not values:
        canvas.empty()
        return canvas.done()
    canvas.legend([name for name, _ in series])
    top, y_ticks = _y_axis(max(values), percent=percent)
    canvas.y_axis(top, y_ticks, y_label, percent=percent)
    slot = (canvas.plot_right - canvas.plot_left) / len(groups)
    bar = min(48.0, slot * 0.8 / len(series))
    centers = [canvas.plot_left + slot * (i + 0.5) for i in range(len(groups))]
    canvas.x_axis(list(zip(centers, groups, strict=True)), x_label,
                  slant=any(len(g) * 7 > slot for g in groups))
    start = -bar * len(series) / 2
    for s, (name, vs) in enumerate(series):
        color = _PALETTE[s % len(_PALETTE)]
        canvas.parts.append(f'<g class="series" data-series="{_esc(name)}">')
        for center, group, value in zip(centers, groups, vs, strict=True):
            if value is None:
                continue
            x = center + start + s * bar
            y = canvas.y_of(value, top)
            label = _esc(_value_label(value, percent=percent))
            canvas.parts.append(
                f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(bar - 2)}" '
                f'height="{_n(canvas.plot_bottom - y)}" fill="{color}">'
                f"<title>{_esc(name)}, {_esc(group)}: {label}</title></rect>"
                f'<text x="{_n(x + (bar - 2) / 2)}" y="{_n(y - 4)}" text-anchor="middle" '
                f'font-size="10">{label}</text>')
        canvas.parts.append("</g>")
    return canvas.done()


def for_html(svg: str) -> str:
    """An SVG document as an element to inline in HTML, where the parser gives it its
    namespace: the namespace declaration dropped, so the page names no URL at all."""
    return svg.replace(_NS, "", 1)


__all__ = ["HEIGHT", "WIDTH", "bar_chart", "for_html", "line_chart"]
