"""This router's own view of the load it put on each replica.

Exact and instant for the traffic this router sends; worker-reported routing
stats (pushed by Serve, ~1 s old) cover traffic from other router replicas. The
candidate load is the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, str]  # (model, replica)


@dataclass(slots=True)
class _Load:
    ongoing: int = 0
    pending_prefill: int = 0
    routed: int = 0


@dataclass(slots=True)
class Ticket:
    key: Key
    prefill_tokens: int
    prefilled: bool = False
    done: bool = False


class LoadTracker:
    def __init__(self) -> None:
        self._loads: dict[Key, _Load] = {}

    def get(self, model: str, replica: str) -> tuple[int, int, int]:
        load = self._loads.get((model, replica))
        return (load.ongoing, load.pending_prefill, load.routed) if load else (0, 0, 0)

    def begin(self, model: str, replica: str, prefill_tokens: int) -> Ticket:
        load = self._loads.setdefault((model, replica), _Load())
        load.ongoing += 1
        load.pending_prefill += prefill_tokens
        load.routed += 1
        return Ticket((model, replica), prefill_tokens)

    def first_token(self, ticket: Ticket) -> None:
        if not ticket.prefilled:
            ticket.prefilled = True
            self._loads[ticket.key].pending_prefill -= ticket.prefill_tokens

    def end(self, ticket: Ticket) -> None:
        if ticket.done:
            return
        self.first_token(ticket)
        ticket.done = True
        self._loads[ticket.key].ongoing -= 1

    def forget(self, live: set[Key]) -> None:
        """Drop replicas that are gone (and have nothing in flight here)."""
        for key in [k for k, v in self._loads.items() if k not in live and not v.ongoing]:
            del self._loads[key]
