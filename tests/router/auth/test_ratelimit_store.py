"""The rate-limit state can live in its own Redis
(``auth.rate_limit_store``), one that does not evict. Real redis-servers: the index's, set to
evict (``volatile-lru`` and a small ``maxmemory``, as the reference manifests run it), and
the limiter's own, ``noeviction``. Index growth that evicts the shared store's limit keys
hands a key its whole budget again; the separate store keeps it. A limiter store that is
down degrades to per-replica limits, as the limiter always did: requests are still served."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis
from pytest_redis import factories
from pytest_redis.executor import RedisExecutor

from deploy.config import IndexConfig, KvrouteConfig
from deploy.config.auth import ApiKeyConfig, AuthConfig, RateLimitStoreConfig
from router.core import RouterCore
from router.errors import ApiError
from tests.conftest import free_port
from tests.stacks import redis_url, sim_model

index_redis = factories.redis_proc(host="127.0.0.1", port=None)
limits_redis = factories.redis_proc(host="127.0.0.1", port=None)
RPM = 3
KEY = ApiKeyConfig(name="alice", key_sha256="ab" * 32, requests_per_min=RPM)


@asynccontextmanager
async def core_with(tiny_model_dir: Path, index_url: str,
                    store: RateLimitStoreConfig) -> AsyncIterator[RouterCore]:
    ns = f"t{uuid.uuid4().hex[:8]}"
    cfg = KvrouteConfig(models=[sim_model("m", tiny_model_dir)],
                        # a generous Redis timeout: these tests check where the limits live,
                        # not how fast; 50 ms calls time out on a loaded machine
                        index=IndexConfig(redis_url=index_url, namespace=ns, timeout_s=2.0),
                        auth=AuthConfig(api_keys=[KEY], rate_limit_store=store))
    core = RouterCore(cfg, {})
    try:
        yield core
    finally:
        await core.close()


async def admitted(core: RouterCore, n: int) -> int:
    ok = 0
    for _ in range(n):
        try:
            await core.limiter.admit(KEY, 0)
            ok += 1
        except ApiError as e:
            assert e.status == 429
    return ok


def evict_under_index_growth(proc: RedisExecutor) -> None:
    """What index growth does to an evicting Redis: fill it several times over."""
    client = redis.Redis(proc.host, proc.port)
    client.config_set("maxmemory", str(2 << 20))
    client.config_set("maxmemory-policy", "volatile-lru")
    pipe = client.pipeline(transaction=False)
    for i in range(12_000):
        pipe.set(f"{{kvroute}}:filler:{i}", b"x" * 1000, px=600_000)
    pipe.execute()


@pytest.mark.parametrize("own_store", [False, True], ids=["shared-with-index", "own-store"])
async def test_limits_survive_index_eviction_only_in_their_own_store(
        tiny_model_dir: Path, index_redis: RedisExecutor, limits_redis: RedisExecutor,
        own_store: bool, caplog: pytest.LogCaptureFixture) -> None:
    store = RateLimitStoreConfig(redis_url=redis_url(limits_redis) if own_store else None)
    redis.Redis(limits_redis.host, limits_redis.port).config_set("maxmemory-policy",
                                                                 "noeviction")
    with caplog.at_level(logging.WARNING, "router.auth.ratelimit"):
        async with core_with(tiny_model_dir, redis_url(index_redis), store) as core:
            assert core.limiter.shared
            assert await admitted(core, RPM + 1) == RPM  # the 4th is refused
            evict_under_index_growth(index_redis)
            again = await admitted(core, RPM)
    # Shared: the index's growth evicted the key's state, a full budget again (the bug).
    assert again == (0 if own_store else RPM)
    assert ("share the index's Redis" in caplog.text) is not own_store
    redis.Redis(index_redis.host, index_redis.port).flushall()


async def test_a_limiter_store_that_is_down_still_serves(
        tiny_model_dir: Path, index_redis: RedisExecutor) -> None:
    down = RateLimitStoreConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    async with core_with(tiny_model_dir, redis_url(index_redis), down) as core:
        assert await admitted(core, RPM + 1) == RPM  # served, limited per router replica
        assert not core.limiter.shared


def test_the_store_url_comes_from_one_place() -> None:
    with pytest.raises(ValueError, match="not both"):
        RateLimitStoreConfig(redis_url="redis://a", redis_url_env="X")
    with pytest.raises(ValueError, match="KVROUTE_TEST_NO_SUCH_VAR"):
        RateLimitStoreConfig(redis_url_env="KVROUTE_TEST_NO_SUCH_VAR").url({})
    assert RateLimitStoreConfig(redis_url_env="V").url({"V": "redis://x:1/0"}) == \
        "redis://x:1/0"
    with pytest.raises(ValueError):
        RateLimitStoreConfig.model_validate({"redis_url": "redis://a", "db": 2})
