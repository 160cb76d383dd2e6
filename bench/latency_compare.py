"""The uncapped rate at a real processor's latency: paycron beside pgqueuer
used asynchronously, same gateway settings, same run (docs/performance.md).

N payments due now; the fake gateway answers after a lognormal latency
around the median (bench.latency's shape: p99 twice the median) with no
ceiling of its own. paycron runs the Procfile as shipped with every setting
at its default except GATEWAY_RATE_LIMIT, set high enough never to bind.
pgqueuer runs as its users would write it at this latency: one process, an
``async def`` job making the call with an aiohttp ``ClientSession``
(``POST /v1/charges``, ``Idempotency-Key`` = payment id, a connector as
wide as the tasks) and the two writes of bench.pgqueuer_compare (the
SUCCEEDED attempt row and the payment's CAS, one statement) on the asyncpg
pool pgqueuer itself runs on, ``max_concurrent_tasks`` = ``--pgq-max-tasks``.

Each side first drains ``--warmup`` payments, untimed, so both start with
their connections made (paycron's workers build their pools on the first
message; pgqueuer's factory before its first job). Then both are timed from
the moment the work is due (payments for paycron, the committed enqueue for
pgqueuer) until every payment is terminal in Postgres, and also between the
first and the last outcome written (the pace, without paycron's wait for its
sweeper's next poll). CPU per payment is user + system time over that window
of the engine's processes (paycron: scheduler and workers; pgqueuer: its
worker) and of their Postgres backends, the fake gateway's apart. Each
phase waits for the machine's 1-minute load to fall to ``--max-load``.
Target: paycron >= 1.3 x pgqueuer with the same in-flight bound (``--pgq-max-tasks 512``:
2 worker processes x GATEWAY_MAX_IN_FLIGHT) at 300 ms, >= 2 x at ``--latency-ms 0``.

At a latency, the in-flight bound caps both: with 512 calls at once, each
lasting the fake's latency and nothing else, the next started the moment
one ends, 6,000 payments take about the time :func:`bound_rate` simulates
(about 1,500/s at 300 ms: Little's law, and the last calls' tail). Each
rate is also printed as a share of its engine's bound.

    python -m bench.latency_compare [--payments 6000] [--latency-ms 300]
        [--warmup 200] [--pgq-max-tasks 512] [--pgq-batch 10] [--rounds 1]
        [--executors auto]

``--executors threads,asyncio`` runs paycron once per EXECUTOR setting in
each round, side by side (docs/performance.md); an entry may add settings,
``auto+MESSAGE_GROUP_SIZE=6`` (several: ``+A=1+B=2``); ``--latency-ms 0`` is
an instant processor.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import os
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from bench.harness import (
    System,
    cpu_seconds,
    in_flight,
    max_charges_per_key,
    parse_args,
    postgres_cpu_seconds,
    private_database,
    quiet_load,
    settled_counts,
    sustained_rate,
    wait_until_settled,
)
from bench.latency import latency_faults
from bench.pgqueuer_compare import ATTEMPT_AND_CAS, ENTRYPOINT, asyncpg_params, run_pgqueuer
from devtools.factories import bulk_insert
from devtools.procs import procfile_args
from gateway.fake.dice import lognormal_ms
from paycron.config import Config
from paycron.store.db import connect

#: High enough that paycron's shared call window never binds.
UNCAPPED_RATE_LIMIT = 100_000
#: bench.pgqueuer_compare's statement with asyncpg's positional parameters.
ATTEMPT_AND_CAS_ASYNCPG = (
    ATTEMPT_AND_CAS.replace("%(id)s", "$1::uuid")
    .replace("%(due_at)s", "$2::timestamptz")
    .replace("%(ref)s", "$3::text")
    .replace("%(worker)s", "$4::text")
)


def bound_rate(n: int, in_flight: int, median_ms: int, *, draws: int = 5) -> float:
    """About the most payments per second due -> terminal that any engine
    keeping at most ``in_flight`` calls at once reaches against this fake
    processor: ``n`` calls, each lasting one draw of the fake's latency and
    nothing else, each started the moment a place is free (Little's law,
    with the last calls' tail); the fastest of ``draws`` seeded runs (the
    fake's own draws are not seeded: a lucky run may pass it by a little)."""
    spans = []
    for seed in range(draws):
        rng = random.Random(seed)
        free = [0.0] * in_flight
        last = 0.0
        for _ in range(n):
            start = heapq.heappop(free)
            end = start + lognormal_ms(rng, median_ms, 2 * median_ms, 5 * median_ms) / 1000
            heapq.heappush(free, end)
            last = max(last, end)
        spans.append(last)
    return n / min(spans)


def paycron_in_flight(executor: str) -> int:
    """The calls paycron keeps at once at most: the Procfile's worker
    processes x GATEWAY_MAX_IN_FLIGHT (the entry's own, when it sets one)."""
    worker = procfile_args("worker")
    processes = int(worker[worker.index("--processes") + 1])
    settings = dict(pair.split("=", 1) for pair in executor.split("+")[1:])
    per_process = settings.get("GATEWAY_MAX_IN_FLIGHT") or os.environ.get(
        "GATEWAY_MAX_IN_FLIGHT", Config.gateway_max_in_flight
    )
    return processes * int(per_process)


# --------------------------------------------------------------------------
# The pgqueuer worker: `python -m bench.latency_compare --worker`


@contextlib.asynccontextmanager
async def async_factory(max_tasks: int) -> AsyncIterator[object]:
    """pgqueuer's factory: a PgQueuer over an asyncpg pool whose charge job
    is a coroutine from end to end (aiohttp call, asyncpg write)."""
    import aiohttp
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from paycron.store.transitions import worker_name

    config = Config.from_env()
    pool = await asyncpg.create_pool(**asyncpg_params(config.database_url))
    pgq = PgQueuer.from_asyncpg_pool(pool)
    # aiohttp's connector holds 100 connections by default: as wide as the
    # tasks instead, or the connector, not pgqueuer, would bound what is in flight.
    session = aiohttp.ClientSession(
        base_url=config.gateway_url,
        connector=aiohttp.TCPConnector(limit=max_tasks),
        timeout=aiohttp.ClientTimeout(total=config.gateway_timeout_seconds),
    )
    worker = worker_name()

    @pgq.entrypoint(ENTRYPOINT)
    async def charge_payment(job: Job) -> None:
        text_id, due, amount = job.payload.decode().split(",")
        async with session.post(
            "/v1/charges",
            headers={"Idempotency-Key": text_id},
            json={"amount": int(amount), "currency": "USD", "reference": text_id},
        ) as response:
            if response.status not in (200, 201):
                raise RuntimeError(f"gateway answered {response.status} for {text_id}")
            charge = await response.json()
        await pool.execute(
            ATTEMPT_AND_CAS_ASYNCPG,
            uuid.UUID(text_id),
            datetime.fromisoformat(due),
            charge["id"],
            worker,
        )

    try:
        yield pgq
    finally:
        await session.close()
        await pool.close()


def run_worker(batch: int, max_tasks: int) -> None:
    """One pgqueuer worker process as `pgq run` starts it (uvloop, signal
    handlers, supervisor); see bench.pgqueuer_compare.run_worker."""
    import uvloop
    from pgqueuer import run

    uvloop.run(
        run(
            functools.partial(async_factory, max_tasks),
            batch_size=batch,
            dequeue_timeout=timedelta(seconds=1),
            max_concurrent_tasks=max_tasks,
        )
    )


# --------------------------------------------------------------------------
# The driver


def faults(median_ms: int) -> dict:
    """The processor's latency; 0: it answers at once."""
    return latency_faults(median_ms) if median_ms else {}


def run_paycron(
    database_url: str,
    n: int,
    median_ms: int,
    *,
    warmup: int,
    lead_seconds: float = 8.0,
    executor: str = "threads",
) -> dict:
    """The Procfile as shipped, only GATEWAY_RATE_LIMIT set (out of the way)
    and EXECUTOR (with any ``+NAME=VALUE`` settings after it, e.g.
    ``auto+MESSAGE_GROUP_SIZE=6``); ``warmup`` payments first (untimed),
    then ``n`` due at one second."""
    name, *extra = executor.split("+")
    system = System(
        database_url,
        {
            "GATEWAY_RATE_LIMIT": str(UNCAPPED_RATE_LIMIT),
            "EXECUTOR": name,
            **dict(pair.split("=", 1) for pair in extra),
        },
        worker_processes=None,
        worker_threads=None,
    )  # the Procfile's
    try:
        system.start_gateway(**faults(median_ms))
        system.start_engine()
        with connect(system.config()) as conn:
            if warmup:
                bulk_insert(conn, warmup)
                wait_until_settled(conn, warmup, timeout=120, tick=0.1)
            due = (datetime.now(UTC) + timedelta(seconds=lead_seconds)).replace(microsecond=0)
            bulk_insert(conn, n, due_at=due)
            time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
            gateway_proc, *engine_procs = system.procs.procs
            cpu_before = (
                cpu_seconds(engine_procs),
                cpu_seconds([gateway_proc]),
                postgres_cpu_seconds(database_url),
            )
            seconds = wait_until_settled(conn, n, timeout=600, tick=0.1)
            cpu = cpu_seconds(engine_procs) - cpu_before[0]
            gateway_cpu = cpu_seconds([gateway_proc]) - cpu_before[1]
            postgres_cpu = postgres_cpu_seconds(database_url) - cpu_before[2]
            counts = settled_counts(conn)
            flight = in_flight(conn, since=due)
            sustained = sustained_rate(conn, due)
        ledger = system.ledger()
        at_once = system.gateway_stats()["charges_in_progress_max"]
    finally:
        system.stop()
    return {
        "seconds": seconds,
        "per_second": n / seconds,
        "sustained": sustained,
        "completed": counts["completed"] - warmup,
        "lease_expired": counts["lease_expired"],
        "in_flight": flight,
        "cpu": cpu,
        "gateway_cpu": gateway_cpu,
        "postgres_cpu": postgres_cpu,
        "charges": len(ledger) - warmup,
        "max_charges_per_key": max_charges_per_key(ledger),
        # the most charge requests the processor was answering at once
        "calls_at_once": at_once,
    }


def run_pgqueuer_async(
    database_url: str, n: int, median_ms: int, *, warmup: int, batch: int, max_tasks: int
) -> dict:
    worker = [
        "-m",
        "bench.latency_compare",
        "--worker",
        "--pgq-batch",
        str(batch),
        "--pgq-max-tasks",
        str(max_tasks),
    ]
    return run_pgqueuer(
        database_url,
        n,
        worker_args=worker,
        processes=1,
        faults=faults(median_ms),
        warmup=warmup,
        tick=0.1,
    )


def report(
    name: str, r: dict, n: int, load: float, detail: str, bound: float | None = None
) -> None:
    share = f", {r['per_second'] / bound:.0%} of its bound" if bound else ""
    print(
        f"  {name:<16}: {r['per_second']:5.0f} payments/s due -> all terminal "
        f"({r['seconds']:.1f} s{share}), {r['sustained']:5.0f}/s first -> last outcome; "
        f"load {load:.2f} at start"
    )
    print(
        f"  {'':<16}  CPU per payment {1000 * r['cpu'] / n:.2f} ms in the engine, "
        f"{1000 * r['postgres_cpu'] / n:.2f} ms in its Postgres backends (the fake gateway "
        f"{1000 * r['gateway_cpu'] / n:.2f} ms)"
    )
    print(
        f"  {'':<16}  completed {r['completed']}, charges {r['charges']}, max per key "
        f"{r['max_charges_per_key']}; {detail}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=6000)
    parser.add_argument("--latency-ms", type=int, default=300, help="median gateway latency")
    parser.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="payments each side drains first, untimed (connections made)",
    )
    parser.add_argument(
        "--pgq-max-tasks",
        type=int,
        default=512,
        help="pgqueuer's tasks at once: the same in-flight bound as paycron's "
        "(2 worker processes x GATEWAY_MAX_IN_FLIGHT 256)",
    )
    parser.add_argument(
        "--pgq-batch", type=int, default=10, help="pgqueuer's batch size (default: `pgq run`'s)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="pairs of runs (paycron, then pgqueuer); the ratio of medians",
    )
    parser.add_argument(
        "--max-load",
        type=float,
        default=1.5,
        help="each phase waits (up to 10 min) for the 1-minute load to fall to this",
    )
    parser.add_argument(
        "--lead-seconds", type=float, default=8.0, help="how far ahead the timed rows are written"
    )
    parser.add_argument(
        "--executors",
        default="auto",
        help="paycron's EXECUTOR settings to run, comma-separated, each round in this order "
        "(auto: what ships, the event loop for the card processor; threads,asyncio: both "
        "side by side; auto+MESSAGE_GROUP_SIZE=6: with that setting too)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(
        parser, payments=60, warmup=10, latency_ms=20, rounds=1, max_load=1e9, lead_seconds=3.0
    )
    if args.worker:
        run_worker(args.pgq_batch, args.pgq_max_tasks)
        return
    n, median, warmup = args.payments, args.latency_ms, args.warmup
    target = 2 if median == 0 else 1.3
    from importlib.metadata import version

    print(
        f"{n} payments due now (after {warmup} untimed), fake gateway "
        + (f"~{median} ms (lognormal, p99 {2 * median} ms)" if median else "instant")
        + ", no ceiling"
    )
    print(
        f"  paycron : the Procfile as shipped, GATEWAY_RATE_LIMIT={UNCAPPED_RATE_LIMIT}, "
        f"every other setting at its default"
    )
    print(
        f"  pgqueuer: {version('pgqueuer')}, async job (aiohttp {version('aiohttp')} + "
        f"asyncpg pool), {args.pgq_max_tasks} tasks, batch {args.pgq_batch}, one process"
    )
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    # Only a latency bounds the rate; at an instant processor the machine does.
    bounds: dict[str, float | None] = {}
    for name, places in [
        ("pgqueuer", args.pgq_max_tasks),
        *((e, paycron_in_flight(e)) for e in executors),
    ]:
        bounds[name] = bound_rate(n, places, median) if median else None
        if median:
            print(
                f"  bound ({name}): {places} calls at once, each the fake's latency and "
                f"nothing else, the next started the moment one ends: about "
                f"{bounds[name]:.0f} payments/s due -> terminal"
            )
    rates: dict[str, list[float]] = {"pgqueuer": [], **{e: [] for e in executors}}
    cpu: dict[str, list[float]] = {"pgqueuer": [], **{e: [] for e in executors}}
    for i in range(args.rounds):
        print(f"round {i + 1}")
        engines = {}
        for executor in executors:
            load = quiet_load(args.max_load)
            with private_database() as url:
                engine = run_paycron(
                    url,
                    n,
                    median,
                    warmup=warmup,
                    lead_seconds=args.lead_seconds,
                    executor=executor,
                )
            flight = engine["in_flight"]
            report(
                f"paycron {executor}",
                engine,
                n,
                load,
                f"calls at the processor at once max {engine['calls_at_once']}; attempts "
                f"open max {flight['max']}, mean {flight['mean']:.0f}; lease "
                f"expirations {engine['lease_expired']}",
                bounds[executor],
            )
            engines[executor] = engine
            rates[executor].append(engine["per_second"])
            cpu[executor].append(1000 * engine["cpu"] / n)
        load = quiet_load(args.max_load)
        with private_database() as url:
            pgq = run_pgqueuer_async(
                url, n, median, warmup=warmup, batch=args.pgq_batch, max_tasks=args.pgq_max_tasks
            )
        report(
            "pgqueuer (async)",
            pgq,
            n,
            load,
            f"calls at the processor at once max {pgq['calls_at_once']}; "
            f"enqueue {pgq['enqueue_seconds']:.2f} s, untimed",
            bounds["pgqueuer"],
        )
        rates["pgqueuer"].append(pgq["per_second"])
        cpu["pgqueuer"].append(1000 * pgq["cpu"] / n)
        pgq_total = pgq["cpu"] + pgq["postgres_cpu"]
        for executor, engine in engines.items():
            engine_total = engine["cpu"] + engine["postgres_cpu"]
            print(
                f"  ratio paycron / pgqueuer ({executor}): "
                f"{engine['per_second'] / pgq['per_second']:.2f} due -> terminal, "
                f"{engine['sustained'] / pgq['sustained']:.2f} sustained (target >= {target}); "
                f"CPU per payment {engine['cpu'] / pgq['cpu']:.2f}x in the engine, "
                f"{engine_total / pgq_total:.2f}x with Postgres"
            )
    if args.rounds > 1:
        print(f"median of {args.rounds} rounds:")
        for name in rates:
            rate = statistics.median(rates[name])
            bound = bounds[name]
            share = f" ({rate / bound:.0%} of its bound)" if bound else ""
            print(
                f"  {name:<16}: {rate:5.0f} payments/s due -> terminal{share}, "
                f"engine CPU {statistics.median(cpu[name]):.2f} ms per payment"
            )


if __name__ == "__main__":
    main()
