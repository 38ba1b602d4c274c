"""Rate limits: GCRA arithmetic (fake clock), then against real redis-servers: two limiters
(two router replicas, each with its own connection pool) share one budget exactly, Redis
AUTH and TLS, and the local fallback when Redis dies or hangs."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_redis import factories
from pytest_redis.executor import RedisExecutor
from redis.crc import key_slot

from router.auth.keys import ApiKeyConfig
from router.auth.ratelimit import LocalGcra, RateLimiter, _redact
from router.errors import ApiError
from tests.conftest import free_port

rl_redis = factories.redis_proc(host="127.0.0.1", port=None)
RL_PASSWORD = "rl-redis-pw-7c1e"
rl_redis_auth = factories.redis_proc(host="127.0.0.1", port=None, password=RL_PASSWORD)
SECRET_HASH = "5e" * 32


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def key(rpm: int | None = None, tpm: int | None = None, name: str = "alice") -> ApiKeyConfig:
    return ApiKeyConfig(name=name, key_sha256=SECRET_HASH, requests_per_min=rpm,
                        tokens_per_min=tpm)


async def admitted(rl: RateLimiter, k: ApiKeyConfig, tokens: int = 0) -> bool:
    try:
        await rl.admit(k, tokens)
    except ApiError as e:
        assert e.status == 429
        return False
    return True


# ---- GCRA arithmetic, local ------------------------------------------------------------


def test_gcra_burst_then_steady_rate() -> None:
    clock = Clock()
    g = LocalGcra(clock=clock)
    assert [g.check("a", 10, 0, 0) for _ in range(10)] == [(0.0, 0)] * 10  # burst of L
    assert g.check("a", 10, 0, 0) == (6.0, 1)  # refused: wait one interval (60 s / 10)
    assert g.check("a", 10, 0, 0) == (6.0, 1)  # ... and refusing charged nothing
    clock.t += 5.5
    assert g.check("a", 10, 0, 0) == pytest.approx((0.5, 1))
    clock.t += 0.5
    assert g.check("a", 10, 0, 0) == (0.0, 0)  # one interval later: one more
    assert g.check("a", 10, 0, 0)[1] == 1
    clock.t += 60
    assert sum(g.check("a", 10, 0, 0) == (0.0, 0) for _ in range(11)) == 10  # full again
    assert g.check("b", 10, 0, 0) == (0.0, 0)  # keys are independent


def test_gcra_intervals_round_down_so_a_burst_of_l_fits() -> None:
    g = LocalGcra(clock=Clock())
    assert sum(g.check("a", 7, 0, 0) == (0.0, 0) for _ in range(8)) == 7
    assert sum(g.check("b", 0, 997, 1) == (0.0, 0) for _ in range(1000)) == 997


def test_gcra_tokens_and_both_limits() -> None:
    clock = Clock()
    g = LocalGcra(clock=clock)
    assert g.check("a", 10, 1000, 600) == (0.0, 0)
    assert g.check("a", 10, 1000, 400) == (0.0, 0)
    assert g.check("a", 10, 1000, 1) == pytest.approx((0.06, 2))  # 1 token = 60 ms
    for _ in range(8):  # the refused requests were not counted against the request limit
        assert g.check("a", 10, 1000, 0) == (0.0, 0)
    wait, which = g.check("a", 10, 1000, 1)
    assert which == 3 and wait == pytest.approx(6.0)  # both exhausted: the longer wait


def test_gcra_charge_and_refund() -> None:
    clock = Clock()
    g = LocalGcra(clock=clock)
    for _ in range(5):
        g.charge("a", 2, 0, 0)  # mirrors never fail but cap at a full bucket
    assert g.check("a", 2, 0, 0) == (30.0, 1)
    assert g.check("t", 0, 100, 100) == (0.0, 0)
    g.refund("t", 100, 40)
    assert g.check("t", 0, 100, 40) == (0.0, 0)
    assert g.check("t", 0, 100, 1)[1] == 2
    g.refund("t", 100, 10_000)  # refunds never go beyond a full bucket
    assert g.check("t", 0, 100, 100) == (0.0, 0)
    assert g.check("t", 0, 100, 1)[1] == 2


async def test_limiter_without_redis_raises_429_with_retry_after() -> None:
    clock = Clock()
    rl = RateLimiter.from_url(None, clock=clock)
    assert not rl.shared
    k = key(rpm=2)
    await rl.admit(k, 10**9)  # no token limit: tokens are not counted
    await rl.admit(k, 0)
    with pytest.raises(ApiError) as e:
        await rl.admit(k, 0)
    err = e.value
    assert (err.status, err.code, err.retry_after_s) == (429, "rate_limit_exceeded", 30.0)
    assert "'alice'" in err.message and "2 requests" in err.message
    assert SECRET_HASH not in err.message
    for _ in range(100):
        await rl.admit(key(), 10**6)  # a key without limits costs nothing
    await rl.close()


async def test_request_larger_than_the_token_budget() -> None:
    rl = RateLimiter(None, clock=Clock())
    with pytest.raises(ApiError) as e:
        await rl.admit(key(tpm=1000), 1001)
    assert (e.value.status, e.value.code, e.value.param) == (
        429, "request_exceeds_rate_limit", "max_tokens")
    assert e.value.retry_after_s is None  # waiting would not help
    await rl.admit(key(tpm=1000), 1000)  # nothing was charged by the refusal


# ---- Redis: shared by two router replicas -----------------------------------------------


def _url(proc: RedisExecutor, password: str | None = None) -> str:
    auth = f":{password}@" if password else ""
    return f"redis://{auth}{proc.host}:{proc.port}/0"


@asynccontextmanager
async def replicas(url: str, n: int = 2, **kw: object) -> AsyncIterator[list[RateLimiter]]:
    """``n`` independent limiters (own clients) in a fresh namespace. A generous timeout by
    default (this box may be loaded); the failure tests set the production 50 ms."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    kw.setdefault("timeout_s", 0.5)
    rls = [RateLimiter.from_url(url, ns, **kw) for _ in range(n)]  # type: ignore[arg-type]
    try:
        yield rls
    finally:
        for rl in rls:
            await rl.close()


async def test_two_replicas_share_the_request_budget_exactly(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis)) as (a, b):
        k = key(rpm=10)
        results = await asyncio.gather(*(admitted(rl, k) for _ in range(15) for rl in (a, b)))
        assert sum(results) == 10
        with pytest.raises(ApiError) as e:
            await b.admit(k, 0)
        assert e.value.status == 429 and 0 < (e.value.retry_after_s or 0) <= 6.0
        assert a.shared and b.shared
        assert await admitted(a, key(rpm=10, name="bob"))  # another key, another budget


async def test_two_replicas_share_the_token_budget(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis)) as (a, b):
        k = key(tpm=100)  # 1 token = 600 ms of refill: the test is quick enough not to see it
        assert [await admitted(rl, k, 30) for rl in (a, b, a)] == [True] * 3
        assert not await admitted(b, k, 30)
        assert await admitted(b, k, 10)  # exactly 100
        assert not await admitted(a, k, 1)
        await a.refund(k, 25)  # e.g. 25 of max_tokens unused
        assert await admitted(b, k, 25)
        assert not await admitted(a, k, 1)


async def test_retry_after_is_accurate(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis)) as (a, b):
        k = key(rpm=60)  # one request per second
        assert sum(await asyncio.gather(*(admitted(a, k) for _ in range(60)))) == 60
        with pytest.raises(ApiError) as e:
            await b.admit(k, 0)
        wait = e.value.retry_after_s or 0
        assert 0 < wait <= 1.0
        await asyncio.sleep(wait + 0.02)
        assert await admitted(b, k)
        assert not await admitted(a, k)


async def test_redis_layout_ttl_and_noscript(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis), n=1) as (rl,):
        k = key(rpm=60, tpm=6000)
        await rl.admit(k, 100)
        client = redis.Redis.from_url(_url(rl_redis))
        req_key, tok_key = rl.keys("alice")
        assert req_key.startswith("{t") and req_key.endswith("-rl}:alice:req")
        slots = {key_slot(k.encode()) for k in [req_key, tok_key, *rl.keys("bob")]}
        assert len(slots) == 1  # a batch of any keys is one Redis Cluster slot
        assert 0 < client.pttl(req_key) <= 1000 and 0 < client.pttl(tok_key) <= 1000
        client.script_flush()  # as after a Redis restart: redis-py reloads on NOSCRIPT
        await rl.admit(k, 100)
        assert rl.shared and 1000 < client.pttl(req_key) <= 2000
        client.close()


async def test_concurrent_admissions_are_coalesced(rl_redis: RedisExecutor) -> None:
    client = redis.Redis.from_url(_url(rl_redis))

    def evalsha_calls() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    async with replicas(_url(rl_redis), n=1) as (rl,):
        await rl.admit(key(rpm=1000, name="warm"), 0)  # connected, script loaded
        before = evalsha_calls()
        k = key(rpm=300, tpm=10**6)
        results = await asyncio.gather(*(admitted(rl, k, 10) for _ in range(400)))
        calls = evalsha_calls() - before
        assert sum(results) == 300 and rl.shared
        assert calls <= 5, calls  # ~2 batches (the first request, then everyone else)
        assert len(rl.client.connection_pool._available_connections) == 1  # noqa: SLF001
    client.close()


async def test_cancelled_waiters_and_close(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis), n=1) as (rl,):
        k = key(rpm=1000)
        tasks = [asyncio.create_task(rl.admit(k, 0)) for _ in range(20)]
        await asyncio.sleep(0)
        for t in tasks[::2]:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in done)
        assert await admitted(rl, k)  # the batcher is still fine
        pending = [asyncio.create_task(rl.admit(k, 0)) for _ in range(5)]
        await asyncio.sleep(0)
        await rl.close()  # waiters still queued are released (decided locally)
        assert await asyncio.gather(*pending) == [None] * 5


def test_redact() -> None:
    assert _redact("rediss://u:pw@h:1/0?ssl_ca_certs=/x") == "rediss://h:1/0"
    assert _redact("redis://h:6379") == "redis://h:6379"


# ---- AUTH, TLS ----------------------------------------------------------------------------


async def test_redis_auth_in_url(rl_redis_auth: RedisExecutor,
                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with replicas(_url(rl_redis_auth, RL_PASSWORD)) as (a, b):
        k = key(rpm=3)
        assert [await admitted(rl, k) for rl in (a, b, a, b)] == [True, True, True, False]
        assert a.shared and b.shared
    async with replicas(_url(rl_redis_auth, "wrong-pw-9d2f"), n=1) as (bad,):
        assert await admitted(bad, key(rpm=3))  # refused AUTH: local fallback, no error
        assert not bad.shared
    async with replicas(_url(rl_redis_auth), n=1) as (anon,):
        assert await admitted(anon, key(rpm=3)) and not anon.shared
    assert "wrong-pw-9d2f" not in caplog.text and RL_PASSWORD not in caplog.text
    assert "Redis failed" in caplog.text


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """redis-server with TLS only (self-signed cert for 127.0.0.1) and a password."""
    server, openssl = shutil.which("redis-server"), shutil.which("openssl")
    assert server and openssl, "make test installs redis-server and openssl"
    d = tmp_path_factory.mktemp("tls-redis")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec",
                    "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(d / "cert.pem"), "--tls-key-file", str(d / "key.pem"),
         "--tls-ca-cert-file", str(d / "cert.pem"), "--tls-auth-clients", "no",
         "--requirepass", RL_PASSWORD, "--save", "", "--dir", str(d)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, ready = time.monotonic() + 10, False
        while not ready and proc.poll() is None and time.monotonic() < deadline:
            try:
                ready = bool(redis.Redis(host="127.0.0.1", port=port, ssl=True,
                                         ssl_ca_certs=str(d / "cert.pem"), password=RL_PASSWORD,
                                         socket_timeout=0.5).ping())
            except redis.RedisError:
                time.sleep(0.05)
        assert proc.poll() is None, "redis-server exited: is it built with TLS (6.0+)?"
        assert ready, "TLS redis-server did not answer"
        yield port, d / "cert.pem"
    finally:
        proc.kill()
        proc.wait()


async def test_rediss_with_auth(tls_redis: tuple[int, Path]) -> None:
    port, ca = tls_redis
    url = f"rediss://:{RL_PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    async with replicas(url, timeout_s=2.0) as (a, b):
        k = key(rpm=2)
        assert [await admitted(rl, k) for rl in (a, b, a)] == [True, True, False]
        assert a.shared and b.shared
    async with replicas(f"redis://:{RL_PASSWORD}@127.0.0.1:{port}/0", n=1) as (plain,):
        assert await admitted(plain, key(rpm=1)) and not plain.shared  # TLS-only server


# ---- Redis down: local fallback, no added latency ----------------------------------------


async def _timed(rl: RateLimiter, k: ApiKeyConfig, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await admitted(rl, k)
        out.append(time.perf_counter() - t)
    return out


@contextmanager
def redis_calls(rl: RateLimiter) -> Iterator[list[int]]:
    """Counts the limiter's script calls to Redis (``[n]``) while the block runs: what the
    circuit breaker promises is a number of calls, not a time, so the tests count them."""
    script, calls = rl._script, [0]
    assert script is not None

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await script(*args, **kwargs)

    rl._script = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        rl._script = script


def probes_allowed(elapsed_s: float, backoff_s: float) -> int:
    """The most Redis calls an open circuit makes in ``elapsed_s``: one probe per back-off."""
    return 1 + math.ceil(elapsed_s / backoff_s)


async def test_redis_killed_local_fallback(rl_redis: RedisExecutor,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with replicas(_url(rl_redis), timeout_s=0.05, backoff_s=0.5) as (a, b):
        k = key(rpm=100_000)
        healthy = await _timed(a, k, 50)
        tight = key(rpm=5, name="bob")
        assert [await admitted(a, tight) for _ in range(3)] == [True] * 3  # through Redis
        rl_redis.stop()
        try:
            with redis_calls(a) as calls:
                t0 = time.perf_counter()
                first = await _timed(a, k, 1)  # connection refused: fails over at once
                down = await _timed(a, k, 500)
                elapsed = time.perf_counter() - t0
            assert not a.shared
            print(f"healthy max {max(healthy) * 1e3:.2f} ms, first after kill "
                  f"{first[0] * 1e3:.2f} ms, down: mean {sum(down) / len(down) * 1e6:.0f} us, "
                  f"max {max(down) * 1e3:.2f} ms; {calls[0]} Redis calls in {elapsed:.2f} s")
            # 501 requests while Redis is gone: one failed call, then one probe per back-off
            assert 1 <= calls[0] <= probes_allowed(elapsed, 0.5)
            # Local limits are per replica now; a's local view started from its own usage.
            assert sum([await admitted(a, tight) for _ in range(7)]) == 2
            assert sum([await admitted(b, tight) for _ in range(7)]) == 5
        finally:
            rl_redis.start()
        for _ in range(50):  # past the back-off, a call probes Redis and closes the circuit
            await asyncio.sleep(0.1)
            if await admitted(a, k) and a.shared:
                break
        assert a.shared
    assert SECRET_HASH not in caplog.text and "alice" not in caplog.text
    assert "limits are per router replica" in caplog.text and "Redis is back" in caplog.text


async def test_redis_hung_costs_one_timeout_per_backoff(rl_redis: RedisExecutor) -> None:
    async with replicas(_url(rl_redis), n=1, timeout_s=0.05, backoff_s=5.0) as (rl,):
        k = key(rpm=100_000)
        await _timed(rl, k, 5)  # connection pool warm
        os.kill(rl_redis.process.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            with redis_calls(rl) as calls:
                t0 = time.perf_counter()
                first = await _timed(rl, k, 1)
                down = await _timed(rl, k, 500)
                elapsed = time.perf_counter() - t0
        finally:
            os.kill(rl_redis.process.pid, signal.SIGCONT)
        print(f"hung: first {first[0] * 1e3:.1f} ms, then max {max(down) * 1e3:.2f} ms; "
              f"{calls[0]} Redis calls in {elapsed:.2f} s")
        assert first[0] >= 0.04  # the first request waited out the 50 ms socket timeout
        assert not rl.shared
        # and no request waits for Redis again during the back-off: one call per back-off
        assert 1 <= calls[0] <= probes_allowed(elapsed, 5.0)
