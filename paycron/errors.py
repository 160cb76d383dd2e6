"""The domain's exception root. Each part translates these at its boundary
(HTTP status codes are decided in ``web/errors.py``, exit codes in the CLI)."""

from __future__ import annotations


class PaycronError(Exception):
    """Root of every error the domain raises on purpose."""

    code = "INTERNAL"


class ConfigError(PaycronError):
    code = "CONFIG_INVALID"


class ValidationFailed(PaycronError):
    """Bad input: ``messages`` maps a field name to a list of messages."""

    code = "VALIDATION_FAILED"

    def __init__(self, messages: dict[str, list[str]]):
        super().__init__("request body is invalid")
        self.messages = messages


class IdempotencyKeyReused(PaycronError):
    """The same (actor, key) was used before with a different request body."""

    code = "IDEMPOTENCY_KEY_REUSED"


class NotFound(PaycronError):
    code = "NOT_FOUND"


class CancelRefused(PaycronError):
    """Cancel lost: the payment is no longer cancellable; ``code`` says why."""

    def __init__(self, code: str, status: str):
        super().__init__(f"payment is {status}; it can no longer be cancelled")
        self.code = code
        self.status = status


class DeadLetterActionRefused(PaycronError):
    code = "DEAD_LETTER_ACTION_REFUSED"


class GatewayError(PaycronError):
    """The gateway could not be asked at all (used by the ops tools)."""

    code = "GATEWAY_UNAVAILABLE"
