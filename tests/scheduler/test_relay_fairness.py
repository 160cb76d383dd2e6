"""The relay's claim is fair across payers (docs/design.md): a payer with N
webhook endpoints does not get N shares of the relay."""

from __future__ import annotations

from paycron.store import webhooks
from tests.factories import insert_event
from tests.support import wait_until_sendable


def _endpoints(conn, actor: str, n: int) -> None:
    for i in range(n):
        webhooks.create_endpoint(conn, actor=actor, url=f"https://{actor}.example/{i}")


def _claim(conn, limit: int) -> list[str]:
    """The actors of the endpoints one claim leased."""
    leases = webhooks.claim_endpoints(conn, limit=limit, lease_seconds=30)
    actor_of = {
        r["id"]: r["actor"]
        for r in conn.execute("SELECT id, actor FROM webhook_endpoints").fetchall()
    }
    return sorted(actor_of[lease.endpoint_id] for lease in leases)


def _seed(conn) -> None:
    _endpoints(conn, "big", 4)  # older, so first in a claim ordered by time alone
    _endpoints(conn, "small", 1)
    insert_event(conn, payer="big")
    wait_until_sendable(conn, insert_event(conn, payer="small"))


def test_a_claim_takes_every_payers_first_endpoint_before_anyones_second(conn):
    _seed(conn)
    assert _claim(conn, limit=2) == ["big", "small"]
    assert _claim(conn, limit=10) == ["big"] * 3  # what is left, when no one else waits


def test_endpoints_a_payer_already_has_leased_count_against_its_share(conn):
    """The running relay claims one endpoint whenever a worker frees up:
    each claim goes to the payer with the fewest leases."""
    _seed(conn)
    assert [_claim(conn, limit=1) for _ in range(3)] == [["big"], ["small"], ["big"]]
