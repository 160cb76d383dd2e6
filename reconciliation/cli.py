"""``paycron reconcile`` (registered through the ``paycron.commands`` entry point)."""

from __future__ import annotations

import click


@click.command()
@click.option("--date", "day", required=True, help="The UTC day to reconcile, YYYY-MM-DD.")
@click.option("--report", "report_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A settlement report CSV; fetched from the gateway if omitted.")
def reconcile(day: str, report_file: str | None) -> None:
    """Diff the gateway's settlement report for DAY against our attempts, both ways."""
    raise click.ClickException("not built yet")
