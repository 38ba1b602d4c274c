"""Redis behind Sentinel: a real primary, a replica and three Sentinels on loopback; the
primary is killed and the index carries on against the promoted replica
(``cache_service.redis_conn``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from cache_service import BlockStored, RedisPrefixIndex
from cache_service.redis_conn import async_client, sync_client
from tests.cache_service.conftest import RedisServer, unique_settings, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="session")
MASTER = "kvroute"


@dataclass
class Fleet:
    primary: RedisServer
    replica: RedisServer
    sentinels: list[RedisServer]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"


def _sentinel_conf(path: Path, primary_port: int) -> Path:
    path.write_text(  # fast detection: the failover takes about two seconds here
        f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER} 500\n"
        f"sentinel failover-timeout {MASTER} 5000\n"
        f"sentinel parallel-syncs {MASTER} 1\n")
    return path


@pytest_asyncio.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    primary = RedisServer(tmp_path / "primary")
    await primary.start()
    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1", str(primary.port))
    await replica.start()
    sentinels = []
    for i in range(3):
        conf = _sentinel_conf(tmp_path / f"sentinel{i}.conf", primary.port)
        sentinels.append(RedisServer(tmp_path / f"s{i}", str(conf), "--sentinel"))
        await sentinels[-1].start()
    yield Fleet(primary, replica, sentinels)
    for server in (primary, replica, *sentinels):
        await server.kill()


async def _replicated(primary_port: int) -> None:
    client = aioredis.Redis(port=primary_port)
    try:
        assert await client.execute_command("WAIT", 1, 5000) == 1  # the replica has it all
    finally:
        await client.aclose()


async def test_the_index_answers_again_from_the_promoted_replica(fleet: Fleet) -> None:
    settings = unique_settings()
    index = RedisPrefixIndex(fleet.url, settings, timeout_s=0.5)
    try:
        await wait_until(lambda: _answers(index), within_s=15)
        await index.apply_events([BlockStored("m", "r0", (1, 2, 3))])
        assert (await index.lookup({"m": [1, 2, 3]}))["m"] == {"r0": 3}
        await _replicated(fleet.primary.port)
        await fleet.primary.kill()
        # Until a Sentinel promotes the replica, calls fail fast (ResilientIndex degrades to
        # local answers meanwhile); then the same client reaches the new primary, whose
        # script cache is empty (the scripts reload on NOSCRIPT).
        await wait_until(lambda: _answers(index), within_s=30, interval=0.2)
        assert (await index.lookup({"m": [1, 2, 3]}))["m"] == {"r0": 3}
        await index.apply_events([BlockStored("m", "r1", (1, 2, 3, 4))])
        assert (await index.lookup({"m": [1, 2, 3, 4]}))["m"] == {"r0": 3, "r1": 4}
        assert await _role(fleet.replica.port) == "master"
    finally:
        await index.close()


async def _answers(index: RedisPrefixIndex) -> bool:
    try:
        await index.lookup({"m": [1]})
        return True
    except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ResponseError, OSError):
        return False


async def _role(port: int) -> str:
    client = aioredis.Redis(port=port, decode_responses=True)
    try:
        return str((await client.execute_command("ROLE"))[0])
    finally:
        await client.aclose()


async def test_the_blocking_client_follows_the_failover_too(fleet: Fleet) -> None:
    client = sync_client(fleet.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    probe = async_client(fleet.url, socket_timeout=0.5)
    try:
        await wait_until(lambda: _pings(probe), within_s=15)
        await asyncio.to_thread(client.set, "k", "v")
        await _replicated(fleet.primary.port)
        await fleet.primary.kill()
        await wait_until(lambda: _pings(probe), within_s=30, interval=0.2)
        assert await asyncio.to_thread(client.get, "k") == b"v"
    finally:
        client.close()
        await probe.aclose()


async def _pings(client: aioredis.Redis) -> bool:
    try:
        return bool(await client.set("probe", "1"))
    except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ResponseError, OSError):
        return False
