"""paycron: a scheduled-payments engine. Postgres is the schedule; Dramatiq
on Redis buffers the work; a processor charges each payment once.

The package is layered; each layer is a sub-package whose docstring says
what it owns and what it may import, and ``.importlinter`` states the same
as contracts CI checks (``lint-imports``). From the bottom up:

- :mod:`paycron.domain` — statuses, money, ids, the processor's answers as
  values, and the policy that decides every next state. Pure.
- :mod:`paycron.store` — Postgres: the schema and its migrations, the SQL,
  and every write of a payment's state (the store writes what the policy
  decided).
- :mod:`paycron.observability` — Sentry, logging and Prometheus metrics.
- :mod:`paycron.limits` — limits shared through Redis: the circuit breaker,
  the call pacing and the per-actor request rate.
- :mod:`paycron.processors` — the processor interface, one sub-package per
  processor, and the factory that picks one.
- :mod:`paycron.engine` — executing claims, lookups, dead-letter actions,
  the in-flight limit: the parts that call a processor and record what it
  said.

Beside them, the shared kernel every layer may import: :mod:`paycron.config`
(settings from the environment), :mod:`paycron.errors` (the exception root)
and :mod:`paycron.sql` (the named-SQL loader); and :mod:`paycron.cli`, the
``paycron`` command's composition root, which may import anything.
"""
