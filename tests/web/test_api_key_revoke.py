"""``paycron api-key revoke``: a prefix is 32 bits, so two keys may share
one (one pair in about 77,000 keys); a revocation never takes a key it was
not pointed at."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from paycron.cli import main
from paycron.store import apikeys


@pytest.fixture
def cli(config):
    env = {"DATABASE_URL": config.database_url}

    def run(*args):
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)

    return run


def two_keys_sharing_a_prefix(conn) -> tuple[dict, dict]:
    _, first = apikeys.create_api_key(conn, "erin")
    _, second = apikeys.create_api_key(conn, "frank")
    conn.execute("UPDATE api_keys SET prefix = %s WHERE id = %s", (first["prefix"], second["id"]))
    return first, second


def revoked(conn) -> dict[int, bool]:
    rows = conn.execute("SELECT id, revoked_at FROM api_keys").fetchall()
    return {r["id"]: r["revoked_at"] is not None for r in rows}


def test_an_ambiguous_prefix_revokes_nothing_and_names_the_ids(conn, cli):
    first, second = two_keys_sharing_a_prefix(conn)
    result = cli("api-key", "revoke", first["prefix"])
    assert result.exit_code == 1
    assert f"--id {first['id']}" in result.output and f"--id {second['id']}" in result.output
    assert revoked(conn) == {first["id"]: False, second["id"]: False}


def test_revoke_by_id_takes_that_key_only(conn, cli):
    first, second = two_keys_sharing_a_prefix(conn)
    result = cli("api-key", "revoke", "--id", str(second["id"]))
    assert result.exit_code == 0, result.output
    assert f"revoked {first['prefix']} (frank)" in result.output  # the shared prefix
    assert revoked(conn) == {first["id"]: False, second["id"]: True}


def test_a_prefix_still_revokes_its_only_active_key(conn, cli):
    first, second = two_keys_sharing_a_prefix(conn)
    assert cli("api-key", "revoke", "--id", str(first["id"])).exit_code == 0
    result = cli("api-key", "revoke", first["prefix"])  # one active key left with it
    assert result.exit_code == 0, result.output
    assert revoked(conn) == {first["id"]: True, second["id"]: True}


def test_list_shows_the_ids_revoke_takes(conn, cli):
    first, second = two_keys_sharing_a_prefix(conn)
    lines = cli("api-key", "list").output.splitlines()
    assert sorted(line.split("\t")[-1] for line in lines) == sorted(
        [f"id={first['id']}", f"id={second['id']}"]
    )


@pytest.mark.parametrize("args", [[], ["abcd1234", "--id", "1"]])
def test_revoke_takes_a_prefix_or_an_id(cli, args):
    result = cli("api-key", "revoke", *args)
    assert result.exit_code == 2 and "PREFIX or --id" in result.output
