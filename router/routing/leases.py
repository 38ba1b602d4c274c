"""KV leases: keep an agent session's blocks on its replica across the pause to its next turn.

Agents pause between turns (a tool runs for seconds, a person thinks for tens of seconds);
under load, other sessions' prefills evict the paused session's prefix meanwhile, and its
next turn pays a full prefill. The router knows each session (``router.api.common.identity``: the
identity headers; a sub-agent's key carries ``#agent:``) and when its turns start. It learns,
per session kind (main agent, sub-agent), the distribution of the gaps between consecutive
turns of a session, and sends each turn with ``lease_s``: that kind's ``quantile`` gap (the
prior until ``min_samples`` gaps are seen; at most ``max_s``). The engine keeps the turn's
blocks until ``lease_s`` after it finishes, evicting them only after unleased blocks
(``workers.engines.sim.kv``, ``workers.engines.mlx.kv_store``). A gap is measured start to start,
so it also
holds the turn's own run time: the lease errs long, and the engine caps what leases may hold.

By how the turn ended (``by_ending``, the default): a reply that calls a tool is followed by
the tool's run time (seconds), a final answer by the user's next task (tens of seconds), and
one lease for both covers neither well. The turn is sent with the lease after a tool call
(most turns end so); when the reply ends the router knows (the API layers count its tool
calls, ``telemetry.RequestInfo.tool_calls``), and a final answer renews the session's KV on
its replica with the longer lease (``RouterCore``: a prefill-only request of prompt + reply;
its blocks are all cached, the engine keeps the latest lease of a block). Gaps are then
measured from a turn's end to the next turn's start and learned per (kind, ending).

State is bounded: the last ``MAX_SESSIONS`` sessions' last turns and the last ``WINDOW``
gaps per (kind, ending). Each router replica learns alone (gaps are a distribution, not a
shared fact).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from deploy.config import LeaseConfig

MAX_SESSIONS = 100_000
WINDOW = 512  # gaps kept per (kind, ending)
MAX_GAP_S = 3600.0  # a longer gap is a new visit, not a pause
TOOL, FINAL = "tool", "final"  # how a turn ended ("": not known, start-to-start gaps)


def session_kind(session_id: str) -> str:
    return "sub-agent" if "#agent:" in session_id else "main"


@dataclass(slots=True)
class _Turn:
    start: float
    end: float | None = None
    ending: str = ""


class SessionGaps:
    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self._last: OrderedDict[str, _Turn] = OrderedDict()
        self._gaps: dict[tuple[str, str], deque[float]] = {}

    def turn(self, session_id: str | None, now: float) -> float:
        """A turn of ``session_id`` starts at ``now``: learn its gap; the lease to send."""
        if not self.config.enabled or not session_id:
            return 0.0
        kind = session_kind(session_id)
        last = self._last.pop(session_id, None)
        if last is not None:
            since, ending = (last.end, last.ending) if last.end is not None else (last.start, "")
            if 0.0 <= now - since <= MAX_GAP_S:
                self._gaps.setdefault((kind, ending), deque(maxlen=WINDOW)).append(now - since)
        self._last[session_id] = _Turn(now)
        while len(self._last) > MAX_SESSIONS:
            self._last.popitem(last=False)
        return self.start_lease(kind)

    def start_lease(self, kind: str) -> float:
        """The lease a turn of ``kind`` is sent with."""
        return self.lease_s(kind, TOOL if self.config.by_ending else "")

    def ended(self, session_id: str, now: float, tool_call: bool) -> float:
        """The last turn of ``session_id`` ended at ``now``; the lease to renew its KV with
        for the pause it begins. 0: no renewal (a tool call keeps the lease its turn was
        sent with, though the learned one may have moved a little since; or leases are
        not chosen by ending)."""
        turn = self._last.get(session_id)
        if not (self.config.enabled and self.config.by_ending) or turn is None:
            return 0.0
        turn.end, turn.ending = now, TOOL if tool_call else FINAL
        return 0.0 if tool_call else self.lease_s(session_kind(session_id), FINAL)

    def lease_s(self, kind: str, ending: str = "") -> float:
        """The lease a turn of ``kind`` that ended so gets now."""
        if not self.config.enabled:
            return 0.0
        gaps = self._gaps.get((kind, ending))
        if gaps is None or len(gaps) < self.config.min_samples:
            guess = self.config.tool_prior_s if ending == TOOL else self.config.prior_s
        else:
            guess = float(np.quantile(np.fromiter(gaps, float), self.config.quantile))
        return min(guess, self.config.max_s)
