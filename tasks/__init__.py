"""Dramatiq workers: ``dramatiq tasks``.

Importing this package configures Sentry (before the broker, as
sentry-sdk's Dramatiq integration requires) and the Redis broker, then
declares the actors.
"""

from tasks.broker import broker, config
from tasks.execute import execute_payments

__all__ = ["broker", "config", "execute_payments"]
