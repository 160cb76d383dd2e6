"""The fake card processor: one asyncio process, its state in memory.

It behaves like a real processor closely enough for paycron's tests and demo
to meet every failure the engine must survive, and it shares no code with the
engine (it is someone else's service, reached over HTTP only). SPEC §7 is
its contract; ``python -m gateway.fake --host H --port P`` serves it.

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
"""
