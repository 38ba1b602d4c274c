"""KV leases: keep an agent session's blocks on its replica across the pause to its next turn.

Agents pause between turns (a tool runs for seconds, a person thinks for tens of seconds);
under load, other sessions' prefills evict the paused session's prefix meanwhile, and its
next turn pays a full prefill. The router knows each session (``router.identity``: the
identity headers; a sub-agent's key carries ``#agent:``) and when its turns start. It learns,
per session kind (main agent, sub-agent), the distribution of the gaps between consecutive
turns of a session, and sends each turn with ``lease_s``: that kind's ``quantile`` gap (the
prior until ``min_samples`` gaps are seen; at most ``max_s``). The engine keeps the turn's
blocks until ``lease_s`` after it finishes, evicting them only after unleased blocks
(``workers.sim_kv``, ``workers.kv_store``). A gap is measured start to start, so it also
holds the turn's own run time: the lease errs long, and the engine caps what leases may hold.

State is bounded: the last ``MAX_SESSIONS`` sessions' start times and the last ``WINDOW``
gaps per kind. Each router replica learns alone (gaps are a distribution, not a shared fact).
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from deploy.config import LeaseConfig

MAX_SESSIONS = 100_000
WINDOW = 512  # gaps kept per kind
MAX_GAP_S = 3600.0  # a longer gap is a new visit, not a pause


def session_kind(session_id: str) -> str:
    return "sub-agent" if "#agent:" in session_id else "main"


class SessionGaps:
    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self._last: OrderedDict[str, float] = OrderedDict()
        self._gaps: dict[str, deque[float]] = {}

    def turn(self, session_id: str | None, now: float) -> float:
        """A turn of ``session_id`` starts at ``now``: learn its gap; the lease to send."""
        if not self.config.enabled or not session_id:
            return 0.0
        kind = session_kind(session_id)
        last = self._last.pop(session_id, None)
        if last is not None and 0.0 <= now - last <= MAX_GAP_S:
            self._gaps.setdefault(kind, deque(maxlen=WINDOW)).append(now - last)
        self._last[session_id] = now
        while len(self._last) > MAX_SESSIONS:
            self._last.popitem(last=False)
        return self.lease_s(kind)

    def lease_s(self, kind: str) -> float:
        """The lease a turn of ``kind`` gets now."""
        if not self.config.enabled:
            return 0.0
        gaps = self._gaps.get(kind)
        if gaps is None or len(gaps) < self.config.min_samples:
            guess = self.config.prior_s
        else:
            guess = float(np.quantile(np.fromiter(gaps, float), self.config.quantile))
        return min(guess, self.config.max_s)
