"""Steady state: a constant inflow at half the gateway's ceiling, default
engine settings. Trigger lateness (first attempt's start - due time)
p50/p99/max from the attempts table, overall and per minute, 429s and
lease expirations. Target: p99 <= 5 s.

The engine runs with every setting at its default (GATEWAY_RATE_LIMIT 100,
SWEEP_INTERVAL_SECONDS 2, CLAIM_BATCH 100, LEASE_SECONDS 120, ...) and the
Procfile's process shapes (one scheduler; ``dramatiq tasks --processes 2
--threads 8``); the fake gateway has its ceiling at the rate limit and
answers at once, or with ``--latency-ms`` after a real processor's latency
(lognormal around that median, p99 twice it: bench.latency's shape).
``--rate`` payments fall due every second (default 50, half the ceiling),
due times spread evenly inside each second, for ``--minutes`` (default 3).
Every row is written ahead of time, by COPY, before the first one falls due.

    python -m bench.steady_state [--minutes 3] [--rate 50] [--latency-ms 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta

from bench.harness import (
    ALL_TIME,
    System,
    cpu_seconds,
    max_charges_per_key,
    parse_args,
    private_database,
    settled_counts,
    wait_until_settled,
)
from bench.latency import latency_faults
from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.sql import parse_blocks
from paycron.store.db import connect
from paycron.store.stats import lateness

QUERIES = parse_blocks("""
-- name: lateness_by_minute
-- The same, per minute of the inflow (by due time).
SELECT floor(extract(epoch FROM due_at - %(start)s) / 60)::int AS minute, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - due_at)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - due_at)) AS p99,
       max(extract(epoch FROM started_at - due_at)) AS max
FROM attempts WHERE attempt = 1
GROUP BY 1 ORDER BY 1;

-- name: attempt_counts
-- Attempts by what became of them.
SELECT count(*) FILTER (WHERE outcome = 'LEASE_EXPIRED') AS lease_expired,
       count(*) FILTER (WHERE outcome = 'RATE_LIMITED') AS rate_limited,
       count(*) FILTER (WHERE outcome = 'SUCCEEDED') AS succeeded,
       count(*) AS attempts
FROM attempts;

-- name: progress
-- Payments due so far, and how many of them have started.
SELECT count(*) FILTER (WHERE due_at <= now()) AS due,
       count(*) FILTER (WHERE due_at <= now() AND attempt > 0) AS started
FROM payments WHERE due_at < %(until)s;
""")


def insert_inflow(conn, start: datetime, total: int, rate: int) -> None:
    """``total`` PENDING payments, ``rate`` due per second from ``start``,
    evenly spread inside each second."""
    step = timedelta(seconds=1) / rate
    with conn.cursor().copy(
        "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at) FROM STDIN"
    ) as copy:
        for i in range(total):
            due = start + i * step
            copy.write_row(
                (new_payment_id(due), due, "alice", "shop", 100 + i % 10_000, "USD", due)
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument(
        "--rate",
        type=int,
        default=None,
        help="payments falling due per second (default: half the ceiling)",
    )
    parser.add_argument(
        "--lead-seconds",
        type=float,
        default=15.0,
        help="how far ahead of the first due time the rows are written",
    )
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=0,
        help="median gateway latency, lognormal (default 0: instant)",
    )
    args = parse_args(parser, minutes=0.1, rate=20, lead_seconds=3.0)
    defaults = Config()
    ceiling = defaults.gateway_rate_limit
    rate = args.rate or ceiling // 2
    total = int(rate * args.minutes * 60)
    with private_database() as url:
        # No settings: every engine setting at its default.
        system = System(url, {}, worker_processes=None, worker_threads=None)  # the Procfile's
        loadavg = os.getloadavg()[0]
        try:
            latency = latency_faults(args.latency_ms) if args.latency_ms else {}
            system.start_gateway(rate_limit_per_s=ceiling, **latency)
            system.start_engine()
            start = (datetime.now(UTC) + timedelta(seconds=args.lead_seconds)).replace(
                microsecond=0
            )
            end = start + timedelta(seconds=total / rate)
            with connect(system.config()) as conn:
                insert_inflow(conn, start, total, rate)
                conn.execute("ANALYZE payments")
                gateway_proc, *engine_procs = system.procs.procs
                cpu_before = cpu_seconds(engine_procs)
                print(
                    f"{total} payments written, {rate}/s due from {start:%H:%M:%S} to "
                    f"{end:%H:%M:%S} UTC",
                    file=sys.stderr,
                    flush=True,
                )
                while datetime.now(UTC) < end:
                    time.sleep(min(30.0, max(0.0, (end - datetime.now(UTC)).total_seconds())))
                    row = conn.execute(QUERIES["progress"], {"until": end}).fetchone()
                    print(
                        f"  {datetime.now(UTC):%H:%M:%S} due {row['due']}, started "
                        f"{row['started']}, behind {row['due'] - row['started']}",
                        file=sys.stderr,
                        flush=True,
                    )
                tail = wait_until_settled(
                    conn, total, timeout=600, until=end + timedelta(seconds=1)
                )
                cpu = cpu_seconds(engine_procs) - cpu_before
                late = lateness(conn, since=ALL_TIME)
                by_minute = conn.execute(QUERIES["lateness_by_minute"], {"start": start}).fetchall()
                counts = conn.execute(QUERIES["attempt_counts"]).fetchone()
                statuses = {
                    r["status"]: r["n"]
                    for r in conn.execute(
                        "SELECT status, count(*) AS n FROM payments GROUP BY status"
                    )
                }
                expiries = settled_counts(conn)["lease_expired"]
            ledger = system.ledger()
            gateway = system.gateway_stats()
        finally:
            system.stop()
    print(
        f"steady inflow: {rate} payments/s due for {args.minutes:g} min ({total} payments), "
        f"gateway ceiling {ceiling}/s, default engine settings "
        f"(sweep {defaults.sweep_interval_seconds:g} s, claim batch {defaults.claim_batch}, "
        f"lease {defaults.lease_seconds:g} s), the Procfile's scheduler and workers; gateway "
        + (
            f"~{args.latency_ms} ms (lognormal, p99 {2 * args.latency_ms} ms)"
            if args.latency_ms
            else "instant"
        )
        + f"; load {loadavg:.2f} at start"
    )
    print(
        f"lateness p50 / p99 / max : {late['p50']:.2f} / {late['p99']:.2f} / "
        f"{late['max']:.2f} s over {late['n']} first attempts   (target p99 <= 5 s: "
        f"{'met' if late['p99'] <= 5 else 'MISSED'})"
    )
    print(
        "per minute (by due time)  : "
        + "; ".join(
            f"m{r['minute']} p50 {r['p50']:.2f} p99 {r['p99']:.2f} max {r['max']:.2f}"
            for r in by_minute
        )
    )
    print(
        f"429s answered by gateway : {gateway['rate_limited']} "
        f"(attempts recorded RATE_LIMITED: {counts['rate_limited']})"
    )
    print(f"lease expirations        : {counts['lease_expired']} attempts, {expiries} payments")
    print(
        f"outcome                  : {statuses}; settled {tail:.1f} s after the last due "
        f"time; gateway charges {len(ledger)}, max per key {max_charges_per_key(ledger)}"
    )
    print(
        f"CPU per payment          : {1000 * cpu / total:.2f} ms in the engine (scheduler + "
        f"workers, over the whole inflow)"
    )


if __name__ == "__main__":
    main()
