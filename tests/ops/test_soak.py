"""The CI soak: ``kvroute soak`` for 3 minutes against a real sim stack with Redis.

Real Ray Serve, two sim-engine replicas, a real redis-server index. The soak runs as
its own process (as an operator would run it), samples this stack's Ray processes
(found through the Serve port) and Redis, and must exit 0: no error at all, and no
growth over the CI bounds below. ``KVROUTE_SOAK_S`` shortens the run for local use.

CI bounds (docs/reliability.md explains them):

- RSS: 512 MB/h summed over the stack's ~13 processes, fitted over the second half
  of the run (after 90 s of warm-up). A fresh stack still grows while it warms up
  (allocator pools, imports, caches: ~100-300 MB/h at minutes 2-3, decaying to ~40
  MB/h by minute 10), so the 3-minute run can only catch gross leaks: at ~25
  requests/s, 512 MB/h is ~6 KB leaked per request, less than one leaked prompt.
  The 24 h run holds the default 64 MB/h.
- File descriptors: 20/h (the default): fds are flat in steady state.
- Errors: none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.config import IndexConfig, KvrouteConfig, ModelConfig, ServerConfig

SOAK_S = float(os.environ.get("KVROUTE_SOAK_S", "180"))
RSS_BOUND_MB_PER_H = 512.0
FD_BOUND_PER_H = 20.0
MODEL = "sim-model"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(SOAK_S + 420)]


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[dict[str, str]]:
    from ray import serve

    from deploy import runtime

    redis_url = f"redis://{stack_redis.host}:{stack_redis.port}/0"
    cfg = KvrouteConfig(
        models=[ModelConfig(name=MODEL, engine="sim", model_path=str(tiny_model_dir),
                            num_replicas=2, num_cpus=0.1, context_window=8192,
                            engine_kwargs={"tpot_s": 0.005, "prefill_tok_s": 50000.0})],
        index=IndexConfig(redis_url=redis_url),
        server=ServerConfig(host="127.0.0.1", port=serve_port),
    )
    base = runtime.deploy(cfg)
    runtime.wait_healthy(base, timeout_s=120)
    yield {"url": base, "redis_url": redis_url}
    serve.delete(runtime.APP_NAME)


def test_soak_has_no_errors_and_no_growth(stack: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "ops.soak", "--url", stack["url"], "--duration", str(SOAK_S),
           "--interval", str(max(1.0, min(5.0, SOAK_S / 30))), "--concurrency", "8",
           "--redis-url", stack["redis_url"], "--out", str(out),
           "--max-rss-growth-mb-per-h", str(RSS_BOUND_MB_PER_H),
           "--max-fd-growth-per-h", str(FD_BOUND_PER_H), "--max-error-rate", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=SOAK_S + 300, check=False)
    print(proc.stdout, proc.stderr[-3000:], sep="\n")  # the figures, in the test's output
    report = json.loads(out.read_text())
    assert proc.returncode == 0, report["violations"] or proc.stderr[-2000:]
    assert report["errors"] == 0 and report["requests"] > 0
    kinds = set(report["requests_by_kind"])
    assert {"chat", "chat-stream", "completions", "messages", "messages-stream",
            "count_tokens"} <= kinds, kinds
    last = report["samples"][-1]
    assert last["procs"] >= 5, last["per_process"]  # raylet, proxy, router, 2 replicas, ...
    assert any("ServeReplica" in name for name in last["per_process"]), last["per_process"]
    assert "redis_mb" in last, last
    assert {"rss_mb", "fds", "redis_mb", "p50_ms"} <= set(report["growth"]), report["growth"]
