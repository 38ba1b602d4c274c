"""Fixtures for the cache_service tests: a real /usr/bin/redis-server (pytest-redis) and
helpers for a killable/restartable server of our own."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import port_for
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from pytest_redis import factories
from pytest_redis.executor import RedisExecutor

from cache_service import IndexSettings, MemoryPrefixIndex, PrefixIndex, RedisPrefixIndex

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"

# port=None: any free port; host defaults to 127.0.0.1 (pytest-redis' redis_host ini).
redis_proc = factories.redis_proc(executable=REDIS_SERVER, port=None, host="127.0.0.1")


@pytest.fixture(scope="session")
def redis_url(redis_proc: RedisExecutor) -> str:
    return f"redis://{redis_proc.host}:{redis_proc.port}/0"


@pytest_asyncio.fixture
async def raw_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def unique_settings(**overrides: Any) -> IndexSettings:
    """Settings in a fresh namespace, so tests sharing one redis-server never interact."""
    return IndexSettings(namespace=f"t{uuid.uuid4().hex[:10]}", **overrides)


@pytest.fixture
def settings_for() -> Callable[..., IndexSettings]:
    return unique_settings


IndexFactory = Callable[[IndexSettings], PrefixIndex]


@pytest_asyncio.fixture(params=["memory", "redis"])
async def new_index(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[IndexFactory]:
    """Builds an index of the parametrized backend; closes them all at teardown."""
    created: list[PrefixIndex] = []

    def factory(settings: IndexSettings) -> PrefixIndex:
        index: PrefixIndex
        if request.param == "memory":
            index = MemoryPrefixIndex(settings)
        else:
            index = RedisPrefixIndex(redis_url, settings, timeout_s=1.0)
        created.append(index)
        return index

    yield factory
    for index in created:
        await index.close()


class RedisServer:
    """A redis-server subprocess we can SIGKILL and restart on the same port."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = port_for.select_random()
        self.workdir = workdir
        self.extra = extra  # more redis-server arguments (replicaof, a Sentinel's config)
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            REDIS_SERVER, *self.extra,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(self.workdir)),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await wait_until(self._pings, within_s=10.0)

    async def _pings(self) -> bool:
        client = aioredis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            return bool(await client.ping())
        except (aioredis.ConnectionError, OSError):
            return False
        finally:
            await client.aclose()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.proc = None


@pytest.fixture
def wait_for() -> Callable[..., Awaitable[None]]:
    return wait_until


@pytest_asyncio.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path)
    await server.start()
    yield server
    with contextlib.suppress(ProcessLookupError):
        await server.kill()


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], within_s: float = 5.0, interval: float = 0.05
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)
