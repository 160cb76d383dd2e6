"""The ``paycron`` console script. Every command reads its settings from the
environment through :class:`Config` (docs/configuration.md) and nothing else.

A person's mistake gets one line, never a traceback: an unset or wrong
setting, or a server a setting names that does not answer, prints
``paycron: <SETTING> ...: <why>`` and exits with status 2."""

from __future__ import annotations

import getpass
import importlib.metadata
import json
import sys
import uuid

import click
import psycopg
import redis

from paycron.config import Config
from paycron.domain.ids import parse_payment_id
from paycron.engine import dead_letters
from paycron.errors import ConfigError, GatewayError, PaycronError
from paycron.limits.pacing import CallLimiter
from paycron.observability.audit import configure_audit_log
from paycron.observability.audit import record as audit
from paycron.observability.sentry import init_sentry
from paycron.observability.startup import EXIT_CONFIG, report
from paycron.processors.factory import build_processor
from paycron.store import apikeys, customers, partitions
from paycron.store.db import connect, first_line, make_redis
from paycron.store.migrate import migrate as apply_migrations


def _config() -> Config:
    return Config.from_env()  # a ConfigError is reported by PaycronCLI.invoke


class PaycronCLI(click.Group):
    """The domain's commands plus those the parts register under the
    ``paycron.commands`` entry point (e.g. ``reconcile`` from
    ``reconciliation/``), so this package never imports a part."""

    def _plugins(self) -> dict:
        found = importlib.metadata.entry_points(group="paycron.commands")
        return {ep.name: ep for ep in found}

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            report(f"paycron: {exc}")
        except psycopg.OperationalError as exc:  # the server went away mid-command
            report(f"paycron: DATABASE_URL: {first_line(exc)}")
        except redis.ConnectionError as exc:
            report(f"paycron: REDIS_URL: {first_line(exc)}")
        ctx.exit(EXIT_CONFIG)

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._plugins()))

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None and name in self._plugins():
            command = self._plugins()[name].load()
        return command


@click.group(cls=PaycronCLI)
def main() -> None:
    """paycron: a scheduled-payments engine."""
    # The CLI's composition root is each command's own few lines (config,
    # one connection, the gateway where it asks one); Sentry is shared here.
    try:
        init_sentry(Config.from_env(), component="cli")
    except ConfigError:
        pass  # the command itself reports the bad setting


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
    _audit_cli(
        "api_key.create",
        "success",
        target=f"key {row['id']} of {actor}",
        reason=",".join(row["scopes"]),
    )
    click.echo(
        f"# actor={_printable(row['actor'])} prefix={row['prefix']} "
        f"scopes={','.join(row['scopes'])}",
        err=False,
    )
    click.echo(key)


@api_key.command("list")
def api_key_list() -> None:
    with connect(_config()) as conn:
        for row in apikeys.list_api_keys(conn):
            state = "revoked" if row["revoked_at"] else "active"
            click.echo(
                f"{row['prefix']}\t{_printable(row['actor'])}\t{','.join(row['scopes'])}"
                f"\t{state}\tid={row['id']}"
            )


@api_key.command("revoke")
@click.argument("prefix", required=False)
@click.option(
    "--id",
    "key_id",
    type=int,
    help="The key's id (api-key list), when a prefix is shared by several keys.",
)
def api_key_revoke(prefix: str | None, key_id: int | None) -> None:
    """Revoke the key with PREFIX, or the one with --id."""
    if (prefix is None) == (key_id is None):
        raise click.UsageError("give PREFIX or --id, not both")
    config = _config()
    with connect(config) as conn:
        if key_id is not None:
            revocation = apikeys.revoke_api_key_by_id(conn, key_id)
            what = f"id {key_id}"
        else:
            assert prefix is not None  # exactly one of the two was given
            revocation = apikeys.revoke_api_key(conn, prefix)
            what = f"prefix {_printable(prefix)}"
    row = revocation.revoked
    _audit_cli(
        "api_key.revoke",
        "success" if row is not None else "failure",
        target=f"key {row['id']} of {row['actor']}" if row else f"prefix {prefix} id {key_id}",
    )
    if revocation.ambiguous:
        click.echo(
            f"{len(revocation.ambiguous)} active keys share {what}; nothing revoked. "
            "Revoke one by its id:",
            err=True,
        )
        for shared in revocation.ambiguous:
            click.echo(
                f"  paycron api-key revoke --id {shared['id']}"
                f"  # actor {_printable(shared['actor'])}",
                err=True,
            )
        sys.exit(1)
    if row is None:
        click.echo(f"no active key with {what}", err=True)
        sys.exit(1)
    click.echo(
        f"revoked {row['prefix']} ({_printable(row['actor'])}); web processes that "
        f"checked it recently accept it for up to their API_KEY_CACHE_SECONDS more "
        f"({config.api_key_cache_seconds:g} s in this environment)"
    )


_by_option = click.option(
    "--by",
    default=getpass.getuser,
    show_default="your login",
    help="The operator, recorded with the binding and in the audit log.",
)


@main.group("customer")
def customer_group() -> None:
    """Which processor customers each payer (an API key's actor) may charge
    (docs/customers.md), at the processor GATEWAY names (set it as the web's
    is: a binding at one processor says nothing at another)."""


@customer_group.command("register")
@click.argument("customer")
@click.option("--actor", required=True, help="The payer that may charge the customer.")
@_by_option
def customer_register(customer: str, actor: str, by: str) -> None:
    """Let ACTOR charge CUSTOMER (e.g. cus_...); idempotent for the same actor."""
    _check_token(customer)
    config = _config()
    target = f"customer of {actor}"
    with connect(config) as conn:
        try:
            done = customers.register(
                conn, processor=config.gateway, customer=customer, actor=actor, by=by
            )
        except PaycronError as exc:
            _audit_cli("customer.register", "refused", actor=by, target=target, reason=str(exc))
            raise click.ClickException(f"{exc.code}: {exc}") from None
    reason = "registered" if done.created else "already bound to this payer"
    _audit_cli("customer.register", "success", actor=by, target=target, reason=reason)
    click.echo(f"{_printable(customer)} -> {_printable(actor)} at {config.gateway}: {reason}")


@customer_group.command("remove")
@click.argument("customer")
@_by_option
def customer_remove(customer: str, by: str) -> None:
    """End CUSTOMER's binding: no payer may name it until it is registered
    again. Payments already scheduled naming it are not touched."""
    _check_token(customer)
    config = _config()
    with connect(config) as conn:
        removed = customers.remove(conn, processor=config.gateway, customer=customer)
    if removed is None:
        _audit_cli("customer.remove", "refused", actor=by, target="customer", reason="not bound")
        click.echo(f"{_printable(customer)} is bound to no payer", err=True)
        sys.exit(1)
    _audit_cli("customer.remove", "success", actor=by, target=f"customer of {removed['actor']}")
    click.echo(
        f"{_printable(customer)} at {config.gateway} no longer bound to "
        f"{_printable(removed['actor'])}"
    )


@customer_group.command("list")
@click.option("--actor", default=None, help="Only this payer's customers.")
def customer_list(actor: str | None) -> None:
    """One line per binding: customer, payer, who registered it (- when a
    payer's first create bound it), since when."""
    config = _config()
    after = 0
    with connect(config) as conn:
        while True:
            rows, next_id = customers.list_bindings(
                conn, processor=config.gateway, actor=actor, limit=1000, after=after
            )
            for row in rows:
                click.echo(
                    f"{_printable(row['customer'])}\t{_printable(row['actor'])}"
                    f"\t{_printable(row['registered_by'] or '-')}"
                    f"\t{row['created_at']:%Y-%m-%dT%H:%M:%SZ}"
                )
            if next_id is None:
                break
            after = next_id


def _check_token(customer: str) -> None:
    """A customer as the API takes one: 1-255 printable ASCII characters."""
    if not 1 <= len(customer) <= 255 or not all(" " <= c <= "~" for c in customer):
        raise click.BadParameter("a customer is 1-255 printable ASCII characters")


def _payment_id(text: str) -> uuid.UUID:
    payment_id = parse_payment_id(text)
    if payment_id is None:
        raise click.BadParameter(f"not a payment id: {text}")
    return payment_id


def _printable(text: str) -> str:
    """``text`` on one line of a terminal: stored text (a gateway's error,
    an operator's note) must not start a line of its own, move the cursor or
    reorder what follows. Control and other non-printing characters, tab
    (the column separator) and backslash print as Python escapes."""
    return "".join(
        c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


@main.group()
def dlq() -> None:
    """Parked payments: list, show, redrive, refund, dismiss."""


@dlq.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines.")
@click.option("--limit", default=100, show_default=True)
def dlq_list(as_json: bool, limit: int) -> None:
    """One line per open dead letter, beginning with the full payment id."""
    with connect(_config()) as conn:
        rows = dead_letters.list_open(conn, limit=limit)
    if as_json:
        click.echo(
            json.dumps(_as_the_api_says({"data": rows}, "DeadLetterPageSchema")["data"], indent=2)
        )
        return
    for row in rows:
        click.echo(
            f"{row['payment_id']}\t{row['reason']}\t{_printable(row['last_error'] or '-')}"
            f"\tparked {row['created_at']:%Y-%m-%dT%H:%M:%SZ}"
        )


@dlq.command("show")
@click.argument("payment_id")
def dlq_show(payment_id: str) -> None:
    """The payment, its attempts and its dead letters, as JSON."""
    with connect(_config()) as conn:
        try:
            found = dead_letters.show(conn, _payment_id(payment_id))
        except PaycronError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(_as_the_api_says(found, "DeadLetterDetailSchema"), indent=2))


def _as_the_api_says(found: dict, schema: str) -> dict:
    """``found`` in the shape ``/v1/admin/dead-letters`` answers (camelCase,
    amounts as ``amount``), dumped by the API's own schema so the two never
    differ. Looked up at run time, as the plugin commands are: the API is a
    part this package never imports."""
    admin = importlib.import_module("web.admin")
    return getattr(admin, schema)().dump(found)


def _audit_cli(event: str, outcome: str, **fields) -> None:
    """An audit line for a command run from a shell: the login is the actor."""
    configure_audit_log()
    fields.setdefault("actor", getpass.getuser())
    audit(event, outcome, channel="cli", **fields)


def _dlq_action(action, payment_id: str, *, event: str, **kwargs) -> None:
    config = _config()
    gateway = build_processor(
        config,
        max_connections=1,
        call_limiter=CallLimiter(make_redis(config, timeout=2), config)
        if config.redis_url
        else None,
    )
    with connect(config) as conn:
        target = _payment_id(payment_id)
        fields = {"actor": kwargs["actor"], "target": target}
        try:
            result = action(conn, gateway, target, **kwargs)
        except PaycronError as exc:
            outcome = "failure" if isinstance(exc, GatewayError) else "refused"
            _audit_cli(event, outcome, reason=str(exc), **fields)
            raise click.ClickException(f"{exc.code}: {_printable(str(exc))}") from None
        except Exception as exc:
            _audit_cli(event, "failure", reason=type(exc).__name__, **fields)
            raise
        finally:
            gateway.close()
        _audit_cli(event, "success", reason=kwargs.get("note"), **fields)
    # the detail quotes the gateway's ids and the operator's note
    click.echo(f"{result.payment_id} {result.action}: {_printable(result.detail)}")


_by = click.option(
    "--by",
    default=getpass.getuser,
    show_default="your login",
    help="The operator, recorded with the action.",
)


@dlq.command("redrive")
@click.argument("payment_id")
@_by
def dlq_redrive(payment_id: str, by: str) -> None:
    """Look the charge up; complete if found, else PENDING with a fresh budget."""
    _dlq_action(dead_letters.redrive, payment_id, event="dead_letter.redrive", actor=by)


@dlq.command("refund")
@click.argument("payment_id")
@_by
def dlq_refund(payment_id: str, by: str) -> None:
    """Refund the payment's charge at its processor (keyed refund:<payment id> at the
    fake, refund:<intent id> at Stripe)."""
    _dlq_action(dead_letters.refund, payment_id, event="dead_letter.refund", actor=by)


@dlq.command("dismiss")
@click.argument("payment_id")
@_by
@click.option("--note", default=None, help="Why.")
def dlq_dismiss(payment_id: str, by: str, note: str | None) -> None:
    """Close the dead letter without touching the gateway."""
    _dlq_action(
        lambda conn, _gw, pid, **kw: dead_letters.dismiss(conn, pid, **kw),
        payment_id,
        event="dead_letter.dismiss",
        actor=by,
        note=note,
    )


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--window-minutes",
    default=60,
    show_default=True,
    help="Window for lateness and lease expiries.",
)
def stats(as_json: bool, window_minutes: int) -> None:
    """Health numbers: backlog, oldest-due PENDING age, lateness, DLQ, partitions."""
    from datetime import timedelta

    from paycron.store import stats as health_stats

    config = _config()
    with connect(config) as conn:
        figures = health_stats.health(
            conn, window=timedelta(minutes=window_minutes), processor=config.gateway
        )
        figures["partitions_ahead_days"] = partitions.days_ahead(conn)
    if as_json:
        click.echo(json.dumps(_jsonable(figures), indent=2))
        return
    late = figures.pop("lateness")
    for name, value in figures.items():
        click.echo(f"{name:24} {value if value is not None else '-'}")
    for name in ("p50", "p99", "max"):
        value = late[name]
        click.echo(f"{'lateness_' + name + '_s':24} {'-' if value is None else f'{value:.3f}'}")


if __name__ == "__main__":
    main()
