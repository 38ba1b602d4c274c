"""``kvroute bench compare --router-replicas 1,2,4``: routers scaled out, same workload.

For each count N, the worker replicas are deployed afresh and the workload runs through:

* ``kvroute`` with N router replicas behind Serve's proxy, sharing one prefix index in a
  throwaway redis-server (``index.redis_url``; workers publish their events to it);
* ``smg`` (cache_aware), ``vllm-router`` (kv_aware, every instance subscribed to every
  replica's KV events) and ``dynamo`` (kv; N namespaces, each a frontend with its own shims,
  so N routers each fed every replica's events, with no replica sync): N instances, each
  with its own state, behind a plain round-robin front (``children.rr_front``), as a fleet
  of gateways behind a load balancer.

Router CPU per request counts the routers' processes (kvroute: Serve's proxy and the N
router replicas; a peer: its N instances), not the peers' front. The result, per N, is
``{"kvroute": bench, "smg": bench, "vllm-router": bench}`` (bench compare's per-router
fields), under ``router_replicas`` in the JSON, plus each router's cached-ratio drop
from the smallest N to the largest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ops.bench.compare import bench as compare
from ops.bench.harness import lineup
from ops.bench.harness.client import Record
from ops.bench.harness.config import build
from ops.bench.harness.procs import Subprocess, free_port, redis_server

if TYPE_CHECKING:
    from deploy.config import KvrouteConfig

SCALED = ("kvroute", "smg", "vllm-router", "dynamo")


def scaled_config(spec: compare.CompareSpec, model_path: str, port: int, n: int,
                  redis_url: str) -> KvrouteConfig:
    """bench compare's stack with N router replicas sharing one Redis prefix index."""
    return build(dataclasses.replace(
        compare.stack_spec(spec, model_path, port), redis_url=redis_url,
        index_namespace=f"kvroute-bench-r{n}", router_replicas=n))


@contextlib.asynccontextmanager
async def fleet(name: str, n: int, info: list[tuple[str, str | None]],
                spec: compare.CompareSpec, model_path: str, headers: dict[str, str]
                ) -> AsyncIterator[tuple[str, list[Subprocess], dict[str, Any]]]:
    """N instances of a peer behind a round-robin front: (front URL, instances, flags)."""
    procs: list[Subprocess] = []
    flags: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        for i in range(n):
            proc, flags = compare.launch(name, info, spec, model_path, headers)
            proc.name = f"{name}-{i}"
            procs.append(await stack.enter_async_context(proc))
        port = free_port()
        front = Subprocess(f"rr-front-{name}", [
            sys.executable, "-m", "ops.bench.compare.children.rr_front", str(port),
            *(p.base_url for p in procs)], f"http://127.0.0.1:{port}/v1/models")
        await stack.enter_async_context(front)
        yield front.base_url, procs, flags


async def one_count(spec: compare.CompareSpec, url: str, model_path: str, n: int,
                    show: bool) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    info = await compare.replica_info(url, spec.replicas)
    direct, headers = info[0][0], await compare.direct_headers(url)
    benches: dict[str, Any] = {}
    records: dict[str, list[Record]] = {}
    for name in spec.routers:
        await asyncio.sleep(spec.pause_s)
        run = f"{name}@{n}"
        if name == "kvroute":
            records[run], benches[name] = await compare.measured(
                run, url, direct, lineup.kvroute_processes(), spec, show, headers)
            benches[name]["params"]["router_replicas"] = n
            continue
        async with fleet(name, n, info, spec, model_path, headers) as (front, procs, flags):
            roots = [p for proc in procs for p in proc.processes()]
            records[run], benches[name] = await compare.measured(
                run, front, direct, roots, spec, show, headers)
        benches[name]["params"].update(router_flags=flags, router_replicas=n,
                                       router_cmd=procs[0].cmd[1:])
    return benches, records


def drops(by_count: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Per router: cached ratio at the smallest count minus at the largest, in points."""
    counts = sorted(by_count, key=int)
    lo, hi = by_count[counts[0]], by_count[counts[-1]]
    return {name: 100 * (lo[name]["cached_token_ratio"] - hi[name]["cached_token_ratio"])
            for name in lo if name in hi}


def run_scaling(spec: compare.CompareSpec, counts: tuple[int, ...], show: bool = True
                ) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    """Deploy per count on the running Ray, run every router of ``spec.routers`` (a subset
    of ``SCALED``), clean up. Returns the JSON part and the records ("name@N")."""
    from ops.bench.harness.stack import deployed
    from ops.models.tiny_model import ensure_model

    unknown = set(spec.routers) - set(SCALED)
    if unknown:
        raise ValueError(f"router replicas: only {', '.join(SCALED)}; not {sorted(unknown)}")
    model_path = spec.model_path or str(ensure_model())
    by_count: dict[str, dict[str, Any]] = {}
    records: dict[str, list[Record]] = {}
    port = spec.port or free_port()  # Serve keeps its first proxy port: one for all counts
    with redis_server() as redis_url:
        for n in counts:
            with deployed(scaled_config(spec, model_path, port, n, redis_url)) as url:
                by_count[str(n)], recs = asyncio.run(one_count(spec, url, model_path, n, show))
            records.update(recs)
    return {"router_replicas": by_count, "cached_ratio_drop_points": drops(by_count)}, records
