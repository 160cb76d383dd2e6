"""The console's History page (docs/console.md, "History"): lateness,
throughput, dead-letter inflow and the processor's error rate over the last
hour, 24 hours or 7 days.

It reads ``history_minutes``, the per-minute rollup the scheduler's history
roller keeps (``paycron.store.history``): a 7-day chart sums at most 10,080
small rows and never reads an attempt. The page refreshes itself with a few
lines of JavaScript (``static/history.js``) and works without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

from flask import current_app, render_template, request

from paycron.sql import parse_blocks
from paycron.store.history import LATENESS_EDGES
from web.console import bp, charts
from web.console.session import ConsoleRefused

QUERIES = parse_blocks((Path(__file__).parent / "history.sql").read_text())

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Range:
    """One choice of the history page: its span and the width of a point."""

    label: str
    span: timedelta
    step: timedelta


#: The ranges the page offers (``?range=``): 60, 96 and 168 points.
RANGES = {
    "1h": Range("last hour", timedelta(hours=1), timedelta(minutes=1)),
    "24h": Range("last 24 hours", timedelta(hours=24), timedelta(minutes=15)),
    "7d": Range("last 7 days", timedelta(days=7), timedelta(hours=1)),
}
#: Seconds between the page's live refreshes (static/history.js): about the
#: roller's interval, so each refresh can bring a new minute.
REFRESH_SECONDS = 15


def _floor(when: datetime, step: timedelta) -> datetime:
    return _EPOCH + ((when - _EPOCH) // step) * step


def window(choice: Range, now: datetime) -> tuple[datetime, datetime]:
    """[since, until): whole steps ending with the one running now (the last
    hour: ending with the last whole minute, the newest the roller has)."""
    if choice.step == timedelta(minutes=1):
        until = _floor(now, choice.step)
    else:
        until = _floor(now, choice.step) + choice.step
    return until - choice.span, until


def quantile(counts: list[int], q: float) -> float | None:
    """The upper edge of the lateness bucket holding quantile ``q`` (the
    last bucket, beyond every edge, reads as its lower edge); None without
    a sample. A bucketed quantile: exact to the bucket."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= q * total:
            return float(LATENESS_EDGES[min(i, len(LATENESS_EDGES) - 1)])
    return float(LATENESS_EDGES[-1])


@dataclass(frozen=True)
class Point:
    start: datetime
    rolled: int  # minutes of the rollup found for this point
    attempts: int
    completed: int
    finished: int
    processor_errors: int
    dead_letters: int
    first_attempts: int
    p50: float | None
    p99: float | None
    mean: float | None

    @property
    def error_rate(self) -> float | None:
        """Percent of the calls with an outcome that the processor failed."""
        return 100.0 * self.processor_errors / self.finished if self.finished else None


def read_history(conn, choice: Range, now: datetime) -> tuple[list[Point], int]:
    """The range's points, oldest first, and how many of its minutes that
    have ended more than a minute ago the rollup does not have yet."""
    since, until = window(choice, now)
    params = {"since": since, "until": until, "step_seconds": choice.step.total_seconds()}
    sums = {r["bucket"]: r for r in conn.execute(QUERIES["history_range"], params)}
    hist: dict[datetime, list[int]] = {}
    for r in conn.execute(QUERIES["history_lateness_range"], params):
        counts = hist.setdefault(r["bucket"], [0] * (len(LATENESS_EDGES) + 1))
        if 0 <= r["edge"] < len(counts):
            counts[r["edge"]] += r["n"]
    points, start = [], since
    while start < until:
        row = sums.get(start) or {}
        counts = hist.get(start, [])
        first = row.get("first_attempts") or 0
        points.append(
            Point(
                start=start,
                rolled=row.get("minutes") or 0,
                attempts=row.get("attempts") or 0,
                completed=row.get("completed") or 0,
                finished=row.get("finished") or 0,
                processor_errors=row.get("processor_errors") or 0,
                dead_letters=row.get("dead_letters") or 0,
                first_attempts=first,
                p50=quantile(counts, 0.5),
                p99=quantile(counts, 0.99),
                mean=(row["lateness_sum_seconds"] / first) if first else None,
            )
        )
        start += choice.step
    # Every minute of the range that has ended should be rolled up; the
    # roller runs every few seconds, so one minute of lag is no news.
    ended = (min(until, _floor(now, timedelta(minutes=1))) - since) // timedelta(minutes=1)
    return points, max(0, ended - sum(p.rolled for p in points) - 1)


def _now() -> datetime:
    return current_app.extensions["paycron.clock"]()


def _bad(message: str) -> NoReturn:
    raise ConsoleRefused(400, message)


@bp.get("/history")
def history():
    name = request.args.get("range", "1h")
    if name not in RANGES:
        _bad(f"No such range: choose one of {', '.join(RANGES)}.")
    choice = RANGES[name]
    now = _now()
    with current_app.extensions["paycron.pool"].connection() as conn:
        points, missing = read_history(conn, choice, now)

    def series(pick) -> list[float]:
        return [pick(p) or 0 for p in points]

    return render_template(
        "console/history.html",
        ranges=RANGES,
        current=name,
        choice=choice,
        points=points,
        missing=missing,
        refresh=REFRESH_SECONDS,
        chart=charts,
        pictures={
            "lateness": charts.lines(
                {
                    "p50": series(lambda p: p.p50),
                    "p99": series(lambda p: p.p99),
                    "mean": series(lambda p: p.mean),
                }
            ),
            "throughput": charts.lines(
                {"Calls": series(lambda p: p.attempts), "Charged": series(lambda p: p.completed)}
            ),
            "dead_letters": charts.lines({"Dead letters": series(lambda p: p.dead_letters)}),
            "errors": charts.lines({"Error rate": series(lambda p: p.error_rate)}),
        },
        step_minutes=int(choice.step.total_seconds() // 60),
    )
