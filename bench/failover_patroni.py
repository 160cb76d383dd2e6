"""Failover under Patroni with etcd: the fault is dealt, Patroni decides.

``python -m bench.failover --patroni`` runs :class:`PatroniFailover`: the
same system, load and checks as :mod:`bench.failover`, on a
:class:`bench.patroni.PatroniCluster` (three etcd members, two PostgreSQL
members, ``synchronous_mode: true``) through the multi-host
``DATABASE_URL``. One of three faults hits the leader during the due spike
and the create load:

- ``postmaster``: its postmaster and backends SIGKILLed; its agent lives
  (Patroni restarts PostgreSQL in place, or fails over if it cannot);
- ``agent``: its Patroni agent SIGKILLed; PostgreSQL runs on unmanaged
  until the agent is started again ``--agent-down`` seconds later, as a
  supervisor would (no watchdog here);
- ``partition``: its agent cut off from every etcd member (a relay per
  member, on loopback), healed ``--heal-after`` seconds after the new
  leader took over.

Nothing here promotes or rewinds a server: Patroni does. Besides the
checks of :mod:`bench.failover` it samples, every 100 ms from the fault on,
how many members accept writes at once, and reports the longest such
overlap (with synchronous replication a commit on the deposed leader waits
for a standby that no longer follows it, so an overlap must not reach
money: the money checks say whether it did).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from datetime import UTC, datetime, timedelta

from bench.failover import QUERIES, Failover, _hms
from bench.patroni import PatroniCluster, Timing
from paycron.config import Config
from paycron.store.db import connect

FAULTS = ("postmaster", "agent", "partition")


class PatroniFailover(Failover):
    def __init__(self, plan, fault: str, seed: int, *, timing: Timing, strict: bool = False,
                 members: int = 2, agent_down: float | None = None,
                 heal_after: float = 10.0):  # fmt: skip
        self.fault, self.timing, self.strict, self.members = fault, timing, strict, members
        self.agent_down = (
            agent_down if agent_down is not None else timing.ttl + 2 * timing.loop_wait
        )
        self.heal_after = heal_after
        self.overlap = 0.0
        self.sampling = threading.Event()
        super().__init__(plan, "sync", seed)
        # Patroni's own clocks bound the pause: the leader key's lease runs
        # out (ttl), the next loop notices (loop_wait), the promotion and
        # the engine's reconnect follow (15 s, bench.failover's own bound).
        self.pause_target = timing.ttl + timing.loop_wait + 15.0
        if fault == "agent":
            self.pause_target += self.agent_down

    def _make_servers(self):
        return PatroniCluster(members=self.members, timing=self.timing, strict=self.strict)

    @property
    def url(self) -> str:
        return self.pair.url

    def start(self) -> None:
        started = time.monotonic()
        super().start()
        print(
            f"Patroni cluster ({self.timing.name}, synchronous_mode"
            f"{'_strict' if self.strict else ''}) up in {time.monotonic() - started:.0f} s; "
            f"leader {self.pair.leader().name}, synchronous standby "
            f"{self.pair.synchronous_standby()}"
        )

    def stop(self) -> None:
        self.sampling.set()
        if self.system is not None:  # Patroni's own account of the run, beside the others'
            for member in self.pair.members:
                with contextlib.suppress(OSError):
                    shutil.copy(
                        member.dir / "patroni.log", self.system.logdir / f"{member.name}.log"
                    )
        super().stop()

    def _fail_over(self) -> None:
        cluster = self.pair
        old = cluster.leader()
        self.marks["kill"] = datetime.now(UTC)
        if self.fault == "postmaster":
            old.kill_postmaster()
            what = f"{old.name}'s postmaster SIGKILLed (its agent lives)"
        elif self.fault == "agent":
            old.kill_agent()
            what = f"{old.name}'s Patroni agent SIGKILLed (its PostgreSQL runs on)"
        else:
            old.partition()
            what = f"{old.name} partitioned from every etcd member"
        self.marks["dead"] = datetime.now(UTC)
        print(f"  {_hms(self.marks['kill'])} {what}")
        sampler = threading.Thread(target=self._sample_writers, daemon=True)
        sampler.start()
        if self.fault == "agent":
            # Started again later, as a supervisor would; meanwhile Patroni decides.
            def restart() -> None:
                old.start_agent()
                print(f"  {_hms(datetime.now(UTC))} {old.name}'s agent started again")

            threading.Timer(self.agent_down, restart).start()
        if self.fault == "postmaster":
            # Patroni may restart PostgreSQL in place: the same member may lead again.
            new = cluster.wait_leader(timeout=self.pause_target * 3)
        else:
            # The deposed leader still answers as one until Patroni demotes it.
            new = cluster.wait_leader(timeout=self.pause_target * 3, not_=old)
        self.marks["promote"] = datetime.now(UTC)
        print(
            f"  {_hms(self.marks['promote'])} leader: {new.name} "
            f"({(self.marks['promote'] - self.marks['kill']).total_seconds():.1f} s after the "
            "fault)"
        )
        if self.fault == "partition":
            time.sleep(self.heal_after)
            old.heal()
            print(f"  {_hms(datetime.now(UTC))} {old.name} reaches etcd again")

    def _sample_writers(self) -> None:
        """The longest stretch during which two members accepted writes."""
        since: float | None = None
        while not self.sampling.is_set():
            writers = sum(member.accepts_writes() for member in self.pair.members)
            now = time.monotonic()
            if writers > 1:
                since = since if since is not None else now
                self.overlap = max(self.overlap, now - since)
            else:
                since = None
            time.sleep(0.1)

    def _pauses(self, around: dict) -> dict[str, float]:
        """The longest stretch without claims, calls and created payments in
        the minute after the fault: with a deposed leader that runs on for a
        few seconds (its synchronous standby still following it), "the
        first claim after the fault" would hide the pause that follows."""
        super()._pauses(around)  # prints the first claim, call and create after the fault
        since = self.marks["kill"]
        until = min(since + timedelta(seconds=60), self.marks["load_end"])
        with connect(Config(database_url=self.url)) as conn:
            gaps = conn.execute(
                QUERIES["failover_longest_gaps"], {"since": since, "until": until}
            ).fetchone()
        created = sorted(
            t.answered
            for c in self.clients.creates
            for t in c.tries
            if t.status == 201 and since <= t.answered <= until
        )
        create_gap = max(
            (b - a).total_seconds() for a, b in zip([since, *created], created, strict=False)
        ) if created else float("inf")  # fmt: skip
        figures = {
            "longest pause of claims after the fault": float(gaps["claims_gap"] or "inf"),
            "longest pause of gateway calls after the fault": float(gaps["calls_gap"] or "inf"),
            "longest pause of creates after the fault": create_gap,
        }
        for name, seconds in figures.items():
            print(f"{name}: {seconds:.1f} s")
        return figures

    def _fault_checks(self) -> list[tuple[str, object, bool]]:
        self.sampling.set()
        leaders = [m.name for m in self.pair.members if m.accepts_writes()]
        return [
            ("members accepting writes at the end (exactly 1)", ",".join(leaders),
             len(leaders) == 1),
            # Shown, not a check: the money checks say whether it mattered.
            ("longest overlap of two writable members (s, shown)", f"{self.overlap:.1f}", True),
        ]  # fmt: skip
