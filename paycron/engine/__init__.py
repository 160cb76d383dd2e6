"""The engine: executing a group of claims against a processor
(:mod:`.execution`), asking a processor by reference (:mod:`.lookups`),
the worker's in-flight limit (:mod:`.inflight`), dead-letter actions
(:mod:`.dead_letters`) and the message the scheduler sends the workers
(:mod:`.messages`).

It may import every layer below it; nothing in ``paycron`` imports it but
the CLI.
"""
