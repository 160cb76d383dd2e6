"""Day partitions of ``payments``: created ahead for the whole horizon.

``ensure_partitions`` is idempotent: it creates only the missing days, so
``paycron migrate``, ``paycron partitions ensure`` and the scheduler's
partition keeper can all call it at any time.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta

from psycopg import sql
from psycopg.errors import LockNotAvailable

from paycron.config import Config
from paycron.sql import q
from paycron.store.db import Connection, one_row
from paycron.store.migrate import schema_lock

_NAME = re.compile(r"^payments_p(\d{8})$")


def partition_name(day: date) -> str:
    return f"payments_p{day:%Y%m%d}"


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def existing_days(conn: Connection) -> list[date]:
    days = []
    for row in conn.execute(q("payment_partitions")):
        match = _NAME.match(row["name"])
        if match:
            days.append(datetime.strptime(match.group(1), "%Y%m%d").date())
    return sorted(days)


def wanted_days(config: Config, today: date) -> list[date]:
    """Yesterday (a payment due just before midnight) through horizon + margin."""
    last = today + timedelta(days=config.horizon_days + config.partition_margin_days)
    return [today + timedelta(days=n) for n in range(-1, (last - today).days + 1)]


def ensure_partitions(conn: Connection, config: Config, today: date | None = None) -> list[str]:
    """Create every missing day partition; returns the names created."""
    today = today or datetime.now(UTC).date()
    created = []
    with schema_lock(conn):
        have = set(existing_days(conn))
        for day in wanted_days(config, today):
            if day in have:
                continue
            conn.execute(_formatted("create_partition", day))
            created.append(partition_name(day))
    return created


def _formatted(name: str, day: date) -> sql.Composed:
    return sql.SQL(q(name)).format(
        name=sql.Identifier(partition_name(day)),
        start=sql.Literal(day_start(day)),
        end=sql.Literal(day_start(day + timedelta(days=1))),
    )


def detach_settled(conn: Connection, config: Config, today: date | None = None) -> list[str]:
    """Detach day partitions older than the retention whose every row is
    terminal and which hold no open dead letter. Each is locked against
    writes (a re-drive, a late worker) before it is checked, with a short
    lock timeout so the sweep and the API never stall behind it. The
    detached table stays for archiving, with its attempts and events; the
    idempotency keys of detached days are forgotten, so a key can be used
    again once its payment's day is past the retention."""
    today = today or datetime.now(UTC).date()
    cutoff = today - timedelta(days=config.partition_retention_days)
    detached = []
    for day in existing_days(conn):
        if day >= cutoff:
            break
        try:
            with conn.transaction():
                conn.execute(q("set_lock_timeout"))
                conn.execute(_formatted("lock_partition", day))
                if one_row(conn.execute(_formatted("partition_has_live_rows", day)))["live"]:
                    continue
                conn.execute(_formatted("detach_partition", day))
            detached.append(partition_name(day))
        except LockNotAvailable:
            continue  # busy: try again at the next upkeep
    if detached:
        # Outside the detaches' transactions: their lock on payments must
        # not be held through a scan of the idempotency table.
        conn.execute(
            q("forget_detached_idempotency_keys"),
            {
                "cutoff": day_start(cutoff),
                "attached_days": [d for d in existing_days(conn) if d < cutoff],
            },
        )
    return detached


def days_ahead(conn: Connection, today: date | None = None) -> int:
    """How many whole days past today are covered without a gap."""
    today = today or datetime.now(UTC).date()
    have = set(existing_days(conn))
    ahead = 0
    while today + timedelta(days=ahead + 1) in have:
        ahead += 1
    return ahead
