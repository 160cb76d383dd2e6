"""Sweep cost against history: claim latency with PENDING rows due now, in a
fresh database (paycron's own partitions only) beside one holding 5,000,000
terminal rows (COMPLETED / FAILED / CANCELLED) in 90 past day partitions
still attached (the retention). The history database is claimed from twice,
in the same run: as the partition keeper leaves it (the live bound raised
past every settled day, so claims prune those days at plan time) and with
the bound held at its lowest (every past day planned: paycron before the
bound). Target: median(history) / median(fresh) <= 1.2.

Each claim is ``claim_due(limit=10)`` in its own transaction, timed from the
client. The series are measured in alternating blocks so that load from
elsewhere on the machine falls on all alike. History rows are generated in
SQL (INSERT ... SELECT generate_series) with ids built like
paycron/domain/ids.py: the due time in milliseconds in the top 48 bits,
version 7, variant 10, the rest random. Both databases are VACUUM ANALYZEd
after loading, so autovacuum does not run during the measurement in one of
them only. EXPLAIN ANALYZE of one claim's lock step gives planning and
execution time apart.

    python -m bench.sweep_history [--history 5000000] [--pending 10000]
        [--claims 1000] [--days 90] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from psycopg import sql

from bench.harness import parse_args, private_database
from devtools.factories import bulk_insert
from paycron.config import Config
from paycron.sql import q
from paycron.store.db import connect
from paycron.store.partitions import day_start, live_bound, partition_name, raise_live_bound
from paycron.store.transitions import claim_due

#: The bound at its lowest: every attached day is planned (paycron before it).
LOWEST = datetime(1, 1, 1, tzinfo=UTC)

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


def explain_summary(conn, live_from: datetime) -> str:
    try:
        with conn.transaction():
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("lock_due_fairly"),
                {
                    "limit": 10,
                    "now": datetime.now(UTC),
                    "processor": "fake",
                    "live_from": live_from,
                },
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
    args = parse_args(parser, history=20_000, pending=200, claims=40, days=10, block=10)
    series = ("fresh", "history", "history, bound lowest")
    with contextlib.ExitStack() as stack:
        urls = {
            "fresh": stack.enter_context(private_database("paycron_bench_fresh")),
            "history": stack.enter_context(private_database("paycron_bench_hist")),
        }
        conns = {
            name: stack.enter_context(connect(Config(database_url=urls[db])))
            for name, db in zip(series, ("fresh", "history", "history"), strict=True)
        }
        create_past_partitions(conns["history"], args.days)
        load_seconds = load_history(conns["history"], args.history, args.days)
        bad_ids = check_ids(conns["history"])
        for name, pending in (("fresh", args.pending), ("history", 2 * args.pending)):
            conn = conns[name]
            bulk_insert(conn, pending)
            started = time.monotonic()
            conn.execute("VACUUM (ANALYZE) payments")
            print(
                f"  {name}: VACUUM ANALYZE {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        raise_live_bound(conns["history"])  # what the partition keeper does
        raise_seconds = time.monotonic() - started
        bounds = {
            "fresh": live_bound(conns["fresh"]),
            "history": live_bound(conns["history"]),
            "history, bound lowest": LOWEST,
        }
        counts = {
            db: conns[db]
            .execute(
                "SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending, "
                "count(*) FILTER (WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED'))"
                " AS terminal "
                "FROM payments"
            )
            .fetchone()
            for db in ("fresh", "history")
        }
        partitions = {db: partition_count(conns[db]) for db in ("fresh", "history")}
        # Warm each session (relation caches of every partition) and show the plan's cost.
        plans = {name: explain_summary(conns[name], bounds[name]) for name in series}
        timings: dict[str, list[float]] = {name: [] for name in series}
        claimed = dict.fromkeys(series, 0)
        done = 0
        while done < args.claims:
            block = min(args.block, args.claims - done)
            turn = done // args.block % len(series)
            for name in series[turn:] + series[:turn]:
                conn = conns[name]
                for _ in range(block):
                    started = time.perf_counter()
                    claims = claim_due(
                        conn, limit=args.limit, lease_seconds=120, live_from=bounds[name]
                    )
                    timings[name].append((time.perf_counter() - started) * 1000)
                    claimed[name] += len(claims)
            done += block
        plans_after = {name: explain_summary(conns[name], bounds[name]) for name in series}
    print(
        f"partitions: fresh {partitions['fresh']}, history {partitions['history']} "
        f"(the past {args.days} days attached); live bound: history "
        f"{bounds['history']:%Y-%m-%d} (raised in {raise_seconds:.1f} s), fresh "
        f"{bounds['fresh']:%Y-%m-%d}"
    )
    print(
        f"rows: fresh {counts['fresh']['pending']} PENDING + {counts['fresh']['terminal']} "
        f"terminal; history {counts['history']['pending']} PENDING + "
        f"{counts['history']['terminal']} terminal (loaded in {load_seconds:.0f} s; "
        f"ids not carrying their due time in a 1% sample: {bad_ids})"
    )
    print(
        f"claims: {args.claims} x claim_due(limit={args.limit}) per series, each in its own "
        f"transaction, series alternating in blocks of {args.block}; rows claimed: {claimed}"
    )
    fresh = statistics.median(timings["fresh"])
    for name in series:
        t = timings[name]
        print(
            f"{name:22}: median {statistics.median(t):6.2f} ms, p90 {percentile(t, 0.9):6.2f} "
            f"ms, max {max(t):6.2f} ms; ratio to fresh (median) "
            f"{statistics.median(t) / fresh:.2f}"
        )
    ratio = statistics.median(timings["history"]) / fresh
    print(
        f"ratio history / fresh (median): {ratio:.2f}   (target <= 1.2: "
        f"{'met' if ratio <= 1.2 else 'MISSED'}); load {os.getloadavg()[0]:.2f} at the end"
    )
    for name in series:
        print(
            f"EXPLAIN ANALYZE one claim, {name:22}: before the claims {plans[name]}; "
            f"after them {plans_after[name]}"
        )


if __name__ == "__main__":
    main()
