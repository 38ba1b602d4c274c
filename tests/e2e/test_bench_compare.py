"""``kvroute bench compare`` end to end, for a few seconds: two sim replicas with their
direct endpoints (and vLLM-format KV events), kvroute's router, sglang-router twice
(round_robin, cache_aware), smg (cache_aware), vllm-router (kv_aware, cache_aware) and
Dynamo's KV router (in its network namespace, a shim per replica). The peers' venvs are
installed on first use (~40 s each on a fresh machine, Dynamo ~90 s, then cached).

No performance assertions (a few seconds prove nothing): every router serves the
workload without errors, the JSON has the contract's shape, the overheads, CPU and idle
latencies are measured, and every peer process is gone at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ops.bench.compare import bench as compare
from ops.bench.compare.dynamo_peer import DynamoRun
from ops.bench.harness import report
from ops.bench.harness.client import LoadSpec
from ops.bench.harness.workloads import AgentParams

pytestmark = [pytest.mark.slow, pytest.mark.load]

SMALL = AgentParams(system_tokens=400, tools=4, subagent_system_tokens=100, repo_tokens=300,
                    tool_result_tokens=200, reply_tokens=8, final_tokens=16, tool_time_s=0.05,
                    user_time_s=0.1, turns_mean=3)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[compare.Subprocess]]:
    """Records every peer router process the compare starts."""
    procs: list[compare.Subprocess] = []
    real = compare.launch

    def recording(*args: Any) -> tuple[compare.Subprocess, dict[str, Any]]:
        proc, flags = real(*args)
        procs.append(proc)
        return proc, flags

    monkeypatch.setattr(compare, "launch", recording)
    yield procs
    for p in procs:  # whatever happened, nothing of ours keeps running
        p.stop()


def test_short_compare_on_sim(ray_local: None, serve_port: int, tiny_model_dir: Path,
                              started: list[compare.Subprocess],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ray import serve

    from deploy.serve import runtime

    spec = compare.CompareSpec(
        engine="sim", replicas=2, agent=SMALL, model_path=str(tiny_model_dir), port=serve_port,
        load=LoadSpec(duration_s=4.0, concurrency=2, ramp_s=0.5, drain_timeout_s=60),
        sim={"prefill_tok_s": 50000.0, "tpot_s": 0.005, "tpot_per_batch_s": 0.0,
             "kv_blocks": 1000},
        overhead_samples=10, pause_s=0.2, idle_samples=3, routers=compare.ROUTERS,
    )
    bare: list[httpx.Response] = []
    real_info = compare.replica_info

    async def info_and_a_bare_call(url: str, n: int) -> list[tuple[str, str | None]]:
        found = await real_info(url, n)
        body = {"model": compare.MODEL, "prompt": [100, 101], "max_tokens": 1}
        async with httpx.AsyncClient(timeout=30) as c:
            bare.append(await c.post(f"{found[0][0]}/v1/completions", json=body))
        return found

    monkeypatch.setattr(compare, "replica_info", info_and_a_bare_call)
    try:
        result, records = compare.run_compare(spec, show=False)
    finally:
        serve.delete(runtime.APP_NAME)
    # The builder's token guards the direct endpoints; the compare
    # (sglang-router included) got through with it, a call without it does not.
    assert bare[0].status_code == 401 and bare[0].json()["error"]["code"] == "invalid_api_key"
    assert set(result["routers"]) == {"kvroute", "round-robin", "sglang-router", "smg",
                                      "vllm-router", "vllm-router-cache-aware", "dynamo"}
    for name, bench in result["routers"].items():
        check_router(name, bench, records[name])
    flags = result["routers"]["vllm-router"]["params"]
    assert flags["router_flags"]["--policy"] == "kv_aware"
    assert flags["router_cmd"].count("--kv-event-source") == 2  # both replicas' events
    assert any("ServeReplica:kvroute:kvroute-router" in k
               for k in result["routers"]["kvroute"]["cpu_s_by_process"])
    assert len(result["routers"]["round-robin"]["per_replica_requests"]) == 2
    assert result["routers"]["kvroute"]["ttft_tail"]["queue_wait_s"] >= 0  # replica known
    assert len(result["endpoints"]) == 2
    for key in ("router_overhead_s", "serve_proxy_overhead_s"):
        assert set(result[key]) == {"p50", "p99"}
    assert result["latency_s"]["direct"]["p50"] > 0
    assert result["goals"]["zero_errors"] and result["goals"]["all_served"]
    check_dynamo(result["routers"]["dynamo"], started)
    assert len(started) == 6
    assert all(p.proc is not None and p.proc.poll() is not None for p in started)
    assert "| kvroute |" in report.markdown_compare(result)


def check_router(name: str, bench: dict[str, Any], records: list[Any]) -> None:
    """One router's run: a valid bench record, every request served, its CPU measured."""
    report.validate(bench)
    assert bench["policy"] == name and bench["workload"] == "agent"
    assert bench["requests"] > 0 and bench["errors"] == 0, (name, bench["params"])
    assert bench["params"]["salt"] == name
    assert all(r.ok for r in records)
    assert bench["cpu_s_per_request"] > 0 and bench["cpu_s_by_process"], name
    assert bench["replica_cpu_s_per_request"] > 0, name
    assert set(bench["added_latency_s"]) >= {"p50", "p99", "router_p50", "direct_p50"}
    assert len(bench["per_request"]["rows"]) == bench["requests"]  # ops.bench.harness.tail
    if name not in ("kvroute", "dynamo"):
        assert bench["params"]["router_flags"]["--policy"], name


def check_dynamo(bench: dict[str, Any], started: list[compare.Subprocess]) -> None:
    """Dynamo routed on the replicas' events, its figures came from the replicas, and every
    process of its namespace (frontend, shims, relay) and the host relay are gone."""
    assert bench["params"]["router_flags"]["--router-mode"] == "kv"
    assert bench["params"]["router_flags"]["--kv-cache-block-size"] == 16
    # hit% is the replicas' own count passed through Dynamo: 0 would mean it was lost
    assert bench["cached_token_ratio"] > 0
    per_replica = bench["per_replica_requests"]
    assert len(per_replica) == 2 and sum(per_replica.values()) >= bench["requests"]
    assert sorted(k.split(" ", 1)[1] for k in bench["cpu_s_by_process"]) == [
        "dynamo.frontend", "dynamo_shim.py", "dynamo_shim.py"]
    assert bench["bridge_cpu_s_per_request"] > 0
    assert 0 < bench["router_predicted_hit_rate"] <= 1  # it routed on the replicas' events
    assert bench["router_kv_events_applied"].get("stored/ok", 0) > 0
    (dyn,) = [p for p in started if isinstance(p, DynamoRun)]
    assert len(dyn.pids) == 5  # frontend, two shims, the relays in and out of the namespace
    assert not [pid for pid in dyn.pids if psutil.pid_exists(pid)]
    assert not dyn.dir.exists()
