"""The overview's two pictures as SVG geometry, drawn by the templates.

Made on the server from numbers the page already read: no chart library,
no script, nothing to load; each picture also has its numbers as a table
for screen readers and for copying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The drawing area inside each picture's viewBox (axis labels outside it).
WIDTH, HEIGHT = 600, 180
LEFT, TOP = 48, 12


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    count: int


@dataclass(frozen=True)
class Bars:
    bars: list[Bar]
    top: int  # the count the full height stands for


@dataclass(frozen=True)
class Lines:
    series: list[tuple[str, str]]  # (name, polyline points)
    top: int
    minutes: int


def nice_top(value: float) -> int:
    """The smallest of 1, 2, 5 x 10^n at least ``value``: an axis that reads well."""
    top = 1
    while top < value:
        lead = str(top)[0]
        top = top * 5 // 2 if lead == "2" else top * 2
    return top


def bucket_labels(edges: tuple[float, ...]) -> list[str]:
    def seconds(value: float) -> str:
        return f"{value:g}s" if value < 60 else f"{value / 60:g}m"

    labels = [f"< {seconds(edges[0])}"]
    labels += [f"{seconds(lo)}–{seconds(hi)}" for lo, hi in zip(edges, edges[1:], strict=False)]
    return [*labels, f"≥ {seconds(edges[-1])}"]


def histogram(counts: list[int], labels: list[str]) -> Bars:
    top = nice_top(max(counts, default=0))
    slot = WIDTH / max(1, len(counts))
    bars = []
    for i, (count, label) in enumerate(zip(counts, labels, strict=True)):
        height = HEIGHT * count / top
        bars.append(
            Bar(
                x=LEFT + i * slot + slot * 0.1,
                y=TOP + HEIGHT - height,
                width=slot * 0.8,
                height=height,
                label=label,
                count=count,
            )
        )
    return Bars(bars, top)


def lines(series: Mapping[str, Sequence[float]]) -> Lines:
    minutes = max((len(values) for values in series.values()), default=0)
    top = nice_top(max((max(values, default=0) for values in series.values()), default=0))
    step = WIDTH / max(1, minutes - 1)
    drawn = []
    for name, values in series.items():
        points = " ".join(
            f"{LEFT + i * step:.1f},{TOP + HEIGHT - HEIGHT * v / top:.1f}"
            for i, v in enumerate(values)
        )
        drawn.append((name, points))
    return Lines(drawn, top, minutes)
