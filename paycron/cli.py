"""The ``paycron`` console script. Every command reads the environment of
SPEC §1 (through :class:`Config`) and nothing else."""

from __future__ import annotations

import sys

import click

from paycron import apikeys, partitions
from paycron.config import Config
from paycron.db import connect
from paycron.errors import ConfigError
from paycron.migrate import migrate as apply_migrations


def _config() -> Config:
    try:
        return Config.from_env()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def main() -> None:
    """paycron: a scheduled-payments engine."""


@main.command()
def migrate() -> None:
    """Apply pending migrations, then ensure partitions for the horizon."""
    config = _config()
    with connect(config) as conn:
        applied = apply_migrations(conn)
        created = partitions.ensure_partitions(conn, config)
    click.echo(f"migrations applied: {len(applied)} {' '.join(applied)}".rstrip())
    click.echo(f"partitions created: {len(created)}")


@main.group("partitions")
def partitions_group() -> None:
    """Day partitions of the payments table."""


@partitions_group.command("ensure")
def partitions_ensure() -> None:
    """Create every missing day partition up to the horizon plus margin."""
    config = _config()
    with connect(config) as conn:
        created = partitions.ensure_partitions(conn, config)
        ahead = partitions.days_ahead(conn)
    click.echo(f"partitions created: {len(created)}; days ahead: {ahead}")


@main.group("api-key")
def api_key() -> None:
    """API keys (only their hashes are stored)."""


@api_key.command("create")
@click.option("--actor", required=True, help="Who the key acts as (the payer).")
@click.option("--admin", is_flag=True, help="Also grant the admin scope.")
def api_key_create(actor: str, admin: bool) -> None:
    """Create a key; it is printed once, alone on the last line."""
    with connect(_config()) as conn:
        key, row = apikeys.create_api_key(conn, actor, admin=admin)
    click.echo(f"# actor={row['actor']} prefix={row['prefix']} scopes={','.join(row['scopes'])}",
               err=False)
    click.echo(key)


@api_key.command("list")
def api_key_list() -> None:
    with connect(_config()) as conn:
        for row in apikeys.list_api_keys(conn):
            state = "revoked" if row["revoked_at"] else "active"
            click.echo(f"{row['prefix']}\t{row['actor']}\t{','.join(row['scopes'])}\t{state}")


@api_key.command("revoke")
@click.argument("prefix")
def api_key_revoke(prefix: str) -> None:
    with connect(_config()) as conn:
        row = apikeys.revoke_api_key(conn, prefix)
    if row is None:
        click.echo(f"no active key with prefix {prefix}", err=True)
        sys.exit(1)
    click.echo(f"revoked {row['prefix']} ({row['actor']})")


if __name__ == "__main__":
    main()
