"""A filtered list costs about what an unfiltered one does (docs/api.md: bounded
reads): one payer's long history, a status that is rare in it.

    python -m bench.list_filter                  # 20,000 payments, 1 in 500 CANCELLED
    python -m bench.list_filter --payments 3000 --requests 100

Loads the payer's history by COPY (payments and their idempotency rows, the
list's order), then times ``GET /v1/scheduled-payments?limit=20`` and
``?status=CANCELLED&limit=20`` through the Flask test client, alternating,
after a warm-up. Prints each one's median and p95 in milliseconds and the
ratio of the medians (target: <= 2).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from bench.harness import REDIS_URL, parse_args, private_database
from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.store import apikeys
from paycron.store.db import connect

URL = "/v1/scheduled-payments"
PAYER = "bench-payer"
#: Requests of each kind before timing starts (warm pool, caches, plans).
WARMUP = 20


def load_history(conn, n: int, *, cancelled_every: int) -> int:
    """``n`` payments of one payer, newest created last, due over the next 30
    days; every ``cancelled_every``-th is CANCELLED, the rest PENDING.
    Returns how many are CANCELLED."""
    now = datetime.now(UTC)
    rows = []
    for i in range(n):
        due = now + timedelta(days=1, seconds=i * 30 * 86400 // n)
        status = "CANCELLED" if i % cancelled_every == cancelled_every // 2 else "PENDING"
        rows.append((new_payment_id(due), due, status, now - timedelta(seconds=n - i)))
    with conn.transaction():
        with conn.cursor().copy(
            "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at, "
            "status) FROM STDIN"
        ) as copy:
            for payment_id, due, status, _ in rows:
                copy.write_row((payment_id, due, PAYER, "shop", 2500, "USD", due, status))
        with conn.cursor().copy(
            "COPY idempotency_keys (actor, key, request_hash, payment_id, due_at, "
            "created_at) FROM STDIN"
        ) as copy:
            for payment_id, due, _, created_at in rows:
                copy.write_row(
                    (
                        PAYER,
                        str(payment_id),
                        hashlib.sha256(payment_id.bytes).digest(),
                        payment_id,
                        due,
                        created_at,
                    )
                )
    conn.execute("ANALYZE payments")
    conn.execute("ANALYZE idempotency_keys")
    return sum(1 for row in rows if row[2] == "CANCELLED")


def timed(client, headers: dict, query: dict) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.get(URL, headers=headers, query_string=query)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.get_data(as_text=True)
    return elapsed * 1000, len(response.get_json()["data"])


def run(payments: int, requests: int, cancelled_every: int) -> None:
    from web import close_app, create_app

    with private_database("paycron_bench_list") as url:
        with connect(Config(database_url=url)) as conn:
            cancelled = load_history(conn, payments, cancelled_every=cancelled_every)
            key, _ = apikeys.create_api_key(conn, PAYER)
        # The API's own rate limits, when it has them, must not be what is measured.
        config = Config.from_env(
            {
                "DATABASE_URL": url,
                "REDIS_URL": REDIS_URL,
                "REDIS_NAMESPACE": f"paycron-bench-{uuid.uuid4().hex[:8]}",
                "API_RATE_LIMIT": "1000000",
                "API_RATE_BURST": "1000000",
            }
        )
        app = create_app(config)
        try:
            client = app.test_client()
            headers = {"Authorization": f"Bearer {key}"}
            kinds = {
                "unfiltered": {"limit": 20},
                "status=CANCELLED": {"status": "CANCELLED", "limit": 20},
            }
            for query in kinds.values():
                for _ in range(WARMUP):
                    timed(client, headers, query)
            times = {name: [] for name in kinds}
            items = dict.fromkeys(kinds, 0)
            for _ in range(requests):
                for name, query in kinds.items():
                    ms, count = timed(client, headers, query)
                    times[name].append(ms)
                    items[name] = count
        finally:
            close_app(app)
    print(
        f"{payments} payments of one payer, {cancelled} CANCELLED; "
        f"{requests} requests of each kind (limit=20)"
    )
    medians = {}
    for name, samples in times.items():
        medians[name] = statistics.median(samples)
        p95 = statistics.quantiles(samples, n=20)[-1]
        print(
            f"  {name:<18} median {medians[name]:7.2f} ms  p95 {p95:7.2f} ms  "
            f"items on page one: {items[name]}"
        )
    ratio = medians["status=CANCELLED"] / medians["unfiltered"]
    print(f"  ratio filtered/unfiltered (medians): {ratio:.2f} (target <= 2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--cancelled-every", type=int, default=500, help="one payment in this many is CANCELLED"
    )
    args = vars(parse_args(parser, payments=1000, requests=10, cancelled_every=50))
    args.pop("smoke")
    run(**args)


if __name__ == "__main__":
    main()
