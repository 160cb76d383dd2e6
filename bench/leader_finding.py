"""Finding the leader after a failover: libpq's multi-host scan or Patroni's
REST API, side by side on the same cluster and the same faults.

    python -m bench.leader_finding                      # the three faults, tuned timing
    python -m bench.leader_finding --faults partition   # one
    python -m bench.leader_finding --smoke              # the cluster, no fault (CI)

Two finders ask "which member takes writes?" every ``--every`` seconds, each
in its own thread, from a few seconds before each fault until well after it:

- **libpq**: what the engine does today: one connection to the multi-host
  ``DATABASE_URL`` with ``target_session_attrs=read-write`` and
  ``connect_timeout=2``; the member it lands on is its answer.
- **rest**: ``GET /primary`` on each member's Patroni agent (1 s timeout),
  in the URL's order; the first to answer 200 is the answer, then a
  connection to that member alone (so both pay for a connection).

The truth is Patroni's: the member its REST API calls leader and that
accepts writes. For each finder and fault the report gives how long after
the new leader took writes the finder first named it, how many answers
after that named another member (a deposed or unmanaged primary: a write
there waits or is lost) or none, and the cost of one lookup while nothing
fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import psycopg

from bench.harness import parse_args
from bench.patroni import TUNED, Member, PatroniCluster

FAULTS = ("postmaster", "agent", "partition")


@dataclass
class Answer:
    at: float  # monotonic, when the lookup began
    took: float  # seconds
    port: int | None  # the member's PostgreSQL port, or None (no answer)


@dataclass
class Finder:
    name: str
    answers: list[Answer] = field(default_factory=list)


def libpq_lookup(cluster: PatroniCluster) -> int | None:
    try:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            return conn.info.port
    except psycopg.OperationalError:
        return None


def rest_lookup(cluster: PatroniCluster) -> int | None:
    for member in cluster.members:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{member.api_port}/primary", timeout=1
            ) as answer:
                if answer.status != 200:
                    continue
        except OSError:  # URLError, HTTPError (503: not the primary), timeouts
            continue
        try:
            with psycopg.connect(member.url, connect_timeout=2, autocommit=True) as conn:
                return conn.info.port
        except psycopg.OperationalError:
            return None
    return None


LOOKUPS = {"libpq": libpq_lookup, "rest": rest_lookup}


def sample(cluster: PatroniCluster, finder: Finder, every: float, stop: threading.Event) -> None:
    lookup = LOOKUPS[finder.name]
    while not stop.is_set():
        began = time.monotonic()
        port = lookup(cluster)
        finder.answers.append(Answer(began, time.monotonic() - began, port))
        stop.wait(max(0.0, every - (time.monotonic() - began)))


def deal(fault: str, old: Member) -> None:
    if fault == "postmaster":
        old.kill_postmaster()
    elif fault == "agent":
        old.kill_agent()
    else:
        old.partition()


def mend(fault: str, old: Member) -> None:
    if fault == "agent":
        old.start_agent()
    elif fault == "partition":
        old.heal()


def run_fault(cluster: PatroniCluster, fault: str, every: float, after: float) -> dict:
    cluster.wait_synchronous()
    old = cluster.leader()
    finders = [Finder(name) for name in LOOKUPS]
    stop = threading.Event()
    threads = [
        threading.Thread(target=sample, args=(cluster, f, every, stop), daemon=True)
        for f in finders
    ]
    for thread in threads:
        thread.start()
    time.sleep(3)  # steady state first: the cost of one lookup while nothing fails
    dealt = time.monotonic()
    deal(fault, old)
    # A postmaster kill may be mended in place (Patroni restarts it): the
    # same member may lead again.
    new = cluster.wait_leader(timeout=120, not_=None if fault == "postmaster" else old)
    if fault == "postmaster":
        while not new.accepts_writes():
            time.sleep(0.05)
    leads = time.monotonic()
    time.sleep(after)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    mend(fault, old)
    rows = {}
    for finder in finders:
        steady = [a.took for a in finder.answers if a.at < dealt]
        later = [a for a in finder.answers if a.at >= leads]
        first = next((a for a in later if a.port == new.port), None)
        wrong = [a for a in later if a.port != new.port]
        during = [a for a in finder.answers if dealt <= a.at < leads]
        rows[finder.name] = {
            "steady_ms": 1000 * statistics.median(steady) if steady else float("nan"),
            "found_after_s": (first.at + first.took - leads) if first else float("inf"),
            "wrong_after": sum(1 for a in wrong if a.port is not None),
            "none_after": sum(1 for a in wrong if a.port is None),
            "answers_after": len(later),
            "old_during": sum(1 for a in during if a.port == old.port),
            "answers_during": len(during),
            "longest_s": max((a.took for a in finder.answers if a.at >= dealt), default=0.0),
        }
    print(
        f"{fault}: {old.name} -> {new.name}, new leader took writes "
        f"{leads - dealt:.1f} s after the fault"
    )
    for name, row in rows.items():
        print(
            f"  {name:5}  one lookup {row['steady_ms']:6.1f} ms (steady median) | "
            f"named the new leader {row['found_after_s']:5.2f} s after it took writes | "
            f"after that: {row['wrong_after']} of {row['answers_after']} answers named "
            f"another member, {row['none_after']} none | before it: "
            f"{row['old_during']} of {row['answers_during']} named the old leader | "
            f"slowest lookup {row['longest_s']:.1f} s"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between lookups")
    parser.add_argument("--after", type=float, default=20.0, help="seconds sampled after")
    parser.add_argument("--members", type=int, default=2)
    args = parse_args(parser, faults="")
    faults = [f for f in args.faults.split(",") if f]
    for fault in faults:
        if fault not in FAULTS:
            parser.error(f"--faults: {fault!r} is not one of {', '.join(FAULTS)}")
    cluster = PatroniCluster(members=args.members, timing=TUNED)
    try:
        started = time.monotonic()
        cluster.start()
        print(f"Patroni cluster ({TUNED.name}) up in {time.monotonic() - started:.0f} s")
        if not faults:  # smoke: both finders against a healthy cluster
            leader = cluster.leader()
            for name, lookup in LOOKUPS.items():
                took = time.monotonic()
                port = lookup(cluster)
                print(
                    f"  {name:5}  found {'the leader' if port == leader.port else port} "
                    f"in {1000 * (time.monotonic() - took):.1f} ms"
                )
        results = {}
        for fault in faults:
            results[fault] = run_fault(cluster, fault, args.every, args.after)
            # The deposed member rejoins as a standby before the next fault.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(
                m.role() in ("master", "primary", "replica", "sync_standby")
                for m in cluster.members
            ):
                time.sleep(0.5)
        if results:
            print(json.dumps(results, indent=1, default=str))
    finally:
        with contextlib.suppress(Exception):
            cluster.destroy()


if __name__ == "__main__":
    main()
