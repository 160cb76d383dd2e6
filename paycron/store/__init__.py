"""Postgres: connections (:mod:`.db`), the schema's migrations
(``migrations/``), the named SQL (``sql/``), day partitions, and every
read and write of payments, events, dead letters, API keys, webhook
endpoints and the processor's inbound events.

Every status change is one conditional UPDATE in :mod:`.transitions`; the
store writes what :mod:`paycron.domain.policy` decided and never calls a
processor. It imports the domain and the shared kernel only.
"""
