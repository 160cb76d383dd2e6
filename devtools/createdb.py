"""``python -m devtools.createdb``: create ``DATABASE_URL``'s database when
its server answers but lacks it (``./dev up`` on a fresh machine). Anything
else (no server, a wrong password) is left to ``paycron migrate`` to say."""

from __future__ import annotations

import sys

import psycopg
from psycopg import sql

from paycron.config import Config


def main() -> int:
    url = Config.from_env().database_url
    if not url:
        return 0
    try:
        psycopg.connect(url, connect_timeout=3).close()
        return 0
    except psycopg.Error as exc:
        # libpq reports a missing database as a failed connection, by its text.
        if "does not exist" not in str(exc):
            return 0
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(
        psycopg.conninfo.make_conninfo(url, dbname="postgres"), autocommit=True
    ) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    print(f"created database {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
