"""The one object every routing plugin receives.

A new signal is a new field here, never a new parameter on every plugin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from router.routing.load import ReplicaLoad

# A request sent this long before a report may not have reached the worker when it was
# taken (dispatch, Serve's queue): count it as ours, once too often rather than never.
ADMIT_SLACK_S = 0.05
# A replica that holds slower-tier blocks but does not report its reload cost: assume a
# reload takes a quarter of the prefill it saves (host DRAM over PCIe is ~10x faster).
DEFAULT_RELOAD_COST = 0.25


@dataclass(slots=True)
class Candidate:
    """One (model, replica) pair that could serve the request."""

    model: str
    replica: str
    matched_tokens: int = 0  # leading prompt tokens the index says this replica holds
    host_tokens: int = 0  # of matched_tokens, held in a slower tier (reloaded on a hit)
    reload_cost: float = 0.0  # a reloaded token's time in prefill tokens' worth (reported)
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
    # The part of queued_prefill_tokens the replica itself measured, report_age_s ago; the
    # replica has been working on it since (the rest is this router's newer requests).
    reported_prefill_tokens: int = 0
    report_age_s: float = 0.0
    exact_backlog: bool = False  # the queue above is the replica's measured remaining work


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
        """Prefill work on ``c`` in tokens: the tokens it lacks, plus its slower-tier hits at
        their reload cost (a device hit is free, a host hit costs a reload)."""
        missing = max(0, self.prompt_tokens.get(c.model, 0) - c.matched_tokens)
        if not c.host_tokens:
            return missing
        return missing + math.ceil(min(c.host_tokens, c.matched_tokens) * c.reload_cost)


def build_candidate(
    model: str, replica: str, *, matched_blocks: int, block_size: int, host_blocks: int = 0,
    local: ReplicaLoad, reported: Mapping[str, float], prefill_tok_s: float,
    max_ongoing: int = 1 << 30, now: float | None = None,
) -> Candidate:
    """A candidate as production builds it (shared by ``RouterCore`` and ``kvroute sim``).

    ``local`` is this router's view of the replica (``LoadTracker.get``), ``reported`` the
    worker's routing stats (``LoadStats.routing_stats``), ``now`` the clock of both
    (default: wall-clock time). ``host_blocks``: the part of the match in a slower tier,
    priced at the replica's reported ``reload_cost`` (``DEFAULT_RELOAD_COST`` unreported).
    """
    ongoing, queued, from_report, age = _merged_load(local, reported, now)
    return Candidate(
        model, replica, matched_tokens=matched_blocks * block_size,
        host_tokens=host_blocks * block_size,
        reload_cost=float(reported.get("reload_cost", DEFAULT_RELOAD_COST)), ongoing=ongoing,
        queued_prefill_tokens=queued, kv_usage=float(reported.get("kv_usage", 0.0)),
        routed=local.routed, prefill_tok_s=prefill_tok_s, max_ongoing=max_ongoing,
        prefill_tokens_total=int(reported.get("prefill_tokens_total", 0)),
        prefill_busy_s=float(reported.get("prefill_busy_s", 0.0)),
        reported_prefill_tokens=from_report, report_age_s=age,
        exact_backlog="stats_time" in reported and "remaining_prefill_tokens" in reported,
    )


def _merged_load(
    local: ReplicaLoad, reported: Mapping[str, float], now: float | None
) -> tuple[int, int, int, float]:
    """(ongoing, queued prefill tokens, the reported part of those, the report's age).

    At the report's time ``t`` the worker saw every router's requests, and knew how much
    prefill work was left; this router knows exactly what it sent and saw finish since.
    So: the report, plus this router's changes after ``t``. Without a time (an older
    worker), the larger of the two views.
    """
    rep_ongoing = int(reported.get("ongoing_requests", 0))
    rep_queued = int(reported.get("queued_prefill_tokens", 0))
    if "stats_time" not in reported:
        return max(local.ongoing, rep_ongoing), max(local.pending_prefill, rep_queued), 0, 0.0
    t = float(reported["stats_time"])
    ongoing = local.ongoing + max(0, rep_ongoing - local.ongoing_at(t))  # + other routers'
    if "remaining_prefill_tokens" not in reported:  # an upper bound only (vLLM)
        return ongoing, max(local.pending_prefill, rep_queued), 0, 0.0
    remaining = int(reported["remaining_prefill_tokens"])
    own_since = local.pending_since(t - ADMIT_SLACK_S)
    age = max(0.0, (time.time() if now is None else now) - t)
    return ongoing, remaining + own_since, remaining, age
