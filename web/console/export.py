"""The payments list as CSV (docs/console.md, "Payments CSV export"):
the list's own filter (``filters.PaymentFilter``) and pages
(``views.payments_page``), streamed a chunk at a time, at most
:data:`CSV_MAX_ROWS` rows."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from datetime import UTC, date
from typing import NoReturn

from flask import Response, current_app, request, stream_with_context

from paycron.domain.money import exponent
from web.audit import audit
from web.console import bp, filters
from web.console.session import ConsoleRefused
from web.console.views import payments_page, statuses

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


def _chunks(chosen: filters.PaymentFilter, today: date) -> Iterator[list[dict]]:
    """Every match of the list's filter from its start: the list's own pages
    (:func:`web.console.views.payments_page`), ``CSV_CHUNK`` rows a round
    trip, each cursor followed until there is none."""
    pool = current_app.extensions["paycron.pool"]
    cursor = None
    while True:
        with pool.connection() as conn:
            page = payments_page(conn, chosen, today=today, cursor=cursor, limit=CSV_CHUNK)
        assert page is not None  # an active filter always reads
        yield page.rows
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _stream(chunks: Iterator[list[dict]]) -> Iterator[str]:
    yield _line(CSV_COLUMNS)
    sent = 0
    for rows in chunks:
        for p in rows[: CSV_MAX_ROWS - sent]:
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
        if sent >= CSV_MAX_ROWS:
            return  # before reading another chunk


@bp.get("/payments.csv")
def payments_csv():
    """The payments list's filter (its own fields, parsed and checked as the
    list does) as CSV, every match from the start (a ``cursor`` is the
    list's page, not the export's), streamed, at most
    :data:`CSV_MAX_ROWS` rows."""
    if request.args.get("id", "").strip():
        _bad("A payment id opens that payment's page; export a filter instead.")
    chosen = filters.PaymentFilter.from_args(request.args, statuses=statuses())
    if not chosen.active:
        _bad("Choose a filter to export (a payer, a status, a due range, …).")
    # One day for the whole download: "today" does not move at midnight.
    chunks = _chunks(chosen, _now().date())
    # The first chunk is read now: a database's refusal is this request's
    # answer (a 400), not a download cut short.
    first = next(chunks)

    audit(
        "console.read",
        "success",
        target=f"payments export {chosen.describe()}",
        channel="console",
    )
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
