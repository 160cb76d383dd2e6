"""What the console's tests share: its settings, a clock the test moves, and
reading a form's CSRF token out of a page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

#: 43 characters: CONSOLE_SECRET_KEY needs at least 32.
SECRET = "console-test-secret-0123456789abcdefghijkl"


class MovableClock:
    """The web app's clock (``create_app(clock=...)``): real time plus
    whatever the test has moved it by."""

    def __init__(self):
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, **delta) -> None:
        self.offset += timedelta(**delta)


def console_config(config, **changes):
    """The test config with the console on; keys are checked on every
    request unless a test says otherwise."""
    return config.with_overrides(
        **{"console_secret_key": SECRET, "api_key_cache_seconds": 0, **changes}
    )


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)
