"""The console's pages: sign-in, overview, payments, dead letters,
reconciliation, webhooks. Every page but sign-in needs a session."""

from __future__ import annotations

from datetime import date

from flask import current_app, flash, g, redirect, render_template, request, session, url_for
from psycopg.errors import DataError

from paycron.config import PROCESSORS
from paycron.domain.enums import Status
from paycron.domain.ids import parse_payment_id
from paycron.store import apikeys
from web.audit import audit
from web.console import bp, charts, filters, page_cursor, reads
from web.console.session import ConsoleRefused, check_csrf, current_operator
from web.console.session import sign_in as start_session
from web.console.session import sign_out as end_session

#: The statuses a search offers; AWAITING_GATEWAY joins Status with its migration.
AWAITING_GATEWAY = "AWAITING_GATEWAY"


def statuses() -> list[str]:
    names = [s.value for s in Status]
    return names if AWAITING_GATEWAY in names else [*names, AWAITING_GATEWAY]


def _pool():
    return current_app.extensions["paycron.pool"]


def _now():
    return current_app.extensions["paycron.clock"]()


def _safe_next(target: str | None) -> str:
    """Where to go after signing in: a console page, never another site."""
    if target and target.startswith("/console/") and not target.startswith("//"):
        return target
    return url_for("console.overview")


def _unencodable(text: str) -> bool:
    """NUL (Postgres text refuses it) or a lone surrogate (no UTF-8 has it)."""
    if "\x00" in text:
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _check_text() -> None:
    """Every query and form field is text Postgres can store, or the
    request is refused (400) before a view reads it."""
    for source in (request.args, request.form):
        for name, value in source.items(multi=True):
            if _unencodable(name) or _unencodable(value):
                raise ConsoleRefused(
                    400, "A field held a character that is not text (NUL or a lone surrogate)."
                )


@bp.errorhandler(DataError)
def _bad_value(error: DataError):
    # A value Postgres refused (a cursor's time, a number out of range): the
    # request's fault, answered as a bad request, never a 500.
    return render_template(
        "console/error.html", status=400, message="A value in the request is not valid."
    ), 400


@bp.before_request
def _guard():
    """CSRF on every POST, then a session on every page but sign-in."""
    if request.endpoint == "console.static":
        return None
    _check_text()
    if request.method == "POST":
        try:
            check_csrf()
        except ConsoleRefused:
            audit("console.csrf_refused", "refused", target=request.path, channel="console")
            raise
    if request.endpoint == "console.sign_in":
        return None
    if current_operator() is None:
        audit("console.unauthenticated", "refused", target=request.path, channel="console")
        target = request.full_path.rstrip("?") if request.method == "GET" else None
        return redirect(url_for("console.sign_in", next=target))
    return None


@bp.after_request
def _no_store(response):
    # Pages show payments and payers: no cache keeps them after sign-out.
    response.headers["Cache-Control"] = "no-store"
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault(
        "Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'"
    )
    return response


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in():
    notice = None
    if session.pop("expired", None):
        notice = "Your session expired. Sign in again."
    elif session.pop("ended", None):
        notice = "Your session ended: its API key was revoked or is no longer an admin key."
    if request.method == "GET":
        return render_template(
            "console/sign_in.html", notice=notice, next=request.args.get("next", "")
        )
    key = request.form.get("api_key", "").strip()
    principal = None
    if key:
        with _pool().connection() as conn:  # read now: never a cached key
            principal = apikeys.find_key(conn, key)
    if principal is None:
        audit(
            "console.sign_in",
            "failure",
            reason="no API key" if not key else "unknown or revoked key",
            channel="console",
        )
        return render_template(
            "console/sign_in.html",
            next=request.form.get("next", ""),
            error="That API key is unknown or revoked.",
        ), 401
    if not principal.is_admin:
        audit(
            "console.sign_in",
            "refused",
            principal=principal,
            reason="a payer key",
            channel="console",
        )
        return render_template(
            "console/sign_in.html",
            next=request.form.get("next", ""),
            error="That is a payer key: only an admin API key can sign in to the console "
            "(paycron api-key create --admin).",
        ), 403
    start_session(principal)
    audit("console.sign_in", "success", principal=principal, channel="console")
    return redirect(_safe_next(request.form.get("next")))


@bp.post("/sign-out")
def sign_out():
    operator = g.operator
    end_session()
    audit("console.sign_out", "success", principal=operator, channel="console")
    flash("Signed out.")
    return redirect(url_for("console.sign_in"))


@bp.get("/")
def overview():
    data = current_app.extensions["paycron.console.overview"].get()
    labels = charts.bucket_labels(reads.LATENESS_EDGES)
    return render_template(
        "console/overview.html",
        data=data,
        lateness=charts.histogram(data.lateness_buckets, labels),
        flow=charts.lines({"Claims": data.claims, "Due": data.due}),
        lateness_rows=list(zip(labels, data.lateness_buckets, strict=True)),
        flow_rows=list(zip(data.claims, data.due, strict=True)),
        chart=charts,
    )


def _read(target: str) -> None:
    """An operator read payer data: the page and its filter go to the audit log."""
    audit("console.read", "success", target=target, channel="console")


def _bad(message: str):
    raise ConsoleRefused(400, message)


@bp.get("/payments")
def payments():
    payment_id_text = request.args.get("id", "").strip()
    if payment_id_text:
        payment_id = parse_payment_id(payment_id_text.lower())
        if payment_id is None:
            _bad("That is not a payment id (a UUIDv7 such as 0193…).")
        return redirect(url_for("console.payment", payment_id=payment_id))
    chosen = filters.PaymentFilter.from_args(request.args, statuses=statuses())
    page = None
    try:
        with _pool().connection() as conn:
            page = payments_page(conn, chosen, today=_now().date(), cursor=page_cursor())
    except ValueError:
        _bad("A bad page cursor.")
    if page is not None:
        _read(" ".join(["payments", chosen.describe()]).strip())
    return render_template(
        "console/payments.html",
        query=chosen,
        page=page,
        statuses=statuses(),
        scan=reads.DAY_SCAN,
        processors=PROCESSORS,
        failure_reasons=filters.FAILURE_REASONS,
    )


def payments_page(
    conn,
    chosen: filters.PaymentFilter,
    *,
    today: date,
    cursor: str | None,
    limit: int | None = None,
) -> reads.Page | None:
    """A page (``limit`` rows, a list's page when None) of what ``chosen``
    matches, from ``cursor`` (None: the start): a payer's payments (the
    API's own list, newest first), else a due range's (``today``'s when
    none is given) in due order; None when nothing is chosen. The payments
    list and its CSV export both read through here, so an export holds what
    the list shows. A bad cursor is a ValueError."""
    due_from, due_to = chosen.due_range()
    if chosen.payer:
        page = reads.payments_of_payer(
            conn, payer=chosen.payer, status=chosen.status, cursor=cursor, limit=limit
        )
        kept = [
            row
            for row in page.rows
            if (due_from is None or row["due_at"] >= due_from)
            and (due_to is None or row["due_at"] < due_to)
            and (chosen.failure_reason is None or row["failure_reason"] == chosen.failure_reason)
            and (chosen.doubt is None or row["in_doubt"] == chosen.doubt)
            and (chosen.processor is None or row.get("processor") == chosen.processor)
        ]
        return reads.Page(kept, page.next_cursor)
    if not chosen.active:
        return None
    due_from, due_to = chosen.window(today)
    return reads.payments_due(
        conn,
        due_from=due_from,
        due_to=due_to,
        status=chosen.status,
        failure_reason=chosen.failure_reason,
        in_doubt=chosen.doubt,
        processor=chosen.processor,
        cursor=cursor,
        limit=limit,
    )


@bp.get("/payments/<payment_id>")
def payment(payment_id: str):
    parsed = parse_payment_id(payment_id)
    if parsed is None:
        raise ConsoleRefused(404, "No payment has this id.")
    with _pool().connection() as conn:
        detail = reads.payment_detail(conn, parsed)
    if detail is None:
        raise ConsoleRefused(404, "No payment has this id (or its day was archived).")
    _read(f"payment {parsed}")
    return render_template("console/payment.html", **detail, now=_now())


@bp.get("/dead-letters")
def dead_letters():
    now = _now()
    chosen = filters.LetterFilter.from_args(request.args)
    try:
        with _pool().connection() as conn:
            letters = reads.open_letters(
                conn,
                cursor=page_cursor(),
                reason=chosen.reason,
                payer=chosen.payer,
                before=chosen.before,
                processor=chosen.processor,
            )
            in_doubt = reads.waiting(conn, "parked_in_doubt", now=now)
            awaiting = reads.waiting(conn, "awaiting_gateway", now=now)
    except ValueError:
        _bad("A bad page cursor.")
    _read(" ".join(["dead letters", chosen.describe()]).strip())
    return render_template(
        "console/dead_letters.html",
        letters=letters,
        in_doubt=in_doubt,
        awaiting=awaiting,
        now=now,
        query=chosen,
        reasons=filters.LETTER_REASONS,
        processors=PROCESSORS,
    )


@bp.get("/reconciliation")
def reconciliation():
    chosen = filters.RunFilter.from_args(request.args)
    try:
        with _pool().connection() as conn:
            runs = reads.reconciliation_runs(
                conn,
                cursor=page_cursor(),
                day_before=chosen.day,
                mismatches_only=chosen.mismatches == "only",
            )
    except ValueError:
        _bad("A bad page cursor.")
    _read("reconciliation runs")
    return render_template("console/reconciliation.html", runs=runs, query=chosen)


@bp.get("/reconciliation/<int:run_id>")
def reconciliation_run(run_id: int):
    try:
        with _pool().connection() as conn:
            run, items = reads.reconciliation_run(conn, run_id, cursor=page_cursor())
    except ValueError:
        _bad("A bad page cursor.")
    if run is None:
        raise ConsoleRefused(404, "No reconciliation run has this id.")
    _read(f"reconciliation run {run_id}")
    return render_template("console/reconciliation_run.html", run=run, items=items)


@bp.get("/webhooks")
def webhooks():
    chosen = filters.WebhookFilter.from_args(request.args)
    try:
        with _pool().connection() as conn:
            endpoints = reads.webhook_backlog(
                conn, cursor=page_cursor(), payer=chosen.payer, only=chosen.only
            )
    except ValueError:
        _bad("A bad page cursor.")
    payers: dict[str, list[dict]] = {}
    for row in endpoints.rows:
        payers.setdefault(row["actor"], []).append(row)
    _read(" ".join(["webhook endpoints", chosen.describe()]).strip())
    return render_template(
        "console/webhooks.html",
        query=chosen,
        endpoints=endpoints,
        payers=payers,
        cap=reads.BACKLOG_CAP,
        page_size=reads.PAGE,
        now=_now(),
    )
