"""A prompt start: how long after its due time a payment is claimed (and its
call starts), over a steady trickle, with paycron's prompt start on
(PROMPT_START=true, the default) and off (the sweep every
SWEEP_INTERVAL_SECONDS only), in the same run.

Two kinds of payment fall due at ``--rate`` per second each, for
``--seconds``: ones written well ahead (the sweep learns their run_at from
the schedule) and ones created through the API 300 ms before they fall due
(the create announces them). Each mode runs the Procfile's web, scheduler
and workers on a fresh database with an instant fake gateway; the
default engine settings otherwise (sweep interval 2 s). The claim time is
the claim's ``payment.processing`` event (its transaction's start); the
call's start is the attempt row's. Target: due -> claimed p99 <= 100 ms
with the prompt start.

    python -m bench.prompt_start [--rate 5] [--seconds 30] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx

from bench.harness import (
    System,
    parse_args,
    private_database,
    wait_until_settled,
)
from devtools.procs import free_port, wait_http, web_args
from paycron.domain.ids import new_payment_id
from paycron.sql import parse_blocks
from paycron.store.apikeys import create_api_key
from paycron.store.db import connect

QUERIES = parse_blocks("""
-- name: lateness
-- Per kind (payer): seconds from due to the first claim, and to the first call.
SELECT p.payer AS kind,
       array_agg(extract(epoch FROM e.created_at - p.due_at)::float8) AS claimed,
       array_agg(extract(epoch FROM a.started_at - p.due_at)::float8) AS started
FROM payments p
JOIN payment_events e ON e.payment_id = p.id AND e.type = 'payment.processing'
                     AND e.attempt = 1
JOIN attempts a ON a.payment_id = p.id AND a.due_at = p.due_at AND a.attempt = 1
WHERE p.due_at >= %(since)s
GROUP BY p.payer ORDER BY p.payer;
""")

#: How long before its due time an announced payment is created.
ANNOUNCED_LEAD = timedelta(milliseconds=300)


def write_ahead(conn, start: datetime, n: int, rate: float) -> None:
    """``n`` payments due from ``start``, one every 1/rate s, written now."""
    with conn.cursor().copy(
        "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at) FROM STDIN"
    ) as copy:
        for i in range(n):
            due = start + timedelta(seconds=(i + 0.5) / rate)
            copy.write_row((new_payment_id(due), due, "ahead", "shop", 100, "USD", due))


def create_announced(base: str, key: str, start: datetime, n: int, rate: float) -> list[str]:
    """``n`` creates through the API, each ANNOUNCED_LEAD before its due
    time, one every 1/rate s from ``start``; the errors, if any."""
    errors = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
        for i in range(n):
            due = start + timedelta(seconds=i / rate)
            pause = (due - ANNOUNCED_LEAD - datetime.now(UTC)).total_seconds()
            if pause > 0:
                time.sleep(pause)
            answer = client.post(
                "/v1/scheduled-payments",
                json={"payee": "shop", "amount": 100, "dueAt": due.isoformat()},
                headers={"Idempotency-Key": f"announced-{i}"},
            )
            if answer.status_code != 201:
                errors.append(f"{answer.status_code} {answer.text[:200]}")
    return errors


def run_mode(prompt: bool, rate: float, seconds: float, lead: float) -> dict:
    n = int(rate * seconds)
    with private_database() as url:
        with connect_url(url) as conn:
            key, _ = create_api_key(conn, "announced")
        system = System(
            url,
            {"PROMPT_START": "true" if prompt else "false"},
            worker_processes=None,
            worker_threads=None,
        )
        try:
            system.start_gateway()
            system.start_engine()
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            wait_http(base + "/readyz", system.procs.start("web", web_args(port, workers=2)))
            start = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
            with connect_url(url) as conn:
                write_ahead(conn, start, n, rate)
                errors: list[str] = []
                creator = threading.Thread(
                    target=lambda: errors.extend(create_announced(base, key, start, n, rate))
                )
                creator.start()
                creator.join()
                wait_until_settled(conn, 2 * n, timeout=120, tick=0.2)
                rows = {r["kind"]: r for r in conn.execute(QUERIES["lateness"], {"since": start})}
        finally:
            system.stop()
    return {"n": n, "rows": rows, "errors": errors}


def connect_url(url: str):
    from paycron.config import Config

    return connect(Config(database_url=url))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]


def describe(values: list[float]) -> str:
    ms = [1000 * v for v in values]
    return (
        f"p50 {statistics.median(ms):7.1f} ms, p99 {percentile(ms, 0.99):7.1f} ms, "
        f"max {max(ms):7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5.0, help="payments per second per kind")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument(
        "--lead-seconds", type=float, default=10.0, help="from the start to the first due time"
    )
    parser.add_argument(
        "--modes", default="on,off", help="prompt start on, off, or both (in this order)"
    )
    args = parse_args(parser, rate=5.0, seconds=2.0, lead_seconds=3.0)
    load = os.getloadavg()[0]
    results = {
        mode: run_mode(mode == "on", args.rate, args.seconds, args.lead_seconds)
        for mode in args.modes.split(",")
    }
    print(
        f"trickle: {args.rate:g}/s written ahead + {args.rate:g}/s created through the API "
        f"{ANNOUNCED_LEAD.total_seconds() * 1000:.0f} ms before due, for {args.seconds:g} s; "
        f"instant gateway, the Procfile's processes, default settings; load {load:.2f} at start"
    )
    for mode, result in results.items():
        for kind, label in (("ahead", "written ahead"), ("announced", "created, announced")):
            row = result["rows"].get(kind)
            if row is None:
                print(f"  prompt start {mode:3}, {label:18}: no payment claimed")
                continue
            print(
                f"  prompt start {mode:3}, {label:18}: due -> claimed {describe(row['claimed'])};"
                f" due -> call started {describe(row['started'])} (n={len(row['claimed'])})"
            )
        if result["errors"]:
            failed = result["errors"]
            print(f"  prompt start {mode}: {len(failed)} creates failed: {failed[:3]}")
    if "on" in results:
        claimed = [v for row in results["on"]["rows"].values() for v in row["claimed"]]
        p99 = 1000 * percentile(claimed, 0.99) if claimed else float("inf")
        print(
            f"target: due -> claimed p99 <= 100 ms with the prompt start: {p99:.1f} ms -> "
            f"{'met' if p99 <= 100 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
