"""Whose a payment method is: asked of the processor before a create is
written, so a payment is never scheduled to charge one customer's method
under another customer (docs/customers.md).

:class:`PaymentMethodCheck` answers, for (customer, payment method) pairs,
which ones the processor holds for another customer (or not at all). Each
verdict is kept for :data:`VERDICT_SECONDS`, so a batch naming one pair a
thousand times, or a month of creates for the same subscriber, asks once.
The pairs a request has not seen are asked concurrently, and the whole
check ends within ``PAYMENT_METHOD_CHECK_SECONDS``: past it, or when the
processor cannot answer, :class:`~paycron.errors.ProcessorUnavailable`
(the request writes nothing; the verdicts learned so far are kept, so the
same request again asks only for what is left).

A method attached to no customer is accepted: Stripe's test tokens and a
method not yet saved are unattached, and Stripe refuses a detached method
for good. Only a method attached to *another* customer, or one the
processor does not hold, is refused.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from paycron.errors import GatewayError, ProcessorPaymentMissing, ProcessorUnavailable
from paycron.processors.base import PaymentMethodOwners

Pair = tuple[str, str]  # (customer, payment method)

#: A verdict is trusted this long. A method attached to a customer stays
#: that customer's (Stripe attaches a method to one customer, and a detached
#: one cannot be used again), so a long time would be safe for those; an
#: unattached method could be attached to someone else later, and ten
#: minutes bounds how long that goes unseen by this cache.
VERDICT_SECONDS = 600.0
#: Verdicts kept per process at most (oldest forgotten first): a month-start
#: import of a few tens of thousands of subscribers, a few MB.
MAX_VERDICTS = 50_000
#: Pairs asked at once: a batch of new pairs is asked in parallel, well under
#: the processor's rate limit (every ask also takes a token from the shared
#: per-second window of calls).
CONCURRENCY = 8


class PaymentMethodCheck:
    """The check for one process (thread-safe)."""

    def __init__(
        self,
        processor: PaymentMethodOwners,
        *,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._processor, self._seconds, self._clock = processor, seconds, clock
        self._verdicts: OrderedDict[Pair, tuple[float, bool]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="payment-method-check")
        #: Processor asks made (a test and the bench read it).
        self.asked = 0

    def refused(self, pairs: Iterable[Pair]) -> set[Pair]:
        """The pairs whose payment method is not the customer's at the processor."""
        wanted = set(pairs)
        known = {pair: verdict for pair in wanted if (verdict := self._cached(pair)) is not None}
        unknown = wanted - known.keys()
        if unknown:
            known.update(self._ask(unknown))
        return {pair for pair, ok in known.items() if not ok}

    def _ask(self, pairs: set[Pair]) -> dict[Pair, bool]:
        deadline = self._clock() + self._seconds
        futures = {self._pool.submit(self._ask_one, pair, deadline): pair for pair in pairs}
        done, pending = wait(futures, timeout=self._seconds, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        failed = [f for f in done if f.exception() is not None]
        if pending or failed:
            cause = failed[0].exception() if failed else None
            raise ProcessorUnavailable(
                "the processor did not say in time whose the payment method is; nothing "
                "was created: send the same request again"
            ) from cause
        return {futures[future]: future.result() for future in done}

    def _ask_one(self, pair: Pair, deadline: float) -> bool:
        customer, method = pair
        left = deadline - self._clock()
        if left <= 0:
            raise GatewayError("no time left to ask")
        try:
            owner = self._processor.payment_method_customer(method, timeout=left)
        except ProcessorPaymentMissing:
            ok = False  # the processor holds no such method: not this customer's
        else:
            ok = owner is None or owner == customer
        with self._lock:
            self.asked += 1
            self._verdicts[pair] = (self._clock() + VERDICT_SECONDS, ok)
            self._verdicts.move_to_end(pair)
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        return ok

    def _cached(self, pair: Pair) -> bool | None:
        with self._lock:
            entry = self._verdicts.get(pair)
            if entry is None:
                return None
            if entry[0] <= self._clock():
                del self._verdicts[pair]
                return None
            return entry[1]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
