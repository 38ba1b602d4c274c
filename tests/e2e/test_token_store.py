"""The prompt cache's Redis level end to end: real Serve, two router replicas, a real
redis-server as ``index.redis_url``. A long growing session's turns spread over both
routers (Serve's proxy does not pin sessions); every turn's prompt is the tokens that full
tokenization gives (the sim reports how many it got), and the routers leave the session's
segments in Redis under the index's namespace, with a TTL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.config import IndexConfig, PromptCacheConfig, RouterConfig
from router.prompt.cache import PromptCacheConfig as NoCache
from router.prompt.tokenizer import ChatTokenizer
from tests.stacks import deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-tokstore"
NS = f"e2etok{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    cfg = stack_config(
        serve_port, sim_model(MODEL, tiny_model_dir, tpot_s=0.001, prefill_tok_s=1e6,
                              context_window=131072),
        index=IndexConfig(redis_url=redis_url(stack_redis), namespace=NS, timeout_s=0.5),
        router=RouterConfig(replicas=2, prompt_cache=PromptCacheConfig(redis_ttl_s=120)),
    )
    with deployed(cfg) as url:
        yield url


def test_session_turns_over_two_routers(stack: str, tiny_model_dir: Path,
                                         stack_redis: Any) -> None:
    ref = ChatTokenizer(str(tiny_model_dir), NoCache(enabled=False))
    chat: list[dict[str, Any]] = [{"role": "system", "content": "rules " * 3000}]
    routers = set()
    for t in range(8):
        chat = [*chat, {"role": "user", "content": f"turn {t}: " + "words and more " * 400}]
        r = httpx.post(f"{stack}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": chat, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ref.encode_full(ref.render(chat)))
        routers.add(r.headers.get("x-kvroute-router"))
        chat = [*chat, {"role": "assistant", "content": r.json()["choices"][0]["message"][
            "content"] or "ok"}]
    client = redis.Redis.from_url(redis_url(stack_redis))
    keys = list(client.scan_iter(f"{{{NS}}}:tok:*"))
    assert keys
    assert all(0 < client.pttl(k) <= 120_000 for k in keys)
    print(f"turns served by routers {sorted(map(str, routers))}; {len(keys)} token entries")
