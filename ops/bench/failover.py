"""Redis failover under load: the primary SIGKILLed mid-run, measured from the client.

    kvroute bench failover --redis sentinel --concurrency 16 --duration 90 --out failover.json

A Redis primary, its replica and three Sentinels on loopback (``ops.bench.redis_fleet``);
a sim stack (``--router-replicas`` routers, ``--replicas`` sim replicas) with
``index.redis_sentinel`` (so the index, the sessions and the rate limits live there) and two
API keys: ``bench`` (the load; a limit it never reaches) and ``probe`` (10 rpm). The agent
workload runs closed loop; at ``--kill-at`` the bench spends 6 of ``probe``'s 10 requests,
waits for the replica to hold every write, SIGKILLs the primary and times the promotion.

Reported (JSON = the bench JSON plus these; figures: ``ops.bench.failover_figures``):
``requests``, ``errors`` (any non-2xx or failed stream), ``promotion_s`` (kill → a Sentinel
names the new primary), ``index_store_recovery_s`` (promotion → an index lookup through the
Sentinel URL answers), ``index_recovery_s`` (promotion → the first router's index read
served by the new primary: its circuit closed, its lookups answered from the shared index
again), ``predicted_back_s`` (promotion → the first request sent after it that came back
with a predicted-cached header: a lower bound only, since a router's local view predicts
during the outage too), ``hit_rate`` and ``predicted_rate``
``{before, during, after}``, ``hit_recovery_s`` (kill → the rolling hit rate back within 1
point of before) and ``rate_limit_kept`` (``probe``'s bucket on the new primary, and what
the routers admit for it after the failover; ``limiter_fell_back``: a router's limiter call
failed while the probe spent or tested its budget, so for a back-off that router decided
from its own share of the usage, as docs/auth.md says it does).
Only ``--redis sentinel`` exists for now.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ops.bench import failover_figures as figures
from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver
from ops.bench.harness.workloads import CHAT_PATH, AgentParams, AgentWorkload, BenchRequest
from ops.bench.redis_fleet import RedisFleet, redis_fleet

MODEL = "failover-model"
BENCH_KEY, PROBE_KEY = "kvroute-bench-load", "kvroute-bench-probe"  # test-only secrets
PROBE_RPM, PROBE_SPENT = 10, 6
METRICS_LAG_S = 2.5  # a replica's push (each second) plus the /metrics snapshot's age (1 s)
NAMESPACE = "kvroute"


@dataclass
class KillTimes:
    """When things happened, in seconds on the run's clock."""

    kill_s: float | None = None
    promotion_s: float | None = None  # absolute: when a Sentinel named the new primary
    store_back_s: float | None = None  # absolute: an index lookup answered again
    router_back_s: float | None = None  # absolute: a router's index read reached Redis
    replicated: bool = False
    rate_limit: dict[str, Any] | None = None


def build_config(args: argparse.Namespace, fleet: RedisFleet, port: int) -> Any:
    from deploy.config import IndexConfig
    from deploy.config.auth import ApiKeyConfig, AuthConfig
    from deploy.config.index import SentinelConfig
    from ops.bench.harness.config import StackSpec, build, sim_kwargs
    from ops.models.tiny_model import ensure_model

    sim = {"kv_blocks": args.kv_blocks, "prefill_tok_s": args.prefill_tok_s,
           "tpot_s": args.tpot_s}
    base = build(StackSpec(model=MODEL, model_path=str(ensure_model()), port=port,
                           replicas=args.replicas, engine_kwargs=sim_kwargs(sim),
                           router_replicas=args.router_replicas))
    index = IndexConfig(redis_sentinel=SentinelConfig(sentinels=fleet.sentinel_addrs,
                                                      master=fleet.master),
                        namespace=NAMESPACE, predicted_cached_header=True,
                        **({} if args.backoff is None else {"backoff_s": args.backoff}))
    keys = [ApiKeyConfig(name="bench", key_sha256=_sha(BENCH_KEY), requests_per_min=1_000_000),
            ApiKeyConfig(name="probe", key_sha256=_sha(PROBE_KEY), requests_per_min=PROBE_RPM)]
    auth = AuthConfig(api_keys=keys, api_keys_env="")
    return type(base).model_validate({**base.model_dump(), "index": index.model_dump(),
                                      "auth": auth.model_dump()})


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _probe_request(i: int) -> BenchRequest:
    body = {"messages": [{"role": "user", "content": f"rate-limit probe {i}"}], "max_tokens": 2}
    return BenchRequest(f"probe.{i}", CHAT_PATH, body)


async def _probe_burst(url: str, n: int) -> int:
    """Send ``n`` probe requests one after another; how many were admitted (2xx)."""
    async with Client(url, MODEL, headers=_bearer(PROBE_KEY)) as probe:
        recs = [await probe.send(_probe_request(i), time.monotonic()) for i in range(n)]
    return sum(r.ok for r in recs)


def _bucket(fleet: RedisFleet, primary: bool) -> tuple[int | None, float | None]:
    """The probe key's request bucket on a node: its stored TAT (us) and how far it runs
    ahead of the node's clock, s (None, None: no key, a full bucket)."""
    client = (fleet.primary if primary else fleet.replica).client()
    tat = client.get("{" + NAMESPACE + "-rl}:probe:req")
    secs, micros = client.time()
    if tat is None:
        return None, None
    return int(tat), (int(tat) - (secs * 1_000_000 + micros)) / 1e6


async def _limiter_failures(url: str) -> float:
    """Rate-limiter Redis calls that failed, summed over the router replicas
    (``kvroute_index_errors_total{op="ratelimit"}`` on the merged ``/metrics``). Each opens
    that router's circuit: for ``backoff_s`` it decides from its own share of the usage."""
    from ops.commands.status import parse_metrics, total

    async with httpx.AsyncClient(timeout=10.0) as http:
        text = (await http.get(url.rstrip("/") + "/metrics")).text
    return total(parse_metrics(text), "kvroute_index_errors_total", op="ratelimit")


async def _fresh_limiter_failures(url: str) -> float:
    """As ``_limiter_failures`` once every replica has pushed what it counted so far: one
    push per second to the hub, and ``/metrics`` is a snapshot up to a second old."""
    await asyncio.sleep(METRICS_LAG_S)
    return await _limiter_failures(url)


async def _store_answers(url: str) -> bool:
    from cache_service import IndexSettings, RedisPrefixIndex

    index = RedisPrefixIndex(url, IndexSettings(namespace=NAMESPACE + "-probe"), timeout_s=0.2)
    try:
        await index.lookup({MODEL: [1]})
        return True
    except Exception:  # any failure is "not back yet"
        return False
    finally:
        await index.close()


def _gets(fleet: RedisFleet) -> int:
    """GETs the promoted replica has served: only the routers' session reads send GET here
    (the index's other calls and the limiter's are scripts; the agent workload continues no
    stored response)."""
    stats = fleet.replica.client().info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def _first_router_call(fleet: RedisFleet, runner: Runner, timeout_s: float = 30.0
                             ) -> float | None:
    """When (run clock) a router's index first reads from the new primary: its circuit is
    closed again and its lookups answer from the shared index (None: not within timeout)."""
    start = await asyncio.to_thread(_gets, fleet)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_gets, fleet) > start:
            return runner.elapsed
        await asyncio.sleep(0.02)
    return None


async def _until_store_answers(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await _store_answers(url):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"the index did not answer through the Sentinels in {timeout_s} s")


async def _kill(url: str, fleet: RedisFleet, runner: Runner, kill_at: float) -> KillTimes:
    """Spend part of the probe's budget, kill the primary at ``kill_at``, time what follows."""
    times = KillTimes()
    await runner.sleep(max(0.0, kill_at - 4.0))  # the spend, then METRICS_LAG_S
    failed_at_start = await _limiter_failures(url)
    admitted_before = await _probe_burst(url, PROBE_SPENT)
    spend_fell_back = await _fresh_limiter_failures(url) > failed_at_start
    await runner.sleep(kill_at - runner.elapsed)
    times.replicated = await asyncio.to_thread(fleet.wait_replicated)
    tat_before, ahead_before = await asyncio.to_thread(_bucket, fleet, True)
    await asyncio.to_thread(fleet.primary.kill)
    times.kill_s = runner.elapsed
    await asyncio.to_thread(fleet.wait_promotion)
    times.promotion_s = runner.elapsed
    tat_after, ahead_after = await asyncio.to_thread(_bucket, fleet, False)
    routers = asyncio.ensure_future(_first_router_call(fleet, runner))
    sentinel_url = "redis+sentinel://" + ",".join(fleet.sentinel_addrs) + f"/{fleet.master}/0"
    await _until_store_answers(sentinel_url)
    times.store_back_s = runner.elapsed
    times.router_back_s = await routers
    await asyncio.sleep(3.0)  # past the limiter's back-off: its answers come from Redis again
    failed_before_burst = await _limiter_failures(url)
    admitted_after = await _probe_burst(url, PROBE_RPM)
    burst_fell_back = await _fresh_limiter_failures(url) > failed_before_burst
    times.rate_limit = {
        "key": "probe", "rpm": PROBE_RPM, "admitted_before_kill": admitted_before,
        "bucket_ahead_s_at_kill": _r(ahead_before), "bucket_ahead_s_on_new_primary":
        _r(ahead_after), "admitted_after_failover": admitted_after,
        "admitted_if_reset": PROBE_RPM,
        "kept": tat_before is not None and tat_after == tat_before,
        # a limiter call that failed (a timeout on a loaded host) while the probe spent or
        # tested its budget: that router answered from its own share for a back-off
        "limiter_fell_back": spend_fell_back or burst_fell_back}
    return times


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


async def measure(url: str, fleet: RedisFleet, args: argparse.Namespace
                  ) -> tuple[list[Record], KillTimes]:
    spec = LoadSpec(duration_s=args.duration, concurrency=args.concurrency, ramp_s=args.ramp,
                    seed=args.seed)
    params = AgentParams(seed=args.seed, compact_tokens=args.compact_tokens)
    async with Client(url, MODEL, headers=_bearer(BENCH_KEY), identity=True) as client:
        runner = Runner(client, spec, "failover", show=not args.quiet)
        killer = asyncio.ensure_future(_kill(url, fleet, runner, args.kill_at))
        records = await runner.run(agent_driver(AgentWorkload(params), spec))
        return records, await killer


def result(records: list[Record], times: KillTimes, args: argparse.Namespace,
           wall_s: float) -> dict[str, Any]:
    from ops.bench.harness import report
    from ops.bench.harness.args import command_line

    assert times.kill_s is not None and times.promotion_s is not None
    end = max((r.start_s for r in records), default=times.kill_s)
    back = times.router_back_s
    index_s = None if back is None else back - times.promotion_s
    windows = figures.Windows.around(times.kill_s, back, end, args.baseline)
    rates = windows.rates(records)
    before = rates["before"]
    params = {"command": command_line("failover"), "redis": args.redis,
              "router_replicas": args.router_replicas, "concurrency": args.concurrency,
              "duration_s": args.duration, "kill_at_s": args.kill_at, "wall_s": round(wall_s, 1),
              "backoff_s": args.backoff,
              "windows": {k: [round(x, 2) for x in v] for k, v in asdict(windows).items()}}
    bench = report.bench_json(records, workload="agent", policy="kvroute",
                              replicas=args.replicas, params=params)
    return {**bench, "promotion_s": round(times.promotion_s - times.kill_s, 3),
            "index_store_recovery_s": _r(None if times.store_back_s is None
                                         else times.store_back_s - times.promotion_s),
            "index_recovery_s": _r(index_s), "predicted_back_s":
            _r(figures.first_prediction(records, times.promotion_s)), "hit_rate": rates,
            "predicted_rate": windows.rates(records, predicted=True),
            "hit_recovery_s": None if before is None else _r(figures.hit_recovery(
                records, times.kill_s, before, window_s=args.rolling)),
            "rate_limit_kept": times.rate_limit, "replicated_at_kill": times.replicated,
            "timeline": figures.rolling(records, args.rolling)}


def goal(res: dict[str, Any]) -> dict[str, bool]:
    """The issue's goal: no failed request, the index back <= 2 s after the promotion, the
    hit rate back within a point <= 30 s after the kill."""
    index_s, hit_s = res["index_recovery_s"], res["hit_recovery_s"]
    return {"no_errors": res["errors"] == 0,
            "index_within_2s": index_s is not None and index_s <= 2.0,
            "hit_rate_within_30s": hit_s is not None and hit_s <= 30.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", choices=["sentinel"], default="sentinel",
                   help="The Redis HA mode (only Sentinel for now).")
    p.add_argument("--concurrency", type=int, default=16, help="Agent sessions at once.")
    p.add_argument("--duration", type=float, default=90.0, help="Seconds of load.")
    p.add_argument("--kill-at", type=float, help="Seconds into the load (default: a third).")
    p.add_argument("--baseline", type=float, help="Seconds before the kill for the 'before' "
                   "hit rate (default: half of --kill-at).")
    p.add_argument("--rolling", type=float, default=10.0, help="Rolling hit-rate window, s.")
    p.add_argument("--replicas", type=int, default=2, help="Sim replicas.")
    p.add_argument("--router-replicas", type=int, default=2)
    p.add_argument("--backoff", type=float, help="index.backoff_s (default: kvroute's).")
    p.add_argument("--ramp", type=float, default=5.0, help="Start the sessions over S.")
    p.add_argument("--compact-tokens", type=int, default=20000, help="Agent history cap.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=4000, help="Sim device blocks.")
    p.add_argument("--prefill-tok-s", type=float, default=20000.0)
    p.add_argument("--tpot-s", type=float, default=0.01)
    p.add_argument("--num-cpus", type=int, default=4, help="Ray's CPUs.")
    p.add_argument("--out", type=str, help="Write the JSON here.")
    p.add_argument("--quiet", action="store_true", help="No progress bar.")


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on other options: the kill at a third of the load, the
    baseline over half of the time before it."""
    args.kill_at = args.duration / 3 if args.kill_at is None else args.kill_at
    args.baseline = args.kill_at / 2 if args.baseline is None else args.baseline
    return args


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ops.bench.harness import report
    from ops.bench.harness.procs import free_port
    from ops.bench.harness.stack import deployed, local_ray

    with_defaults(args)
    # tries: a raylet on a saturated machine can miss Ray's registration window
    with redis_fleet() as fleet, local_ray(args.num_cpus, tries=3), \
            deployed(build_config(args, fleet, free_port())) as url:
        t0 = time.monotonic()
        records, times = asyncio.run(measure(url, fleet, args))
        res = result(records, times, args, time.monotonic() - t0)
    res["goal"] = goal(res)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report.json_text(res) + "\n")
    print(markdown(res))
    return 0 if all(res["goal"].values()) else 1


def markdown(res: dict[str, Any]) -> str:
    """The result as the table docs/reliability.md shows."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def sec(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f} s"

    h, rl = res["hit_rate"], res["rate_limit_kept"] or {}
    rows = [("requests", str(res["requests"])), ("errors", str(res["errors"])),
            ("promotion (kill → new primary)", sec(res["promotion_s"])),
            ("index store answers (after promotion)", sec(res["index_store_recovery_s"])),
            ("index answers again: a router reads the new primary (after promotion)",
             sec(res["index_recovery_s"])),
            ("first predicted-cached header (after promotion)", sec(res["predicted_back_s"])),
            ("hit rate before / during / after",
             f"{pct(h['before'])} / {pct(h['during'])} / {pct(h['after'])}"),
            ("hit rate back within 1 point (after kill)", sec(res["hit_recovery_s"])),
            ("rate limit kept (probe bucket ahead at kill → on new primary; admitted after "
             f"of {rl.get('rpm')})", f"{rl.get('bucket_ahead_s_at_kill')} s → "
             f"{rl.get('bucket_ahead_s_on_new_primary')} s; "
             f"{rl.get('admitted_after_failover')}")]
    lines = ["| figure | value |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows)]
    verdict = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in res.get("goal", {}).items())
    return "\n".join(lines) + (f"\n\ngoal: {verdict}" if verdict else "")
