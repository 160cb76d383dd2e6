"""Limits shared by every process through Redis: the circuit breaker
(:mod:`.breaker`), the pacing of claims and calls to the processor's rate
(:mod:`.pacing`), and requests per actor (:mod:`.rate_limits`). Each Lua
script sits beside the module that loads it.

It imports the domain, the observability layer (to count its own
failures) and the shared kernel; never the store, a processor or the
engine.
"""
