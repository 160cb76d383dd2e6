"""The payments list as CSV (docs/console.md, "Payments CSV export"):
the list's own query string and queries, streamed a chunk at a time, at
most :data:`CSV_MAX_ROWS` rows."""

from __future__ import annotations

import csv
import io
import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, date, timedelta
from typing import NoReturn

from flask import Response, current_app, request, stream_with_context

from paycron.domain.money import exponent
from paycron.store import payments
from paycron.store.partitions import day_start
from web.audit import audit
from web.console import bp, reads
from web.console.session import ConsoleRefused
from web.console.views import statuses

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


def _bad(message: str) -> NoReturn:
    raise ConsoleRefused(400, message)


def _now():
    return current_app.extensions["paycron.clock"]()
