"""CPU per payment of a worker's executor, threaded beside async
(``EXECUTOR=threads|asyncio``), in one process and one run.

The fake processor runs in its own process with a latency; this process
claims N payments (in message-sized groups, before the clock starts) and
hands every group to a dispatcher built as tasks/runtime.py builds it
(its in-flight limit, pools, breaker, shared call window and per-attempt
log line at INFO), then waits until every group is done. Printed: this
process's CPU (user + system, the fake's apart) per payment and the rate.
Dramatiq and the sweeper are left out: this is the executor's own cost,
the part the two designs differ in. Rounds alternate the executors, each
on a fresh database, so load drifts hit both; the machine's load is
printed with each figure. ``--profile asyncio`` (or ``threads``) prints
cProfile's top functions of that executor's last round. ``asyncio`` runs
on the loop the workers run (uvloop's where installed, tasks/broker.py);
``asyncio-std`` on asyncio's own, to compare the two.

    python -m bench.executor_cpu [--payments 3000] [--latency-ms 300] [--rounds 2]
        [--executors threads,asyncio,asyncio-std] [--profile asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import logging
import os
import pstats
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import mkdtemp

from bench.harness import REDIS_URL, parse_args, private_database
from devtools.factories import bulk_insert
from devtools.fake_gateway import GatewayHandle
from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http
from paycron.config import Config
from paycron.domain.enums import Status
from paycron.engine.aio import AsyncExecutor
from paycron.engine.execution import Executor
from paycron.engine.inflight import AsyncDispatcher, AsyncInFlightLimit, Dispatcher, InFlightLimit
from paycron.limits.aio import AsyncCallLimiter, AsyncCircuitBreaker
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import CallLimiter
from paycron.processors.factory import build_async_charger, build_processor
from paycron.store.aio import async_redis, make_async_pool
from paycron.store.db import connect, make_pool, make_redis
from paycron.store.transitions import claim_due

#: High enough that the shared call window never binds.
UNCAPPED_RATE_LIMIT = 100_000


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def claimed_groups(config: Config, n: int) -> list:
    with connect(config) as conn:
        bulk_insert(conn, n)
        groups = []
        while claims := claim_due(
            conn, limit=config.group_size, lease_seconds=config.lease_seconds
        ):
            groups.append(claims)
    return groups


def settled(config: Config) -> dict:
    with connect(config) as conn:
        rows = conn.execute("SELECT status, count(*) AS n FROM payments GROUP BY status").fetchall()
    return {r["status"]: r["n"] for r in rows}


def run_threads(config: Config, groups: list, profiler: cProfile.Profile | None) -> float:
    """tasks/runtime.build_dispatcher's parts; returns the wall seconds."""
    client = make_redis(config)
    most = config.gateway_max_in_flight
    limit = InFlightLimit(
        rate=config.gateway_rate_limit, max_in_flight=most, floor=config.group_size
    )
    call_limiter = CallLimiter(client, config)
    pool = make_pool(config, max_size=config.db_pool_max, name="bench-threads")
    gateway = build_processor(config, max_connections=most, call_limiter=call_limiter)
    calls = ThreadPoolExecutor(max_workers=most, thread_name_prefix="gateway-call")
    executor = Executor(
        config=config,
        pool=pool,
        gateway=gateway,
        breaker=CircuitBreaker(client, config),
        call_limiter=call_limiter,
        calls=calls,
        on_latency=limit.observe,
    )
    group_pool = ThreadPoolExecutor(max_workers=most, thread_name_prefix="group")
    dispatcher = Dispatcher(executor=executor, limit=limit, groups=group_pool)
    pool.wait()
    started = time.monotonic()
    with profiler or contextlib.nullcontext():
        for claims in groups:
            dispatcher.submit(claims)
        group_pool.shutdown(wait=True)
    seconds = time.monotonic() - started
    calls.shutdown()
    gateway.close()
    pool.close()
    return seconds


def run_asyncio(
    config: Config, groups: list, profiler: cProfile.Profile | None, loop_factory=None
) -> float:
    """tasks/runtime.build_async_dispatcher's parts on one loop."""

    async def main() -> float:
        client = make_redis(config)
        aclient = async_redis(config)
        most = config.gateway_max_in_flight
        limit = AsyncInFlightLimit(
            rate=config.gateway_rate_limit, max_in_flight=most, floor=config.group_size
        )
        call_limiter = CallLimiter(client, config)
        blocking = Executor(
            config=config,
            pool=make_pool(config, max_size=2, name="bench-rare"),
            gateway=build_processor(config, max_connections=4, call_limiter=call_limiter),
            breaker=CircuitBreaker(client, config),
            call_limiter=call_limiter,
        )
        pool = await make_async_pool(config, max_size=config.db_pool_max, name="bench-async")
        charger = build_async_charger(config, max_connections=most)
        executor = AsyncExecutor(
            blocking=blocking,
            pool=pool,
            breaker=AsyncCircuitBreaker(aclient, blocking.breaker),
            call_limiter=AsyncCallLimiter(aclient, config),
            charger=charger,
            on_latency=limit.observe,
        )
        dispatcher = AsyncDispatcher(executor=executor, limit=limit)
        await pool.wait()
        started, queued = time.monotonic(), run_queue_seconds()
        with profiler or contextlib.nullcontext():
            for claims in groups:
                await dispatcher.submit(claims)
            while limit.admitted:  # every group ended: its outcomes written
                await asyncio.sleep(0.01)
        seconds = time.monotonic() - started
        queued = run_queue_seconds() - queued
        print(
            f"    the loop's thread waited {queued:.1f} s of {seconds:.1f} s for a CPU "
            "(runnable, not running: the machine's other load)"
        )
        if charger is not None:
            await charger.close()
        await pool.close()
        await aclient.aclose()
        blocking.pool.close()
        blocking.gateway.close()
        return seconds

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


def run_worker_loop(config: Config, groups: list, profiler: cProfile.Profile | None) -> float:
    """On the loop a worker runs: uvloop's where installed."""
    try:
        import uvloop
    except ImportError:
        return run_asyncio(config, groups, profiler)
    return run_asyncio(config, groups, profiler, loop_factory=uvloop.new_event_loop)


def run_queue_seconds() -> float:
    """How long this thread has waited on a run queue (Linux schedstat; 0 elsewhere)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


RUNNERS = {"threads": run_threads, "asyncio": run_worker_loop, "asyncio-std": run_asyncio}


def measure(executor: str, n: int, gateway_url: str, profile: bool) -> dict:
    with private_database() as url:
        config = Config(
            database_url=url,
            redis_url=REDIS_URL,
            redis_namespace=f"bench-executor-{os.getpid()}-{executor}",
            gateway_url=gateway_url,
            gateway_rate_limit=UNCAPPED_RATE_LIMIT,
            executor="asyncio" if executor == "asyncio-std" else executor,
        )
        groups = claimed_groups(config, n)
        profiler = cProfile.Profile(time.thread_time) if profile else None
        load = os.getloadavg()[0]
        cpu = cpu_seconds()
        seconds = RUNNERS[executor](config, groups, profiler)
        cpu = cpu_seconds() - cpu
        counts = settled(config)
    return {
        "cpu_ms": 1000 * cpu / n,
        "rate": n / seconds,
        "load": load,
        "completed": counts.get(Status.COMPLETED.value, 0),
        "profiler": profiler,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=3000)
    parser.add_argument("--latency-ms", type=int, default=300, help="0: an instant processor")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--executors", default="threads,asyncio")
    parser.add_argument("--profile", choices=tuple(RUNNERS), help="cProfile this executor")
    args = parse_args(parser, payments=40, latency_ms=20, rounds=1)
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    # The worker's attempt line per payment, formatted as a worker's logging does.
    logging.basicConfig(
        level=logging.INFO,
        stream=open(os.devnull, "w"),  # noqa: SIM115 (for the process's life)
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    port = free_port()
    procs = ProcessGroup(Path(mkdtemp(prefix="paycron-executor-cpu-")), {})
    results: dict[str, list[dict]] = {e: [] for e in executors}
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", procs.start("gateway", gateway_args(port)))
        handle = GatewayHandle(f"http://127.0.0.1:{port}")
        if args.latency_ms:
            handle.faults(latency_ms=args.latency_ms)
        print(
            f"{args.payments} payments per run, fake processor ~{args.latency_ms} ms, "
            f"{args.rounds} round(s) alternating {', '.join(executors)}; CPU of this "
            "process (the executor's), the fake's apart"
        )
        for i in range(args.rounds):
            order = executors if i % 2 == 0 else executors[::-1]
            for executor in order:
                profile = args.profile == executor and i == args.rounds - 1
                r = measure(executor, args.payments, handle.url, profile)
                results[executor].append(r)
                print(
                    f"  round {i + 1} {executor:<8}: {r['cpu_ms']:5.2f} ms CPU per payment, "
                    f"{r['rate']:6.0f} payments/s, completed {r['completed']}/{args.payments}; "
                    f"load {r['load']:.2f}"
                )
    finally:
        procs.stop()
    print("median:")
    for executor, rows in results.items():
        print(
            f"  {executor:<8}: {statistics.median(r['cpu_ms'] for r in rows):5.2f} ms CPU per "
            f"payment, {statistics.median(r['rate'] for r in rows):6.0f} payments/s"
        )
    for rows in results.values():
        profiler = rows[-1]["profiler"]
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(
                os.environ.get("PROFILE_SORT", "tottime")
            ).print_stats(int(os.environ.get("PROFILE_LINES", "30")))
            print(out.getvalue())


if __name__ == "__main__":
    main()
