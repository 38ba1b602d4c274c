"""The CI soak: ``kvroute soak`` for 3 minutes against a real sim stack with Redis.

Real Ray Serve, two sim-engine replicas, a real redis-server index. The soak runs as
its own process (as an operator would run it), samples this stack's Ray processes
(found through the Serve port) and Redis, and must exit 0: no error at all, and no
growth over the CI bounds below. ``KVROUTE_SOAK_S`` shortens the run for local use.

CI bounds (docs/reliability.md explains them):

- RSS: 1536 MB/h summed over the stack's ~13 processes, fitted over the second half
  of the run. A fresh stack still grows while it warms up (allocator pools, imports,
  caches): ~740-780 MB/h in its first 5 minutes, 35-80 MB/h after 10. So the 3-minute
  run catches gross leaks only: at ~35 requests/s, 1.5 GB/h is ~11 KB leaked per
  request (a prompt's token list and text). The 24 h run holds the default 64 MB/h.
- File descriptors: 1000/h. Fds are flat in steady state, but pooled sockets open and
  close: a step of a few fds inside the 90 s fit window is a slope of a few hundred per
  hour. A leak of one fd per request or connection is ~100,000/h at the CI's load; the
  24 h run holds the default 20/h.
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

from deploy.config import IndexConfig, PromptCacheConfig, RouterConfig
from tests.stacks import deployed, redis_url, sim_model, stack_config

SOAK_S = float(os.environ.get("KVROUTE_SOAK_S", "180"))
# A shorter local run sits deeper in warm-up: its RSS bound widens as 180 / KVROUTE_SOAK_S.
RSS_BOUND_MB_PER_H = 1536.0 * max(1.0, 180.0 / SOAK_S)
FD_BOUND_PER_H = 1000.0
MODEL = "sim-model"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(SOAK_S + 420)]


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[dict[str, str]]:
    index = redis_url(stack_redis)
    model = sim_model(MODEL, tiny_model_dir, replicas=2, context_window=8192,
                      tpot_s=0.005, prefill_tok_s=50000.0)
    # The router's prompt cache is bounded (router.prompt_cache.max_bytes, 128 MiB by
    # default) but fills for minutes with the soak's stream of new prompts: a small bound
    # makes it full within the warm-up, so the fitted second half measures leaks, not a
    # cache filling to its bound.
    router = RouterConfig(prompt_cache=PromptCacheConfig(max_bytes=4 << 20))
    cfg = stack_config(serve_port, model, index=IndexConfig(redis_url=index), router=router)
    with deployed(cfg) as url:
        yield {"url": url, "redis_url": index}


def test_soak_has_no_errors_and_no_growth(stack: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "deploy.cli", "soak", "--url", stack["url"],
           "--duration", str(SOAK_S), "--interval", str(max(1.0, min(5.0, SOAK_S / 30))),
           "--concurrency", "8",
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
