"""The operator console's pages stay fast with millions of rows (docs/operations.md).

    python -m bench.console_pages                      # 1,000,000 payments
    python -m bench.console_pages --payments 200000 --requests 20

Loads, by COPY into a private database: the payments (a third due today,
the rest over the week before and after; the past ones COMPLETED with
one payment in 500 FAILED and one in 2,000 parked in doubt with an open
dead letter), one payer's idempotency rows (the payer search's order) for
a fifth of them, a first attempt for each payment due in the last two
hours, 1,000 webhook endpoints of 500 payers with 100,000 undelivered
events (and 200,000 delivery rows for one endpoint; ``--events``,
``--deliveries``), and 30 reconciliation runs. Then rolls up the history
(``history_minutes``: the 8 days' backfill, then a steady run) and times
each console page through the Flask test client, signed in, after a
warm-up (the filtered lists, the bulk preview, approvals and audit, the
History page in its three ranges, an endpoint's deliveries, a payer's CSV
export at its 10,000-row cap, two filtered exports of a week's due range);
the overview's read is timed uncached.
Prints each page's median and p95 in milliseconds, the roller's runs, then
the time to request and run a bulk dismiss of one payer's dead letters.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import random
import re
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from bench.harness import REDIS_URL, horizon_days, parse_args, private_database
from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.store import apikeys, partitions
from paycron.store.db import connect

PAYER = "big-payer"
#: A payer with a few hundred payments (one in 5,000), half of them PENDING,
#: and two webhook endpoints: the bulk cancel's and the Webhooks filter's.
CANCELLER = "payer-7"
WARMUP = 3


def load(conn, n: int, events: int, deliveries: int) -> dict:
    now = datetime.now(UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    # the week before today has partitions too (retention keeps 90 days)
    partitions.ensure_partitions(
        conn, Config(horizon_days=horizon_days()), today=now.date() - timedelta(days=8)
    )
    rng = random.Random(7)
    rows, parked, failed = [], [], None
    for i in range(n):
        if i % 3 == 0:  # today
            due = start + timedelta(seconds=rng.uniform(0, 86400))
        else:
            due = now + timedelta(days=rng.uniform(-7, 7))
        past = due < now - timedelta(seconds=5)
        status, reason, doubt = ("COMPLETED" if past else "PENDING"), None, False
        if past and i % 500 == 1:
            status, reason = "FAILED", "DECLINED"
        if past and i % 2000 == 3:
            status, reason, doubt = "FAILED", "RETRIES_EXHAUSTED", True
        payer = PAYER if i % 5 == 0 else f"payer-{i % 5000}"
        pid = new_payment_id(due)
        rows.append((pid, due, payer, status, reason, doubt))
        if reason == "RETRIES_EXHAUSTED":
            parked.append((pid, due, payer))
        if status == "FAILED" and failed is None:
            failed = pid
    with conn.transaction():
        with conn.cursor().copy(
            "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at, "
            "status, failure_reason, in_doubt, attempt, failures, created_at) "
            "FROM STDIN"
        ) as copy:
            for pid, due, payer, status, reason, doubt in rows:
                copy.write_row(
                    (
                        pid,
                        due,
                        payer,
                        "shop",
                        2500,
                        "USD",
                        due,
                        status,
                        reason,
                        doubt,
                        0 if status == "PENDING" else 1,
                        6 if reason == "RETRIES_EXHAUSTED" else 0,
                        due,
                    )
                )
        with conn.cursor().copy(
            "COPY idempotency_keys (actor, key, request_hash, payment_id, due_at, "
            "created_at) FROM STDIN"
        ) as copy:
            for pid, due, payer, *_ in rows:
                if payer == PAYER:
                    copy.write_row(
                        (
                            payer,
                            str(pid),
                            hashlib.sha256(pid.bytes).digest(),
                            pid,
                            due,
                            due - timedelta(days=1),
                        )
                    )
        with conn.cursor().copy(
            "COPY attempts (payment_id, attempt, gateway_key, started_at, finished_at, "
            "outcome, due_at) FROM STDIN"
        ) as copy:
            for pid, due, _, status, *_ in rows:
                if status != "PENDING" and now - timedelta(hours=2) <= due:
                    started = due + timedelta(seconds=rng.expovariate(1 / 1.5))
                    copy.write_row(
                        (
                            pid,
                            1,
                            str(pid),
                            started,
                            started + timedelta(milliseconds=300),
                            "SUCCEEDED" if status == "COMPLETED" else "AMBIGUOUS",
                            due,
                        )
                    )
        with conn.cursor().copy(
            "COPY dead_letters (payment_id, due_at, payer, reason, last_error, created_at) "
            "FROM STDIN"
        ) as copy:
            for pid, due, payer in parked:
                copy.write_row((pid, due, payer, "RETRIES_EXHAUSTED", "timeout", due))
        conn.execute(
            "INSERT INTO webhook_endpoints (actor, url, secret) "
            "SELECT 'payer-' || (g % 500), 'https://hooks.example/' || g, 'whsec_b' "
            "FROM generate_series(1, 1000) g"
        )
        conn.execute(
            "INSERT INTO payment_events (payment_id, payer, type, status, attempt) "
            "SELECT gen_random_uuid(), 'payer-' || (g %% 500), 'payment.created', "
            "'PENDING', 0 FROM generate_series(1, %s) g",
            (events,),
        )
        endpoint = conn.execute("SELECT id FROM webhook_endpoints ORDER BY id LIMIT 1").fetchone()[
            "id"
        ]
        conn.execute(
            "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status, "
            "last_latency_ms, delivered_at) "
            "SELECT %s, g, 1, 200, 40 + g %% 200, now() FROM generate_series(1, %s) g",
            (endpoint, deliveries),
        )
        conn.execute(
            "INSERT INTO reconciliation_runs (day, source, finished_at, charges_seen) "
            "SELECT current_date - g, 'gateway', now(), 1000 "
            "FROM generate_series(1, 30) g"
        )
    for table in (
        "payments",
        "idempotency_keys",
        "attempts",
        "dead_letters",
        "webhook_endpoints",
        "webhook_deliveries",
        "payment_events",
        "reconciliation_runs",
    ):
        conn.execute(f"ANALYZE {table}")
    parkers = collections.Counter(payer for _, _, payer in parked)
    return {
        "parked": len(parked),
        "failed": failed,
        "some": rows[len(rows) // 2][0],
        # the payer with the most open dead letters (a bulk action's filter)
        "parker": parkers.most_common(1)[0][0] if parkers else PAYER,
        "endpoint": endpoint,
    }


def roll_up(conn) -> dict[str, float]:
    """The history roller's two kinds of run, timed: the first start's
    backfill of the retention, then a steady run (the unsettled tail)."""
    from paycron.store import history

    times = {}
    for name in ("history backfill (8 days)", "history steady run"):
        started = time.perf_counter()
        counts = history.roll_up_pending(conn)
        times[f"{name}, {counts.minutes} min"] = (time.perf_counter() - started) * 1000
    conn.execute("ANALYZE history_minutes")
    return times


def timed(client, url: str, samples: int, *, expect: tuple[int, ...] = (200, 302)) -> list[float]:
    for _ in range(WARMUP):
        client.get(url)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        answer = client.get(url)
        answer.get_data()  # a streamed body (the CSV) is read to its end
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code in expect, (url, answer.status_code)
    return times


def run(payments: int, requests: int, events: int, deliveries: int) -> None:
    from web import close_app, create_app
    from web.console import reads

    with private_database("paycron_bench_console") as url:
        with connect(Config(database_url=url)) as conn:
            loaded_at = time.perf_counter()
            seeded = load(conn, payments, events, deliveries)
            loaded = time.perf_counter() - loaded_at
            rollups = roll_up(conn)
            key, _ = apikeys.create_api_key(conn, "bench-ops", admin=True)
        config = Config.from_env(
            {
                "DATABASE_URL": url,
                "REDIS_URL": REDIS_URL,
                "REDIS_NAMESPACE": f"paycron-bench-{uuid.uuid4().hex[:8]}",
                "CONSOLE_SECRET_KEY": "bench-console-secret-0123456789abcdef",
            }
        )
        app = create_app(config)
        try:
            client = app.test_client()
            page = client.get("/console/sign-in").get_data(as_text=True)
            token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
            assert (
                client.post(
                    "/console/sign-in", data={"api_key": key, "csrf_token": token}
                ).status_code
                == 302
            )
            today = datetime.now(UTC).date().isoformat()
            week_ago = (datetime.now(UTC) - timedelta(days=7)).date().isoformat()
            parker = seeded["parker"]
            pages = {
                "overview (cached)": "/console/",
                "payment by id": f"/console/payments/{seeded['some']}",
                "payments of a payer": f"/console/payments?payer={PAYER}",
                "payer + FAILED": f"/console/payments?payer={PAYER}&status=FAILED",
                "FAILED, today": f"/console/payments?status=FAILED&day={today}",
                "today, any status": f"/console/payments?day={today}",
                "due 7 days, FAILED": (
                    f"/console/payments?due_from={week_ago}&due_to={today}&status=FAILED"
                ),
                "due 7 days, in doubt": (
                    f"/console/payments?due_from={week_ago}&due_to={today}"
                    "&in_doubt=yes&processor=fake"
                ),
                "dead letters": "/console/dead-letters",
                "dead letters of a payer": f"/console/dead-letters?payer={parker}",
                "dead letters by reason": "/console/dead-letters?reason=RETRIES_EXHAUSTED",
                "dead letters parked before": f"/console/dead-letters?parked_before={week_ago}",
                "bulk preview of a payer": f"/console/dead-letters/all/dismiss?payer={parker}",
                "approvals": "/console/approvals",
                "audit": "/console/audit",
                "reconciliation": "/console/reconciliation",
                "webhooks": "/console/webhooks",
                "webhooks of a payer": f"/console/webhooks?payer={CANCELLER}",
                "webhooks with a backlog": "/console/webhooks?only=backlog",
                "webhooks failing": "/console/webhooks?only=failing",
                "cancel preview of a payer": (
                    f"/console/payments/all/cancel?payer={CANCELLER}&status=PENDING"
                ),
                "history, 1 h": "/console/history?range=1h",
                "history, 24 h": "/console/history?range=24h",
                "history, 7 d": "/console/history?range=7d",
                "endpoint deliveries": f"/console/webhooks/{seeded['endpoint']}",
                "CSV, payer (10k cap)": f"/console/payments.csv?payer={PAYER}",
                "CSV, due 7 days, FAILED": (
                    f"/console/payments.csv?due_from={week_ago}&due_to={today}&status=FAILED"
                ),
                "CSV, due 7 days, in doubt": (
                    f"/console/payments.csv?due_from={week_ago}&due_to={today}"
                    "&in_doubt=yes&processor=fake"
                ),
            }
            results = {name: timed(client, path, requests) for name, path in pages.items()}
            # a day of PENDING payments is more than CONSOLE_BULK_MAX: refused
            # (400) once the bounded read has seen one more than the cap
            tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
            for name, path in {
                "cancel preview, a day (400)": (
                    f"/console/payments/all/cancel?status=PENDING&day={tomorrow}"
                ),
                "cancel, day+processor (400)": (
                    f"/console/payments/all/cancel?status=PENDING&day={tomorrow}&processor=fake"
                ),
            }.items():
                results[name] = timed(
                    client, path, requests, expect=(400,) if payments > 50_000 else (200, 400)
                )
            pool, breaker_state = app.extensions["paycron.pool"], (lambda: "closed")
            overview = []
            for _ in range(max(3, requests // 4)):
                started = time.perf_counter()
                with pool.connection() as conn:
                    reads.read_overview(conn, now=datetime.now(UTC), circuit=breaker_state)
                overview.append((time.perf_counter() - started) * 1000)
            results["overview read (uncached)"] = overview
            bulk = bulk_run(client, app, parker)
            cancels = cancel_run(client, app, CANCELLER)
        finally:
            close_app(app)
    print(
        f"{payments:,} payments (loaded in {loaded:.0f} s), {seeded['parked']:,} parked "
        f"in doubt with open dead letters, 1,000 webhook endpoints with 100,000 events "
        f"waiting; {requests} requests a page"
    )
    for name, samples in results.items():
        p95 = statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else samples[0]
        print(f"  {name:<26} median {statistics.median(samples):8.1f} ms   p95 {p95:8.1f} ms")
    for name, ms in rollups.items():
        print(f"  {name:<40} {ms:8.1f} ms")
    count, seconds = bulk
    print(
        f"  bulk dismiss of {count} dead letters of one payer: requested and run in "
        f"{seconds * 1000:.0f} ms ({seconds * 1000 / max(count, 1):.1f} ms a payment)"
    )
    count, seconds = cancels
    print(
        f"  bulk cancel of {count} PENDING payments of one payer: requested and run in "
        f"{seconds * 1000:.0f} ms ({seconds * 1000 / max(count, 1):.1f} ms a payment)"
    )


def bulk_run(client, app, payer: str) -> tuple[int, float]:
    """Preview and confirm a dismiss of every open dead letter of ``payer``, then
    run it to the end as the scheduler's runner does: (payments, seconds)."""
    from paycron.engine import console_bulk

    started = time.perf_counter()
    preview = client.get(f"/console/dead-letters/all/dismiss?payer={payer}")
    html = preview.get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    answer = client.post(
        "/console/dead-letters/all/dismiss",
        data={"payer": payer, "csrf_token": token, "digest": digest, "note": "bench"},
    )
    assert answer.status_code == 302, answer.status_code
    pool, gateway = app.extensions["paycron.pool"], app.extensions["paycron.gateway"]
    count = 0
    while True:
        counts = console_bulk.run_once(pool, gateway)
        count += counts.done + counts.refused
        if counts.finished:
            return count, time.perf_counter() - started


def cancel_run(client, app, payer: str) -> tuple[int, float]:
    """Preview and confirm a cancel of every PENDING payment of ``payer``,
    then run it to the end as the scheduler's runner does: (payments, seconds)."""
    from paycron.engine import console_bulk

    started = time.perf_counter()
    query = {"payer": payer, "status": "PENDING"}
    html = client.get("/console/payments/all/cancel", query_string=query).get_data(as_text=True)
    if 'name="digest"' not in html:  # nothing PENDING (a smoke run's few payments)
        return 0, time.perf_counter() - started
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    answer = client.post(
        "/console/payments/all/cancel",
        data={**query, "csrf_token": token, "digest": digest, "note": "bench"},
    )
    assert answer.status_code == 302, answer.status_code
    pool, gateway = app.extensions["paycron.pool"], app.extensions["paycron.gateway"]
    count = 0
    while True:
        counts = console_bulk.run_once(pool, gateway)
        count += counts.done + counts.refused
        if counts.finished:
            return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--events", type=int, default=100_000, help="undelivered webhook events")
    parser.add_argument(
        "--deliveries", type=int, default=200_000, help="delivery rows of one endpoint"
    )
    args = vars(parse_args(parser, payments=2000, requests=2, events=200, deliveries=400))
    args.pop("smoke")
    run(**args)


if __name__ == "__main__":
    main()
