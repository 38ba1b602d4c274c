"""The prompt cache's shared second level in Redis (router.prompt.store): two ChatTokenizer
instances play two router replicas over one real redis-server. Every encode is compared
with whole-text tokenization; Redis stopped or hung mid-way costs one failed call per
back-off and never a wrong id."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from pytest_redis import factories

from deploy.config import IndexConfig, PromptCacheConfig
from ops.bench.harness.workloads import AgentParams, AgentWorkload, flatten
from router.prompt import store as ts
from router.prompt.setup import TokenCache, with_redis
from router.prompt.tokenizer import ChatTokenizer
from tests.router.prompt.test_prompt_cache import messages, texts
from tests.stacks import redis_url

tok_redis = factories.redis_proc(host="127.0.0.1", port=None)
NS = "kvtest"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def url(tok_redis: Any) -> Iterator[str]:
    u = redis_url(tok_redis)
    redis.Redis.from_url(u).flushall()
    yield u


def replica(model: Path, url: str, clock: Clock | None = None, backoff_s: float = 60.0,
            max_bytes: int = 128 << 20) -> ChatTokenizer:
    """One router replica's tokenizer with its own local cache and Redis client."""
    store = ts.TokenStore(url, NS, ttl_s=600, timeout_s=0.05, backoff_s=backoff_s,
                          clock=clock or Clock())
    return ChatTokenizer(str(model), TokenCache(PromptCacheConfig(max_bytes=max_bytes), store))


def store(tok: ChatTokenizer) -> ts.TokenStore:
    assert tok.prompt_cache.store is not None
    return tok.prompt_cache.store


def exact(tok: ChatTokenizer, messages: list[dict[str, Any]],
          tools: list[dict[str, Any]] | None = None) -> list[int]:
    text = tok.render(messages, tools=tools)
    ids = tok.encode(text)
    assert ids == tok.encode_full(text)
    tok.commit(ids)  # admitted: the token store may learn it
    return ids


def session(turns: int, salt: str, words: int = 900) -> list[list[dict[str, Any]]]:
    """A growing conversation's prompts; each turn adds ~``words`` words."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": f"{salt} rules " * 400}]
    out = []
    for t in range(turns):
        chat = [*chat, {"role": "user", "content": f"turn {t} ünïcödé 日本語 " + "word " * words}]
        out.append(chat)
        chat = [*chat, {"role": "assistant", "content": f"done {t}\n\n"}]
    return out


def test_a_new_replica_reads_the_prefix_another_tokenized(tiny_model_dir: Path, url: str
                                                          ) -> None:
    a, b = replica(tiny_model_dir, url), replica(tiny_model_dir, url)
    turns = session(6, "move")
    for chat in turns[:-1]:
        exact(a, chat)
    store(a).flush()
    before = exact(a, turns[-2])
    ids = exact(b, turns[-1])  # b never saw this session
    stats = b.prompt_cache.stats()
    assert stats["remote_tokens"] >= len(before) - 8  # all but the generation prompt's tail
    assert stats["new_tokens"] <= len(ids) - len(before) + 8  # only the new turn
    assert stats["new_tokens"] + stats["remote_tokens"] == len(ids)
    # b keeps what it read: the next turn hits its local cache, not Redis
    reads = store(b).counts["reads"]
    nxt = [*turns[-1], {"role": "assistant", "content": "ok"},
           {"role": "user", "content": "short"}]
    exact(b, nxt)
    assert store(b).counts["reads"] == reads


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path, tok_redis: Any) -> tuple[ChatTokenizer, ...]:
    """Two replicas with small local caches (evictions) that ask Redis for any length."""
    reps = tuple(replica(tiny_model_dir, redis_url(tok_redis), max_bytes=32 << 10)
                 for _ in range(2))
    for r in reps:
        store(r).min_lookup_chars = 0
    return reps


def test_random_conversations_bit_identical_across_replicas(
        pair: tuple[ChatTokenizer, ...]) -> None:
    """Random texts with special-token look-alikes and unicode at the cuts; the turns of a
    conversation alternate between the two replicas, which read each other's from Redis."""

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(msgs=messages, system=texts)
    def run(msgs: list[dict[str, Any]], system: str) -> None:
        head = [{"role": "system", "content": system}]
        for n in range(1, len(msgs) + 1):
            exact(pair[n % 2], head + msgs[:n])
            if n % 3 == 0:
                store(pair[n % 2]).flush()

    run()
    assert sum(t.prompt_cache.remote_tokens for t in pair) > 1000


def test_agent_sessions_bit_identical_across_replicas(tiny_model_dir: Path, url: str) -> None:
    """The bench's agent workload, every call on one of three replicas in turn (so most
    calls land on a replica that missed the session's last turns)."""
    reps = [replica(tiny_model_dir, url) for _ in range(3)]
    work = AgentWorkload(AgentParams(seed=5, system_tokens=2000, repo_tokens=1500,
                                     tool_result_tokens=1500, compact_tokens=20000))
    calls = [c for i in range(2) for c in flatten(work.session(i))]
    for i, call in enumerate(calls):
        tok = reps[i % 3]
        exact(tok, call.request.body["messages"], call.request.body.get("tools"))
        store(tok).flush()
    remote = sum(r.prompt_cache.remote_tokens for r in reps)
    assert len(calls) > 20 and remote > 0


def test_long_runs_chain_across_entries(tiny_model_dir: Path, url: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run larger than an entry is written as several entries that chain by digest."""
    monkeypatch.setattr(ts, "MAX_ENTRY_BYTES", 40_000)
    a, b = replica(tiny_model_dir, url), replica(tiny_model_dir, url)
    chat = session(8, "chain", words=300)[-1]
    exact(a, chat)
    store(a).flush()
    keys = list(redis.Redis.from_url(url).scan_iter(f"{{{NS}}}:tok:*"))
    assert len(keys) >= 3
    ids = exact(b, [*chat, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}])
    assert b.prompt_cache.remote_tokens > len(ids) // 2


def test_an_entry_whose_text_differs_is_not_used(tiny_model_dir: Path, url: str) -> None:
    """Entries are checked segment by segment against the request's own text; a forged or
    garbled entry under the right key is ignored."""
    a, b = replica(tiny_model_dir, url), replica(tiny_model_dir, url)
    chat = session(3, "forged")[-1]
    exact(a, chat)
    store(a).flush()
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(f"{{{NS}}}:tok:*"))
    for i, key in enumerate(keys):
        texts, ids = ts.unpack(r.get(key))
        if i % 2:
            r.set(key, ts.pack([t.replace("word", "w0rd") for t in texts], ids))
        else:
            r.set(key, b"KT1\0garbage")
    exact(b, chat)
    assert b.prompt_cache.remote_tokens == 0


def test_redis_stopped_midway_costs_one_failure_per_backoff(tiny_model_dir: Path, url: str,
                                                             tok_redis: Any) -> None:
    clock = Clock()
    a, b = replica(tiny_model_dir, url), replica(tiny_model_dir, url, clock)
    for chat in session(3, "before-stop"):
        exact(a, chat)
        exact(b, chat)
    store(b).flush()
    tok_redis.stop()
    try:
        for i in range(8):  # new sessions: each would read Redis and queue a write
            exact(b, session(3, f"down-{i}")[-1])
        store(b).flush()
        counts = store(b).counts
        assert counts["read_errors"] + counts["write_errors"] == 1, counts
        assert not store(b).breaker.healthy
    finally:
        tok_redis.start()
    clock.now += 61  # past the back-off: one probe, then Redis is used again
    exact(b, session(3, "after-restart")[-1])
    store(b).flush()
    assert store(b).breaker.healthy
    c = replica(tiny_model_dir, url)
    exact(c, [*session(3, "after-restart")[-1], {"role": "assistant", "content": "z"}])
    assert c.prompt_cache.remote_tokens > 0


def test_a_hung_redis_costs_one_timeout_per_backoff(tiny_model_dir: Path) -> None:
    """A server that accepts and never answers: the 50 ms socket timeout fires once, the
    circuit opens, and the other requests tokenize without waiting."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:  # closed
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        b = replica(tiny_model_dir, f"redis://127.0.0.1:{server.getsockname()[1]}/0")
        for i in range(6):
            exact(b, session(3, f"hung-{i}")[-1])
        store(b).flush()
        counts = store(b).counts
        assert counts["read_errors"] + counts["write_errors"] == 1, counts
    finally:
        stop.set()
        server.close()
        for s in held:
            s.close()


def test_short_prompts_never_touch_redis(tiny_model_dir: Path, url: str) -> None:
    b = replica(tiny_model_dir, url)
    exact(b, [{"role": "user", "content": "hello " * 100}])
    store(b).flush()
    assert store(b).counts["reads"] == store(b).counts["writes"] == 0


def test_config_turns_the_second_level_on_with_the_redis_url() -> None:
    on = with_redis(PromptCacheConfig(), IndexConfig(redis_url="redis://127.0.0.1:1/0"))
    assert on.store is not None and on.store.prefix == "{kvroute}:tok:"
    assert on.store.ttl_ms == 3_600_000
    assert with_redis(PromptCacheConfig(), IndexConfig()).store is None
    assert with_redis(PromptCacheConfig(redis=False),
                      IndexConfig(redis_url="redis://127.0.0.1:1/0")).store is None
    assert with_redis(PromptCacheConfig(enabled=False),
                      IndexConfig(redis_url="redis://127.0.0.1:1/0")).store is None


def test_pack_round_trip() -> None:
    texts, ids = ["<|im_start|>", "user\n日本語 \U0001F600<|im_end|>", ""], [[1], [2, 3, 70000], []]
    assert ts.unpack(ts.pack(texts, ids)) == (texts, ids)
    with pytest.raises(ValueError):
        ts.unpack(ts.pack(texts, ids)[:-4])
