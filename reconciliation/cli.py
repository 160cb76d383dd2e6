"""``paycron reconcile`` (registered through the ``paycron.commands`` entry point).

Exit codes: 0 the day is clean (repairs and deferrals are routine), 1 a
mismatch paged, 2 the run could not be made (bad date, unreadable report,
gateway unreachable): nothing was compared.
"""

from __future__ import annotations

import re
import sys
from datetime import date

import click

from paycron.config import Config
from paycron.errors import ConfigError
from paycron.limits.pacing import CallLimiter
from paycron.observability.sentry import configure_logging, init_sentry
from paycron.processors.factory import build_processor
from paycron.store.db import connect, make_redis
from reconciliation.errors import ReconciliationError
from reconciliation.report import fetch_window, read_file
from reconciliation.run import RunResult, reconcile_day

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class CouldNotReconcile(click.ClickException):
    exit_code = 2


def summary(result: RunResult) -> str:
    run = result.run
    lines = [f"reconciliation {run['day']} run {run['id']} (source: {run['source']})"]
    lines += [f"{name:26} {value}" for name, value in result.counts().items()]
    for item in result.mismatches:
        lines.append(
            f"MISMATCH {item.kind.value} payment={item.payment_id or '-'} "
            f"charge={item.charge_id or '-'}"
        )
    return "\n".join(lines)


@click.command()
@click.option("--date", "day", required=True, help="The UTC day to reconcile, YYYY-MM-DD.")
@click.option(
    "--report",
    "report_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A settlement report CSV; fetched from the gateway if omitted.",
)
def reconcile(day: str, report_file: str | None) -> None:
    """Diff the gateway's settlement report for DAY against our attempts, both ways."""
    try:
        if not _DAY.fullmatch(day):
            raise ValueError(day)
        the_day = date.fromisoformat(day)
    except ValueError:
        raise click.BadParameter(f"not a YYYY-MM-DD date: {day!r}", param_hint="--date") from None
    gateway = None
    try:
        config = Config.from_env()
        configure_logging()
        init_sentry(config, component="reconciliation")
        if report_file is not None:
            charges, source = read_file(report_file), "file"
        else:
            gateway = build_processor(
                config,
                max_connections=4,
                call_limiter=CallLimiter(make_redis(config, timeout=2), config)
                if config.redis_url
                else None,
            )
            charges, source = fetch_window(gateway, the_day), "gateway"
        with connect(config) as conn:
            result = reconcile_day(conn, the_day, charges, source=source, gateway=gateway)
    except (ReconciliationError, ConfigError) as exc:
        raise CouldNotReconcile(str(exc)) from None
    finally:
        if gateway is not None:
            gateway.close()
    click.echo(summary(result))
    sys.exit(result.exit_code)
