"""Redis failover under load, short: the failover bench (``ops.bench.failover``) on the
session's Ray, a few seconds of agent sessions through two router replicas whose index,
sessions and rate limits live behind Sentinel (``ops.bench.redis_fleet``), the primary
SIGKILLed mid-run. No request fails, a router reads the shared index from the promoted
replica soon after the promotion, and the rate-limit bucket survives there."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from ops.bench import failover
from ops.bench.redis_fleet import redis_fleet
from tests.stacks import deployed, release

pytestmark = [pytest.mark.slow, pytest.mark.load]  # 14 s of fixed-length load


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    failover.add_arguments(parser)
    return failover.with_defaults(parser.parse_args(list(argv)))


def test_a_killed_redis_primary_fails_no_request(ray_local: None, serve_port: int) -> None:
    args = _args("--concurrency", "4", "--duration", "14", "--kill-at", "5", "--ramp", "1",
                 "--quiet")
    with redis_fleet() as fleet:
        try:
            with deployed(failover.build_config(args, fleet, serve_port)) as url:
                records, times = asyncio.run(failover.measure(url, fleet, args))
        finally:
            release()  # while its Redis still runs
    res = failover.result(records, times, args, wall_s=0.0)
    assert res["requests"] > 0
    assert res["errors"] == 0, res["params"]["error_samples"]
    assert res["promotion_s"] < 10
    assert res["index_store_recovery_s"] is not None and res["index_store_recovery_s"] < 5
    assert res["index_recovery_s"] is not None and res["index_recovery_s"] < 5
    assert res["predicted_back_s"] is not None
    limit = res["rate_limit_kept"]
    assert limit["admitted_before_kill"] == failover.PROBE_SPENT
    assert limit["kept"], limit  # the promoted replica holds the bucket the primary had
    # not a full bucket again; only a router whose limiter call failed meanwhile (documented:
    # it decides from its own share for a back-off) may admit more
    assert limit["admitted_after_failover"] < failover.PROBE_RPM or limit["limiter_fell_back"], \
        limit
