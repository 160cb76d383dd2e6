"""``paycron demo``, added to the console script through the
``paycron.commands`` entry point so that ``paycron/`` never imports this
package. The demo's modules (httpx, rich: the ``demo`` extra) are imported
only when it runs, so ``paycron --help`` works without them."""

from __future__ import annotations

import sys

import click

from paycron.config import Config
from paycron.errors import ConfigError


@click.command()
@click.option("--count", default=300, show_default=True, help="Payments to create.")
@click.option("--window", default=30.0, show_default=True, help="Seconds they fall due over.")
@click.option(
    "--gateway",
    type=click.Choice(["fake", "stripe"]),
    default="fake",
    show_default=True,
    help="Charge through the fake's card API, or through the Stripe SDK against the "
    "fake's Stripe surface (cards, declines and bank debits that settle later).",
)
def demo(count: int, window: float, gateway: str) -> None:
    """Run the whole system end to end (embedded Postgres/Redis when
    DATABASE_URL/REDIS_URL are unset) and check the gateway ledger."""
    try:
        config = Config.from_env()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        from devtools.demo import run_demo
    except ImportError as exc:
        raise click.ClickException(
            f"the demo needs the demo extra (pip install -e '.[demo]'): {exc}"
        ) from None
    sys.exit(run_demo(config, count=count, window=window, stripe=gateway == "stripe"))
