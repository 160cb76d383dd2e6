"""A fake card processor, reached over HTTP: someone else's service.

`gateway.fake` is a self-contained aiohttp application that behaves like a
card processor (idempotency keys, declines, a rate ceiling, injected faults,
a settlement report). It shares no code with paycron on purpose: the engine
must talk to it only through HTTP, exactly as it would to a real processor.
Run it with `python -m gateway.fake --host H --port P`.
"""
