"""Sweep cost against history: claim latency with 10,000 PENDING rows due
now, in a database with no history beside one holding 5,000,000 terminal
rows (COMPLETED / FAILED / CANCELLED) spread over the past 90 day
partitions. Both databases have the same partitions (the past 90 days are
created in both). Target: median(history) / median(empty) <= 1.2.

Each claim is ``claim_due(limit=10)`` in its own transaction (autocommit:
one statement), timed from the client. The two databases are measured in
alternating blocks so that load from elsewhere on the machine falls on both
alike. History rows are generated in SQL (INSERT ... SELECT generate_series)
with ids built like paycron/domain/ids.py: the due time in milliseconds in the top
48 bits, version 7, variant 10, the rest random. Both databases are
VACUUM ANALYZEd after loading, so autovacuum does not run during the
measurement in one of them only.

    python -m bench.sweep_history [--history 5000000] [--pending 10000]
        [--claims 1000] [--days 90]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from psycopg import sql

from bench.harness import private_database
from devtools.factories import bulk_insert
from paycron.config import Config
from paycron.sql import q
from paycron.store.db import connect
from paycron.store.partitions import day_start, partition_name
from paycron.store.transitions import claim_due

#: A payment id in SQL, as paycron/domain/ids.py makes it: 48 bits of due time in
#: ms, the version nibble 7, then 19 hex digits of a v4 UUID starting right
#: after its version nibble (so its variant bits 10 come along).
PAYMENT_ID_SQL = """(lpad(to_hex(floor(extract(epoch FROM {due}) * 1000)::bigint), 12, '0')
     || '7' || substr(replace(gen_random_uuid()::text, '-', ''), 14, 19))::uuid"""

#: ``n`` terminal rows spread evenly over [first_day, first_day + days):
#: 90% COMPLETED, 5% FAILED (DECLINED), 5% CANCELLED.
HISTORY_SQL = """
INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at, status,
                      attempt, failure_reason, created_at, updated_at)
SELECT {id}, due, 'payer-' || (g %% 1000), 'shop', 100 + g %% 10000, 'USD', due,
       CASE g %% 20 WHEN 0 THEN 'FAILED' WHEN 1 THEN 'CANCELLED' ELSE 'COMPLETED' END,
       CASE g %% 20 WHEN 1 THEN 0 ELSE 1 END,
       CASE g %% 20 WHEN 0 THEN 'DECLINED' END,
       due - interval '1 day', due + interval '1 second'
FROM (SELECT g, date_trunc('milliseconds', %(first)s::timestamptz
                          + (%(span)s::interval * g / %(n)s)) AS due
      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g) AS s
"""


def create_past_partitions(conn, days: int) -> None:
    """Day partitions for the ``days`` days before today (yesterday and on
    already exist: paycron creates them)."""
    today = datetime.now(UTC).date()
    for n in range(days, 0, -1):
        day = today - timedelta(days=n)
        conn.execute(
            sql.SQL(q("create_partition")).format(
                name=sql.Identifier(partition_name(day)),
                start=sql.Literal(day_start(day)),
                end=sql.Literal(day_start(day + timedelta(days=1))),
            )
        )


def load_history(conn, n: int, days: int, chunks: int = 10) -> float:
    """``n`` terminal rows over the past ``days`` days; seconds it took."""
    first = day_start(datetime.now(UTC).date() - timedelta(days=days))
    statement = sql.SQL(HISTORY_SQL).format(id=sql.SQL(PAYMENT_ID_SQL.format(due="due")))
    started = time.monotonic()
    step = -(-n // chunks)
    for lo in range(0, n, step):
        conn.execute(
            statement,
            {
                "first": first,
                "span": timedelta(days=days),
                "n": n,
                "lo": lo,
                "hi": min(n, lo + step),
            },
        )
        print(
            f"  history rows {min(n, lo + step)}/{n} ({time.monotonic() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return time.monotonic() - started


def check_ids(conn) -> int:
    """Rows whose id does not carry its due time (as paycron.domain.ids would): 0."""
    return conn.execute("""
        SELECT count(*) AS n FROM (SELECT id, due_at FROM payments TABLESAMPLE SYSTEM (1)) s
        WHERE ('x' || substr(replace(id::text, '-', ''), 1, 12))::bit(48)::bigint
              <> floor(extract(epoch FROM due_at) * 1000)::bigint
           OR substr(id::text, 15, 1) <> '7'
           OR substr(id::text, 20, 1) NOT IN ('8', '9', 'a', 'b')""").fetchone()["n"]


def partition_count(conn) -> int:
    return len(conn.execute(q("payment_partitions")).fetchall())


class Rollback(Exception):
    pass


def explain_summary(conn) -> str:
    try:
        with conn.transaction():
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("lock_due_fairly"),
                {"limit": 10, "now": datetime.now(UTC)},
            ).fetchone()
            raise Rollback(plan)
    except Rollback as done:
        (row,) = done.args
    top = next(iter(row.values()))[0]
    shared = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return (
        f"the claim's lock step: planning {top['Planning Time']:.2f} ms, execution "
        f"{top['Execution Time']:.2f} ms, {shared} shared buffers"
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--limit", type=int, default=10, help="rows per claim")
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--block", type=int, default=50, help="claims per alternating block")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        urls = {
            "empty": stack.enter_context(private_database("paycron_bench_empty")),
            "history": stack.enter_context(private_database("paycron_bench_hist")),
        }
        conns = {
            name: stack.enter_context(connect(Config(database_url=url)))
            for name, url in urls.items()
        }
        for conn in conns.values():
            create_past_partitions(conn, args.days)
        load_seconds = load_history(conns["history"], args.history, args.days)
        bad_ids = check_ids(conns["history"])
        for name, conn in conns.items():
            bulk_insert(conn, args.pending)
            started = time.monotonic()
            conn.execute("VACUUM (ANALYZE) payments")
            print(
                f"  {name}: VACUUM ANALYZE {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        counts = {
            name: conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending, "
                "count(*) FILTER (WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED'))"
                " AS terminal "
                "FROM payments"
            ).fetchone()
            for name, conn in conns.items()
        }
        partitions = {name: partition_count(conn) for name, conn in conns.items()}
        # Warm each session (relation caches of every partition) and show the plan's cost.
        plans = {name: explain_summary(conn) for name, conn in conns.items()}
        timings: dict[str, list[float]] = {"empty": [], "history": []}
        claimed = {"empty": 0, "history": 0}
        done = 0
        while done < args.claims:
            block = min(args.block, args.claims - done)
            for name in (
                ("empty", "history") if done // args.block % 2 == 0 else ("history", "empty")
            ):
                conn = conns[name]
                for _ in range(block):
                    started = time.perf_counter()
                    claims = claim_due(conn, limit=args.limit, lease_seconds=120)
                    timings[name].append((time.perf_counter() - started) * 1000)
                    claimed[name] += len(claims)
            done += block
        plans_after = {name: explain_summary(conn) for name, conn in conns.items()}
    empty, history = timings["empty"], timings["history"]
    med_e, med_h = statistics.median(empty), statistics.median(history)
    print(
        f"partitions: empty {partitions['empty']}, history {partitions['history']} "
        f"(past {args.days} days created in both)"
    )
    print(
        f"rows: empty {counts['empty']['pending']} PENDING + {counts['empty']['terminal']} "
        f"terminal; history {counts['history']['pending']} PENDING + "
        f"{counts['history']['terminal']} terminal (loaded in {load_seconds:.0f} s; "
        f"ids not carrying their due time in a 1% sample: {bad_ids})"
    )
    print(
        f"claims: {args.claims} x claim_due(limit={args.limit}) each, own transaction; "
        f"rows claimed: empty {claimed['empty']}, history {claimed['history']}"
    )
    print(
        f"no history  : median {med_e:.2f} ms, p90 {percentile(empty, 0.9):.2f} ms, "
        f"max {max(empty):.2f} ms"
    )
    print(
        f"{args.history // 1000}k history: median {med_h:.2f} ms, p90 "
        f"{percentile(history, 0.9):.2f} ms, max {max(history):.2f} ms"
    )
    print(
        f"ratio history / empty (median): {med_h / med_e:.2f}   (target <= 1.2: "
        f"{'met' if med_h / med_e <= 1.2 else 'MISSED'}); p90 ratio "
        f"{percentile(history, 0.9) / percentile(empty, 0.9):.2f}"
    )
    for name in ("empty", "history"):
        print(
            f"EXPLAIN ANALYZE one claim, {name:7s}: before {plans[name]}; after the claims "
            f"{plans_after[name]}"
        )


if __name__ == "__main__":
    main()
