"""Reading rows back: what the tests assert on after the unit of work ran."""

from __future__ import annotations


def payment(conn, payment_id) -> dict | None:
    return conn.execute("SELECT * FROM payments WHERE id = %s", (payment_id,)).fetchone()


def attempts_of(conn, payment_id) -> list[dict]:
    return conn.execute(
        "SELECT * FROM attempts WHERE payment_id = %s ORDER BY attempt", (payment_id,)
    ).fetchall()


def event_types(conn, payment_id) -> list[str]:
    return [
        r["type"]
        for r in conn.execute(
            "SELECT type FROM payment_events WHERE payment_id = %s ORDER BY id", (payment_id,)
        )
    ]


def letter(conn, payment_id) -> dict | None:
    """The payment's latest dead letter."""
    return conn.execute(
        "SELECT * FROM dead_letters WHERE payment_id = %s ORDER BY id DESC", (payment_id,)
    ).fetchone()


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]
