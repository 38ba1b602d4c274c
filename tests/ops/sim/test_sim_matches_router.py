"""One trace through ``kvroute sim`` and through ``RouterCore``'s decision path, in lockstep.

At every decision of the simulator, a real ``RouterCore`` (fake deployment handles, the
same profile and block size) decides from the same state: the simulator's prefix index
and load tracker, a replica view that reports what the simulator's router sees, and the
simulator's virtual clocks. Both call ``router.routing.decision.Decider``; if either side built
its context, candidates or admission differently, the picks would part.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from deploy.config import IndexConfig, KvrouteConfig, ModelConfig, RouterConfig
from ops.sim.simulator import SimConfig, Simulator
from ops.sim.trace import TraceRequest, load_trace, speedup_for_load
from router.core import RouterCore
from router.routing import views
from router.routing.selection import RouteRequest
from router.routing.views import ReplicaInfo
from workers.protocol import SamplingParams

MOONCAKE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_trace_1000.jsonl"


class _Handle:
    def options(self, **_: Any) -> _Handle:
        return self


class _View:
    """What the simulator's router sees of its replicas, as Serve's view would give it."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def snapshot(self) -> list[ReplicaInfo]:
        return [ReplicaInfo(r.name, 1 << 30, self.sim._reported(r)) for r in self.sim.replicas]


class Lockstep(Simulator):
    def __init__(self, cfg: SimConfig, core: RouterCore) -> None:
        super().__init__(cfg)
        self.core = core
        core.index = self.index
        core.loads = core.decider.loads = self.loads
        core.clock = core.monotonic = lambda: self.now
        views.register(cfg.model, _View(self))
        self.picks: list[tuple[str, str]] = []  # (simulator, RouterCore)

    async def _route(self, rid: str, req: TraceRequest, arrival: float,
                     ctx: Any = None) -> None:
        model = self.cfg.model
        route = RouteRequest(model, [0] * req.input_length,
                             SamplingParams(max_tokens=max(1, req.output_length)), rid, {}, None)
        core_ctx = await self.core._context(route, {model: 1.0}, {model: list(req.hash_ids)})
        core_pick = self.core._rank(core_ctx)[0].replica
        await super()._route(rid, req, arrival, ctx)
        self.picks.append((self.records[rid].replica, core_pick))


@pytest.mark.parametrize(("policy", "host_blocks"), [
    ("kvroute", 0), ("kvroute", 800), ("round-robin", 0), ("sglang-cache-aware", 0)])
def test_one_trace_gives_the_same_picks_in_sim_and_router(tiny_model_dir: Path, policy: str,
                                                          host_blocks: int) -> None:
    """With a host tier too: both price its hits from the same index answer and reports."""
    trace = load_trace(MOONCAKE, max_requests=150)
    cfg = SimConfig(replicas=4, kv_blocks=400 if not host_blocks else 100, policy=policy,
                    model="lockstep", host_kv_blocks=host_blocks,
                    speedup=speedup_for_load(trace, 0.8, 4, 12000.0, 512))
    config = KvrouteConfig(
        models=[ModelConfig(name=cfg.model, engine="sim", model_path=str(tiny_model_dir),
                            context_window=1 << 30)],
        index=IndexConfig(block_size=cfg.block_size),
        router=RouterConfig(policy=policy, prefill_tokens_per_s=cfg.prior_prefill_tok_s))

    async def run() -> Lockstep:
        sim = Lockstep(cfg, RouterCore(config, {cfg.model: _Handle()}))  # type: ignore[dict-item]
        await sim.run(trace)
        return sim

    sim = asyncio.run(run())
    picks = sim.picks
    host_hits = sum(r.host_cached_tokens for r in sim.records.values())
    assert (host_hits > 0) == (host_blocks > 0)
    assert len(picks) == len(trace)
    assert len({p for p, _ in picks}) > 1  # a real spread, not one replica throughout
    assert [p for p, _ in picks] == [c for _, c in picks]
