"""The one object every routing plugin receives.

A new signal is a new field here, never a new parameter on every plugin.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Candidate:
    """One (model, replica) pair that could serve the request."""

    model: str
    replica: str
    matched_tokens: int = 0  # leading prompt tokens the index says this replica holds
    ongoing: int = 0
    queued_prefill_tokens: int = 0
    kv_usage: float = 0.0
    routed: int = 0  # requests this router has sent it (a spreading tie-break)
    prefill_tok_s: float = 4000.0  # configured prior; scorers learn the real rate (below)
    max_ongoing: int = 1 << 30
    # Worker-reported cumulative counters (monotone, like Prometheus counters): uncached
    # tokens prefilled and seconds spent prefilling. Scorers learn the replica's prefill
    # rate from their deltas; zero means "not reported" and the prior above is used.
    prefill_tokens_total: int = 0
    prefill_busy_s: float = 0.0


@dataclass(slots=True)
class RequestContext:
    request_id: str
    prompt_tokens: dict[str, int]  # per model: its tokenizer's prompt length
    hashes: dict[str, list[int]]  # per model: block hashes of the prompt
    block_size: int
    candidates: list[Candidate]
    headers: Mapping[str, str] = field(default_factory=dict)
    session_id: str | None = None
    # When the decision is made (seconds, monotonic): time-based plugin state (e.g. tree
    # trimming) reads it, so an offline simulator can pass virtual time.
    now: float = field(default_factory=time.monotonic)
    # Model selection and sessions (defaults: one explicit model, no session history).
    model_weights: dict[str, float] = field(default_factory=dict)  # preference, (0, 1]
    max_tokens: int = 0  # the output budget this request asks for
    context_windows: dict[str, int] = field(default_factory=dict)
    has_tools: bool = False
    tool_models: frozenset[str] | None = None  # models able to call tools (None: all)
    model_costs: dict[str, float] = field(default_factory=dict)  # per million tokens
    sticky: tuple[str, str] | None = None  # the session's last (model, replica)

    def uncached(self, c: Candidate) -> int:
        return max(0, self.prompt_tokens.get(c.model, 0) - c.matched_tokens)


def build_candidate(
    model: str, replica: str, *, matched_blocks: int, block_size: int,
    local: tuple[int, int, int], reported: Mapping[str, float],
    prefill_tok_s: float, max_ongoing: int = 1 << 30,
) -> Candidate:
    """A candidate as production builds it (shared by ``RouterCore`` and ``kvroute sim``).

    ``local`` is this router's own (ongoing, pending prefill tokens, routed) for the
    replica (``LoadTracker.get``); ``reported`` the worker's routing stats. Load is the
    larger of the two views: the local one is exact and instant for this router's
    traffic, the reported one covers other routers.
    """
    ongoing, pending, routed = local
    return Candidate(
        model, replica, matched_tokens=matched_blocks * block_size,
        ongoing=max(ongoing, int(reported.get("ongoing_requests", 0))),
        queued_prefill_tokens=max(pending, int(reported.get("queued_prefill_tokens", 0))),
        kv_usage=float(reported.get("kv_usage", 0.0)), routed=routed,
        prefill_tok_s=prefill_tok_s, max_ongoing=max_ongoing,
        prefill_tokens_total=int(reported.get("prefill_tokens_total", 0)),
        prefill_busy_s=float(reported.get("prefill_busy_s", 0.0)),
    )
