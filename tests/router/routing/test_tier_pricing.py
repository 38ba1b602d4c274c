"""A slower-tier hit is priced as its reload: free on device, reload on host, prefill on a miss."""

from __future__ import annotations

import math

from cache_service.index import Match
from deploy.config.routing import profile
from router.routing.context import DEFAULT_RELOAD_COST, RequestContext
from router.routing.decision import Decider
from router.routing.load import LoadTracker
from router.routing.views import ReplicaInfo
from workers.protocol import LoadStats

BS = 512


def _decide(reports: dict[str, dict[str, float]], matches: dict[str, int]) -> list[str]:
    decider = Decider(profile("kvroute"), LoadTracker(), BS, 12000.0)
    view = [ReplicaInfo(r, 1 << 30, stats) for r, stats in reports.items()]
    cands = decider.candidates("m", view, matches, now=0.0)
    ctx = RequestContext("q", {"m": 20 * BS}, {"m": list(range(20))}, BS, cands, now=0.0)
    return [c.replica for c in decider.rank(ctx)]


def test_uncached_work_counts_host_tokens_at_their_reload_cost() -> None:
    idle = LoadStats(0, 0, 0.0, remaining_prefill_exact=True, taken_at=0.0,
                     reload_cost=0.1).routing_stats()
    decider = Decider(profile("kvroute"), LoadTracker(), BS, 12000.0)
    view = [ReplicaInfo(r, 1 << 30, idle) for r in ("dev", "host", "miss")]
    cands = decider.candidates("m", view, {"dev": Match(16), "host": Match(16, 12)}, now=0.0)
    ctx = RequestContext("q", {"m": 20 * BS}, {"m": list(range(20))}, BS, cands, now=0.0)
    work = {c.replica: ctx.uncached(c) for c in cands}
    assert work == {"dev": 4 * BS, "host": 4 * BS + math.ceil(12 * BS * 0.1), "miss": 20 * BS}
    assert cands[1].reload_cost == 0.1


def test_ranking_device_then_host_then_miss() -> None:
    idle = LoadStats(0, 0, 0.0, remaining_prefill_exact=True, taken_at=0.0,
                     reload_cost=0.1).routing_stats()
    reports = {"miss": idle, "host": idle, "dev": idle}
    assert _decide(reports, {"host": Match(16, 16), "dev": Match(16)})[:2] == ["dev", "host"]
    assert _decide(reports, {"host": Match(16, 16)})[0] == "host"
    # A busy replica's host hit loses to an idle miss; unreported, a reload costs a quarter.
    busy = LoadStats(4, 60000, 0.0, remaining_prefill_exact=True, taken_at=0.0,
                     reload_cost=0.1).routing_stats()
    assert _decide({"miss": idle, "host": busy}, {"host": Match(16, 16)})[0] == "miss"
    decider = Decider(profile("kvroute"), LoadTracker(), BS, 12000.0)
    (cand,) = decider.candidates("m", [ReplicaInfo("x", 1, {})], {"x": Match(4, 4)}, now=0.0)
    assert cand.reload_cost == DEFAULT_RELOAD_COST and cand.host_tokens == 4 * BS
