"""The domain's exception root. Each part translates these at its boundary
(HTTP status codes are decided in ``web/problems.py``, exit codes in the CLI)."""

from __future__ import annotations


class PaycronError(Exception):
    """Root of every error the domain raises on purpose."""

    code = "INTERNAL"


class ConfigError(PaycronError):
    """A setting is missing or wrong; the message names it, on one line."""

    code = "CONFIG_INVALID"


class Unreachable(ConfigError):
    """A server a setting names (``DATABASE_URL``, ``REDIS_URL``) did not
    answer; the message names the setting and the host, never a password."""

    code = "UNREACHABLE"


class ValidationFailed(PaycronError):
    """Bad input: ``messages`` maps a field name to a list of messages."""

    code = "VALIDATION_FAILED"

    def __init__(self, messages: dict[str, list[str]]):
        super().__init__("request body is invalid")
        self.messages = messages


class CustomerNotYours(ValidationFailed):
    """The create names a processor customer not bound to its actor
    (docs/customers.md: registered to another, or bound by another's first
    use, or with CUSTOMER_BINDING=registered not registered to this one).
    Refused per field like any bad body, under a code of its own; nothing
    is created, and the answer says nothing more about that customer."""

    code = "CUSTOMER_NOT_YOURS"
    MESSAGE = "customer belongs to another payer"
    #: With CUSTOMER_BINDING=registered: the same answer whether the customer
    #: is another payer's or nobody's, so it tells nothing about others.
    NOT_REGISTERED = "customer is not registered to this payer (an admin registers it)"

    def __init__(self, message: str = MESSAGE):
        PaycronError.__init__(self, f"the {message}")
        self.messages = {"customer": [message]}


class PaymentMethodNotCustomers(ValidationFailed):
    """The create names a payment method the processor holds for another
    customer than the one it names, or none it knows (docs/customers.md).
    Nothing is created."""

    code = "PAYMENT_METHOD_NOT_CUSTOMERS"
    MESSAGE = "paymentMethod is not a payment method of this customer at the processor"

    def __init__(self):
        PaycronError.__init__(self, "the payment method does not belong to the customer")
        self.messages = {"paymentMethod": [self.MESSAGE]}


class ProcessorUnavailable(PaycronError):
    """A create needed the processor's answer (whose a payment method is) and
    did not get it in time: nothing was created; the same request again is safe."""

    code = "PROCESSOR_UNAVAILABLE"


class CustomerBound(PaycronError):
    """An admin registers a customer another actor holds: remove that binding first."""

    code = "CUSTOMER_BOUND"


class IdempotencyKeyReused(PaycronError):
    """The same (actor, key) was used before with a different request body."""

    code = "IDEMPOTENCY_KEY_REUSED"


class NotFound(PaycronError):
    code = "NOT_FOUND"


class CancelRefused(PaycronError):
    """A cancel the API refuses; ``code`` is the :class:`CancelOutcome` that says why."""

    def __init__(self, outcome: str):
        detail = (
            "an earlier call may have charged it; it cannot be cancelled until "
            "the gateway's answer is known"
            if outcome == "OUTCOME_IN_DOUBT"
            else "the payment can no longer be cancelled"
        )
        super().__init__(detail)
        self.code = str(outcome)


class DeadLetterActionRefused(PaycronError):
    code = "DEAD_LETTER_ACTION_REFUSED"


class RateLimited(PaycronError):
    """The actor sent more than ``API_RATE_LIMIT`` requests per second beyond
    its burst; ``retry_after`` is whole seconds until a request fits again."""

    code = "RATE_LIMITED"

    def __init__(self, retry_after: int):
        super().__init__(f"too many requests: retry after {retry_after} s")
        self.retry_after = retry_after


class LimitReached(PaycronError):
    """A quota (e.g. ``MAX_WEBHOOK_ENDPOINTS``) is full: nothing was created."""

    code = "LIMIT_REACHED"


class OutcomeUnknown(PaycronError):
    """A write that may or may not have taken effect: its commit's wait for
    the synchronous standby was cut (committed on the primary alone), or its
    connection was lost before the answer. Retrying with the same
    Idempotency-Key returns what exists or creates it once (docs/operations.md)."""

    code = "OUTCOME_UNKNOWN"


class GatewayError(PaycronError):
    """The gateway could not be asked at all (used by the ops tools)."""

    code = "GATEWAY_UNAVAILABLE"


class GatewayRequestRefused(GatewayError):
    """The processor answered, and refused our request as invalid (a 400 or
    404 that is not a rate limit): a bug in paycron or a change of the
    processor's API, not an outage — asking again later will not help."""

    code = "PROCESSOR_REFUSED_REQUEST"


class ProcessorPaymentMissing(GatewayRequestRefused):
    """The processor holds no payment by that id for this account (a 404):
    what we stored names something that is not there to ask about."""

    code = "PROCESSOR_PAYMENT_MISSING"


class OtherProcessor(GatewayError):
    """The payment was called at another processor than the one this process
    is configured for: only its own processor can say what it holds, and
    another's "nothing" is no answer (docs/money-safety.md)."""

    code = "OTHER_PROCESSOR"

    def __init__(self, payment_processor: str, acting: str):
        super().__init__(
            f"this payment was called at {payment_processor}, and this process is "
            f"configured for {acting}: ask from a process configured for {payment_processor}"
        )
        self.payment_processor = payment_processor
        self.acting = acting
