"""This router's own view of the load it put on each replica.

Exact and instant for the traffic this router sends, but blind to other routers and
pessimistic about prefill: a request's prefill tokens stay pending here until its first
token, however far its prefill has got. Workers' routing stats (pushed by Serve every
``request_routing_stats_period_s``) see every router's traffic and the work already
done, but are up to a period old. ``router.routing.context.build_candidate`` merges the two at
the report's time: the report, plus what this router changed since (``ReplicaLoad``).

Times are wall-clock seconds (``time.time()``) by default, the clock workers stamp their
stats with; an offline simulator passes its virtual time everywhere instead.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

Key = tuple[str, str]  # (model, replica)
_HISTORY_S = 30.0  # ongoing-count history kept: many stats periods


@dataclass(slots=True, eq=False)
class Ticket:
    key: Key
    prefill_tokens: int
    sent_at: float = 0.0
    prefilled: bool = False
    done: bool = False


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's load from this router (read-only for callers)."""

    ongoing: int = 0
    pending_prefill: int = 0  # prefill tokens of requests not yet at their first token
    routed: int = 0
    pending: dict[int, Ticket] = field(default_factory=dict)  # by id, in send order
    history: deque[tuple[float, int]] = field(default_factory=deque)  # (time, ongoing before)

    def pending_since(self, t: float) -> int:
        """Prefill tokens of requests sent after ``t`` and not yet at their first token."""
        total = 0
        for ticket in reversed(self.pending.values()):  # newest first
            if ticket.sent_at <= t:
                break
            total += ticket.prefill_tokens
        return total

    def ongoing_at(self, t: float) -> int:
        """Requests of this router in flight on the replica at time ``t`` (as far back as
        the history goes)."""
        i = bisect.bisect_right(self.history, t, key=lambda e: e[0])
        return self.history[i][1] if i < len(self.history) else self.ongoing

    def _changed(self, now: float, before: int) -> None:
        self.history.append((now, before))
        while self.history and self.history[0][0] < now - _HISTORY_S:
            self.history.popleft()


class LoadTracker:
    def __init__(self) -> None:
        self._loads: dict[Key, ReplicaLoad] = {}

    def get(self, model: str, replica: str) -> ReplicaLoad:
        return self._loads.get((model, replica)) or ReplicaLoad()

    def begin(
        self, model: str, replica: str, prefill_tokens: int, now: float | None = None
    ) -> Ticket:
        now = time.time() if now is None else now
        load = self._loads.setdefault((model, replica), ReplicaLoad())
        ticket = Ticket((model, replica), prefill_tokens, now)
        load._changed(now, load.ongoing)
        load.ongoing += 1
        load.pending_prefill += prefill_tokens
        load.pending[id(ticket)] = ticket
        load.routed += 1
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        if not ticket.prefilled:
            ticket.prefilled = True
            load = self._loads[ticket.key]
            load.pending_prefill -= ticket.prefill_tokens
            del load.pending[id(ticket)]

    def end(self, ticket: Ticket, now: float | None = None) -> None:
        if ticket.done:
            return
        self.first_token(ticket)
        ticket.done = True
        load = self._loads[ticket.key]
        load._changed(time.time() if now is None else now, load.ongoing)
        load.ongoing -= 1

    def forget(self, live: set[Key]) -> None:
        """Drop replicas that are gone (and have nothing in flight here)."""
        for key in [k for k, v in self._loads.items() if k not in live and not v.ongoing]:
            del self._loads[key]
