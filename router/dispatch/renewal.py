"""A session's lease renewed when its turn ends (``router.routing.leases``).

A final answer's pause is longer than the tool pause its request was leased for, so when
the whole reply went out the lease on its replica is renewed with a prefill-only request
of prompt + reply, in the background."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from router import metrics, telemetry
from router.dispatch.generation import Generation
from router.routing.leases import SessionGaps
from router.routing.prewarm import Send
from workers.protocol import SamplingParams, WorkRequest

log = logging.getLogger(__name__)


class LeaseRenewal:
    def __init__(self, gaps: SessionGaps, send: Send, monotonic: Callable[[], float],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.gaps, self._send, self._monotonic, self._spawn = gaps, send, monotonic, spawn

    def turn_ended(self, gen: Generation, sent_lease_s: float,
                   info: telemetry.RequestInfo) -> None:
        """``RequestInfo.on_end`` of a leased turn: renew if its pause needs longer."""
        req = gen.request
        if gen.final is None or req is None or not req.session_id:
            return
        lease_s = self.gaps.ended(req.session_id, self._monotonic(), info.tool_calls > 0)
        if lease_s <= sent_lease_s:
            return
        work = WorkRequest(f"{req.request_id}-lease", req.token_ids + gen.sent,
                           SamplingParams(max_tokens=1), cache_salt=req.tenant, lease_s=lease_s,
                           background=True)
        self._spawn(self._renew(gen.model, gen.replica, work))

    async def _renew(self, model: str, replica: str, work: WorkRequest) -> None:
        try:
            if await self._send(model, replica, work, ()):
                metrics.LEASE_RENEWALS.labels(model).inc()
        except Exception as e:  # a lost renewal costs at most a hit
            log.debug("lease renewal on %s failed: %r", replica, e)
