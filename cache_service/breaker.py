"""One circuit breaker for every Redis client of kvroute (the prefix index, the rate limiter).

Closed, calls go to Redis. A failure opens the circuit for ``backoff_s``: calls are
answered locally (the index's in-process fallback, the limiter's local buckets), so a
dead or slow Redis costs at most one timeout per ``backoff_s``, never one per request.
Then exactly one call probes Redis; its success closes the circuit, its failure opens
it again. ``on_error(op)`` is told of every failure (e.g. ``kvroute_index_errors_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class CircuitBreaker:
    def __init__(self, what: str, backoff_s: float = 1.0,
                 on_error: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 meanwhile: str = "answering locally") -> None:
        self.what, self.backoff_s, self._on_error, self._clock = what, backoff_s, on_error, clock
        self.meanwhile = meanwhile  # what the caller does while the circuit is open (logs)
        self.healthy = True
        self.probing = False
        self._down_until = 0.0

    def allow(self) -> bool:
        """May this call go to Redis? Closed: yes; open: only the one probe after back-off
        (the caller then reports ``succeeded``/``failed``, which ends the probe)."""
        if self.healthy:
            return True
        if self.probing or self._clock() < self._down_until:
            return False
        self.probing = True
        return True

    def release(self) -> None:
        """The call ended without a verdict (cancelled): let the next probe try."""
        self.probing = False

    def succeeded(self) -> None:
        self.probing = False
        if not self.healthy:
            log.info("%s: Redis is back", self.what)
            self.healthy = True

    def failed(self, op: str, exc: BaseException) -> None:
        self.probing = False
        if self.healthy:
            log.warning("%s: Redis failed in %s (%r); %s", self.what, op, exc, self.meanwhile)
        else:
            log.debug("%s: Redis still failing in %s: %r", self.what, op, exc)
        self.healthy = False
        self._down_until = self._clock() + self.backoff_s
        if self._on_error is not None:
            try:
                self._on_error(op)
            except Exception:  # a metrics callback must never break the caller
                log.exception("on_error callback failed")
