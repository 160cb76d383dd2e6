"""What the console's tests share: its settings and reading a form's CSRF
token out of a page (its clock is :class:`tests.support.Clock`)."""

from __future__ import annotations

import re

#: 43 characters: CONSOLE_SECRET_KEY needs at least 32.
SECRET = "console-test-secret-0123456789abcdefghijkl"


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
