"""The fake card processor: one asyncio process, its state in memory.

It behaves like a real processor closely enough for paycron's tests and demo
to meet every failure the engine must survive, and it shares no code with the
engine (it is someone else's service, reached over HTTP only). This docstring
and docs/development.md are its contract; ``python -m gateway.fake --host H --port P`` serves it.

The core, shared by every HTTP surface:
    `processor` (the state, and each charge's fate), `keys` (idempotency
    keys: serialization per key, replays, retention), `ledger` (charges and
    refunds), `faults` (the settings), `dice` (seeded randomness), `errors`
    (every refusal, one exception each).
Over HTTP:
    `card` (the card API: charges, refunds, settlement report), `controls`
    (``/_faults``, ``/_stats``, ``/_ledger``, ``/_reset``, ``/healthz``),
    `jsonapi` (JSON answers and errors), `app` (the aiohttp application),
    `__main__` (the command line).
The Stripe-shaped surface (docs/design.md), under ``/stripe`` for the official SDK:
    `stripe_api` (the routes and the writes), `stripe_reads` (retrieve, list,
    search, expand), `stripe_idempotency` (Stripe's replays), `stripe_wire`
    (form encoding, errors, auth, lists), `stripe_ledger` (intents, charges,
    refunds, events, the lagging search index), `stripe_objects` (the
    objects' shapes), `stripe_methods` (test payment methods, amount limits),
    `stripe_search` (the query language), `stripe_webhooks` (signed event
    deliveries), `stripe_settings` and `stripe_controls` (``/_stripe…``).
"""
