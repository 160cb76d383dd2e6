"""The console's history charts, webhook deliveries (with replay) and the
payments CSV export (docs/console.md, "History" and "Webhook deliveries").

The charts read ``history_minutes``, the per-minute rollup the scheduler's
history roller keeps (``paycron.store.history``): a 7-day chart reads at
most 10,080 small rows and never an attempt. A replay is a row the relay
sends (``scheduler/relay.py``): the request that asks for it never waits
on the endpoint.
"""

from __future__ import annotations

import csv
import io
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import NoReturn

from flask import (
    Response,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)

from paycron.domain.money import exponent
from paycron.sql import parse_blocks
from paycron.store import payments
from paycron.store.history import LATENESS_EDGES
from paycron.store.partitions import day_start
from web.audit import audit
from web.console import bp, charts, reads
from web.console.session import ConsoleRefused
from web.console.views import statuses

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


# -- webhook deliveries --------------------------------------------------------

#: Deliveries on one page of an endpoint; replays shown with them.
DELIVERIES_PAGE = reads.PAGE
REPLAYS_SHOWN = 20
_BIGINT_MAX = 2**63 - 1


def _endpoint_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConsoleRefused(404, "No webhook endpoint has this id.") from None


@bp.get("/webhooks/<endpoint_id>")
def webhook_endpoint(endpoint_id: str):
    parsed = _endpoint_id(endpoint_id)
    cursor = request.args.get("cursor") or None
    try:
        before = int(cursor) if cursor else _BIGINT_MAX
    except ValueError:
        before = -1
    if not 0 <= before <= _BIGINT_MAX:
        _bad("A bad page cursor.")
    with current_app.extensions["paycron.pool"].connection() as conn:
        endpoint = conn.execute(QUERIES["webhook_endpoint"], {"id": parsed}).fetchone()
        if endpoint is None:
            raise ConsoleRefused(404, "No webhook endpoint has this id.")
        rows = conn.execute(
            QUERIES["webhook_deliveries_page"],
            {"endpoint_id": parsed, "before_event_id": before, "limit": DELIVERIES_PAGE + 1},
        ).fetchall()
        replays = conn.execute(
            QUERIES["webhook_replays_of"], {"endpoint_id": parsed, "limit": REPLAYS_SHOWN}
        ).fetchall()
    more, rows = len(rows) > DELIVERIES_PAGE, rows[:DELIVERIES_PAGE]
    page = reads.Page(rows, str(rows[-1]["event_id"]) if more else None)
    audit("console.read", "success", target=f"webhook endpoint {parsed}", channel="console")
    return render_template(
        "console/webhook_endpoint.html", endpoint=endpoint, deliveries=page, replays=replays
    )


@bp.post("/webhooks/<endpoint_id>/deliveries/<int:event_id>/replay")
def replay_delivery(endpoint_id: str, event_id: int):
    """Queue one delivery to be sent again; the relay sends it (signed anew)
    outside the endpoint's stream, and the endpoint's page shows the answer."""
    parsed = _endpoint_id(endpoint_id)
    target = f"webhook endpoint {parsed} event {event_id}"
    if event_id > _BIGINT_MAX:
        audit("webhook.replay", "refused", target=target, reason="no such event", channel="console")
        raise ConsoleRefused(404, "This endpoint has no delivery of that event.")
    with current_app.extensions["paycron.pool"].connection() as conn:
        row = conn.execute(
            QUERIES["webhook_replay_request"],
            {"endpoint_id": parsed, "event_id": event_id, "requested_by": g.operator.actor},
        ).fetchone()
    if row is None:
        audit(
            "webhook.replay",
            "refused",
            target=target,
            reason="no such delivery, the endpoint was deleted or the event pruned",
            channel="console",
        )
        raise ConsoleRefused(
            404,
            "Nothing to replay: this endpoint has no delivery of that event, "
            "was deleted, or the event is no longer kept.",
        )
    audit(
        "webhook.replay", "success", target=target, reason=f"replay {row['id']}", channel="console"
    )
    flash(f"Replay {row['id']} of event {event_id} queued: the relay sends it within seconds.")
    return redirect(url_for("console.webhook_endpoint", endpoint_id=parsed))


# -- payments CSV ------------------------------------------------------------------

#: An export stops after this many rows: a filter narrows a bigger one.
CSV_MAX_ROWS = 10_000
#: Rows read per round trip while streaming (the connection is returned
#: to the pool between chunks, so a slow download holds none).
CSV_CHUNK = 500
CSV_COLUMNS = (
    "id",
    "due_at",
    "payer",
    "payee",
    "amount",
    "amount_minor",
    "currency",
    "status",
    "failure_reason",
    "in_doubt",
    "attempt",
    "updated_at",
)


def _cell(value: object) -> object:
    """A cell a spreadsheet shows as text: one starting = + - @ (a formula
    to Excel) gets a leading apostrophe."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _decimal(amount_minor: int, currency: str) -> str:
    digits = exponent(currency)
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    return f"{sign}{whole}.{fraction:0{digits}d}" if digits else f"{sign}{whole}"


def _line(values) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(values)
    return out.getvalue()


def _chunks_of_payer(payer: str, status: str | None) -> Iterator[list[dict]]:
    pool = current_app.extensions["paycron.pool"]
    after = None
    while True:
        with pool.connection() as conn:
            rows, after = payments.list_payments(
                conn, actor=payer, status=status, limit=CSV_CHUNK, after=after
            )
        yield rows
        if after is None:
            return


def _chunks_of_day(day: date, status: str | None) -> Iterator[list[dict]]:
    """The day in due order, a stretch of ids at a time (the list's own
    query, every match of a stretch returned)."""
    pool = current_app.extensions["paycron.pool"]
    after, scan = uuid.UUID(int=0), CSV_CHUNK * 4 if status else CSV_CHUNK
    while True:
        with pool.connection() as conn:
            rows = conn.execute(
                reads.QUERIES["payments_of_day"],
                {
                    "day_from": day_start(day),
                    "day_to": day_start(day + timedelta(days=1)),
                    "after": after,
                    "scan": scan,
                    "limit": scan,
                    "status": status,
                },
            ).fetchall()
        yield [row for row in rows if row["id"] is not None]
        if rows[0]["scanned"] < scan:
            return
        after = rows[0]["last_id"]


def _stream(chunks: Iterator[list[dict]]) -> Iterator[str]:
    yield _line(CSV_COLUMNS)
    sent = 0
    for rows in chunks:
        for p in rows:
            if sent >= CSV_MAX_ROWS:
                return
            yield _line(
                [
                    p["id"],
                    p["due_at"].astimezone(UTC).isoformat(),
                    _cell(p["payer"]),
                    _cell(p["payee"]),
                    _decimal(p["amount_minor"], p["currency"]),
                    p["amount_minor"],
                    p["currency"],
                    p["status"],
                    p["failure_reason"] or "",
                    "true" if p["in_doubt"] else "false",
                    p["attempt"],
                    p["updated_at"].astimezone(UTC).isoformat(),
                ]
            )
            sent += 1


@bp.get("/payments.csv")
def payments_csv():
    """The payments list as its query string filters it (payer, status,
    day), as CSV, streamed, at most :data:`CSV_MAX_ROWS` rows."""
    args = request.args
    payer = args.get("payer", "").strip()
    status = args.get("status", "").strip() or None
    day_text = args.get("day", "").strip()
    if status is not None and status not in statuses():
        _bad(f"No such status: {status}.")
    if not (payer or status or day_text):
        _bad("Choose a payer, a status or a day to export.")
    chunks: Iterator[list[dict]]
    if payer:
        chunks, shown = _chunks_of_payer(payer, status), f"payer={payer}"
    else:
        try:
            day = date.fromisoformat(day_text) if day_text else _now().date()
            day_start(day + timedelta(days=1))  # a day with a next one (not 9999-12-31)
        except (ValueError, OverflowError):
            _bad("A bad day (use YYYY-MM-DD).")
        chunks, shown = _chunks_of_day(day, status), f"day={day.isoformat()}"
    # The first chunk is read now: a database's refusal is this request's
    # answer (a 400), not a download cut short.
    first = next(chunks)

    if status:
        shown += f" status={status}"
    audit("console.read", "success", target=f"payments export {shown}", channel="console")
    return Response(
        stream_with_context(_stream(itertools.chain([first], chunks))),
        mimetype="text/csv",
        headers={"Content-Disposition": 'attachment; filename="payments.csv"'},
    )


@bp.context_processor
def _export_cap() -> dict:
    return {"csv_max_rows": CSV_MAX_ROWS}
