"""Each key's share of the shared token store is bounded and visible (a real
redis-server): ``router.prompt_cache.redis_bytes_per_key``, counted in quarter-TTL
counters, reported in ``kvroute_key_redis_*``. Before, a key could write what it liked
for an hour (the review: +90 MiB from ten refused requests; an admitted key without a
token limit, without bound)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from deploy.config import PromptCacheConfig
from router import metrics, telemetry
from router.prompt import store as ts
from router.prompt.setup import TokenCache
from router.prompt.tokenizer import ChatTokenizer
from tests.router.prompt.test_token_store import NS, tok_redis, url

__all__ = ["tok_redis", "url"]  # the fixtures this module uses
BOUND = 300_000


def _replica(model: Path, url: str, bound: int) -> ChatTokenizer:
    store = ts.TokenStore(url, NS, ttl_s=600, key_bytes=bound,
                          on_share=telemetry.redis_share("tokens", names_in_metrics=True))
    return ChatTokenizer(str(model), TokenCache(PromptCacheConfig(), store))


def _prompt(n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"conversation {n} " + "plain words here " * 1500},
            {"role": "user", "content": "go"}]


def _entries_bytes(url: str) -> int:
    r = redis.Redis.from_url(url)
    return sum(r.memory_usage(k) or 0 for k in r.scan_iter(f"{{{NS}}}:tok:*"))


def _sample(name: str, key: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, {"key": key, "store": "tokens"}) or 0.0


def test_one_key_cannot_fill_the_token_store(tiny_model_dir: Path, url: str) -> None:
    tok = _replica(tiny_model_dir, url, BOUND)
    store = tok.prompt_cache.store
    assert store is not None
    refused = _sample("kvroute_key_redis_refused_bytes_total", "bob")
    for n in range(20):  # ~55 kB each: 1.1 MB in all
        tok.commit(tok.render_encode(_prompt(n)), "bob")
    store.flush()
    bob = _entries_bytes(url)
    share = _sample("kvroute_key_redis_share_bytes", "bob")
    print(f"\nbob's 20 prompts: {bob} bytes of entries in Redis, share {share:.0f} "
          f"(bound {BOUND}), {store.counts['over_share']} writes refused")
    assert 0 < share <= BOUND and store.counts["over_share"] > 0
    assert bob <= 2 * BOUND  # Redis's own overhead per key on top of the packed bytes
    assert _sample("kvroute_key_redis_refused_bytes_total", "bob") > refused
    # another key still writes; the ids stay exact whatever was refused
    ids = tok.render_encode(_prompt(99))
    tok.commit(ids, "alice")
    store.flush()
    assert _sample("kvroute_key_redis_share_bytes", "alice") > 0
    assert _entries_bytes(url) > bob
    assert tok.render_encode(_prompt(3)) == tok.render_encode_full(_prompt(3))


def test_no_bound_writes_everything(tiny_model_dir: Path, url: str) -> None:
    """The control (``redis_bytes_per_key: 0``, the code before): the same prompts all
    reach Redis."""
    tok = _replica(tiny_model_dir, url, 0)
    for n in range(20):
        tok.commit(tok.render_encode(_prompt(n)), "bob")
    assert tok.prompt_cache.store is not None
    tok.prompt_cache.store.flush()
    print(f"\nunbounded: {_entries_bytes(url)} bytes of entries")
    assert _entries_bytes(url) > 4 * BOUND
