"""The domain: statuses and reasons (:mod:`.enums`), money, payment ids,
the idempotency key of a generation (:mod:`.keys`), the processor's answers
as plain values (:mod:`.processing`) and the next-state policy
(:mod:`.policy`).

Pure: no I/O. It imports only the shared kernel (:mod:`paycron.config`,
:mod:`paycron.errors`), never another layer.
"""
