"""Named SQL blocks, loaded once from ``paycron/store/sql/*.sql``.

Each block starts with ``-- name: some_name`` followed by a one-line
description comment; the SQL uses ``%(param)s`` placeholders. Keeping every
statement in ``.sql`` files keeps the money path reviewable in one place.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_BLOCK = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_COMMENT_LINE = re.compile(r"^[ \t]*--.*\n?", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    parts = _BLOCK.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"duplicate SQL block {name!r}")
        # Whole-line comments go: psycopg caches a statement's parsing only
        # up to 4 KiB of text (finish_attempts was re-parsed on every call).
        blocks[name] = _COMMENT_LINE.sub("", body).strip().rstrip(";")
    return blocks


@cache
def queries() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for path in sorted((Path(__file__).parent / "store" / "sql").glob("*.sql")):
        for name, body in parse_blocks(path.read_text()).items():
            if name in blocks:
                raise ValueError(f"duplicate SQL block {name!r} in {path.name}")
            blocks[name] = body
    return blocks


def q(name: str) -> str:
    """The SQL of block ``name``."""
    return queries()[name]
