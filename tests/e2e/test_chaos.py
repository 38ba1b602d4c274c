"""The chaos acceptance scenario, scaled for CI: a 16-way agentic load
(`kvroute bench --workload agent --concurrency 16`) against 3 sim replicas with a
Redis index; Redis is killed at 20 s and restarted at 35 s, and a worker replica
process is SIGKILLed at 50 s. No request may fail (streams the killed replica was
generating resume on another one), the load keeps completing, the index refills
after Redis returns, and /health is 200 at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis
from pytest_redis import factories

from deploy.config import IndexConfig
from tests.stacks import counter, deployed, redis_url, report_fault, sim_model, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.load]
MODEL = "sim-chaos"
chaos_redis = factories.redis_proc(host="127.0.0.1", port=None)


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, chaos_redis: Any,
          serve_port: int) -> Iterator[dict[str, Any]]:
    url = redis_url(chaos_redis)
    model = sim_model(MODEL, tiny_model_dir, replicas=3, max_ongoing_requests=32,
                      tpot_s=0.01, prefill_tok_s=50000.0)
    with deployed(stack_config(serve_port, model, index=IndexConfig(redis_url=url))) as base:
        yield {"url": base, "redis": chaos_redis, "redis_url": url}


def _worker_pid() -> int:
    for p in psutil.process_iter(["cmdline"]):
        if any(f"ServeReplica:kvroute:{MODEL}" in part for part in p.info["cmdline"] or []):
            return p.pid
    raise AssertionError("no worker replica process found")


def _index_keys(redis_url: str) -> int:
    return sum(1 for k in redis.Redis.from_url(redis_url).scan_iter("{kvroute}:r:*"))


def test_agent_load_survives_redis_and_worker_faults(stack: dict[str, Any],
                                                     tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    bench = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "bench", "--url", stack["url"], "--model", MODEL,
         "--workload", "agent", "--concurrency", "16", "--duration", "70", "--quiet",
         "--agent", "system_tokens=1500", "--agent", "tool_result_tokens=400",
         "--agent", "tool_time_s=0.2", "--agent", "user_time_s=1.0",
         # compact well inside the sim model's 32k window (the estimate is chars / 4)
         "--agent", "compact_tokens=16000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    t0 = time.monotonic()
    try:
        time.sleep(20)
        stack["redis"].stop()
        time.sleep(15)
        stack["redis"].start()
        redis.Redis.from_url(stack["redis_url"]).flushall()  # it came back empty
        time.sleep(max(0.0, 50 - (time.monotonic() - t0)))
        os.kill(_worker_pid(), signal.SIGKILL)
        output, _ = bench.communicate(timeout=240)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert out.exists(), output[-3000:]  # the bench exits 1 when any request failed
    result = json.loads(out.read_text())
    report_fault("chaos: Redis down 20-35 s, worker SIGKILL at 50 s (worst = e2e p99)",
                 result["requests"], result["errors"],
                 counter(stack["url"], "kvroute_retries_total"), result["e2e_s"]["p99"])
    assert result["requests"] > 50
    assert result["errors"] == 0, result["params"].get("error_samples")
    assert _index_keys(stack["redis_url"]) > 0, "the index did not refill after Redis returned"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{stack['url']}/health", timeout=5).status_code == 200:
            break
        time.sleep(1)
    assert httpx.get(f"{stack['url']}/health", timeout=5).status_code == 200
