"""The response store's bounds: raw entry size, bytes per owner and in all (locally and in
Redis), past reasoning kept once, owners, and large entries decoded off the loop."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

from router.api.responses import store as store_mod
from router.api.responses.store import ResponseStore, StoredResponse
from router.output.reasoning_parsers.controls import with_past_reasoning


def _entry(text: str, owner: str | None = "alice", thought: str = "") -> StoredResponse:
    msg = with_past_reasoning({"role": "assistant", "content": text}, thought)
    return StoredResponse("m", [{"role": "user", "content": "hi"}, msg], [], [], owner)


def _store(**kw: Any) -> ResponseStore:
    args: dict[str, Any] = {"ttl_s": 60.0, "max_entry_bytes": 1 << 20, "memory_bytes": 8 << 20}
    return ResponseStore(None, "kvroute", **{**args, **kw})


def test_the_entry_bound_is_on_raw_size_not_compressed() -> None:
    store = _store(max_entry_bytes=100_000)
    entry = _entry("a" * 200_000)  # compresses to about 1 kB
    assert len(entry.encode()[0]) < 100_000
    assert asyncio.run(store.put("r1", entry)) is False
    assert asyncio.run(store.get("r1", "alice")) is None


def test_past_reasoning_is_stored_once_and_read_back_under_both_names() -> None:
    entry = _entry("ok", thought="t" * 10_000)
    _, raw = entry.encode()
    assert 10_000 < raw < 20_000  # one copy, not two
    back = StoredResponse.decode(entry.encode()[0])
    assert back.messages[1]["reasoning_content"] == back.messages[1]["thinking"] == "t" * 10_000


def test_an_entry_belongs_to_its_owner() -> None:
    store = _store()
    asyncio.run(store.put("r1", _entry("x", owner="alice")))
    assert asyncio.run(store.get("r1", "alice")) is not None
    assert asyncio.run(store.get("r1", "bob")) is None
    assert asyncio.run(store.get("r1", None)) is None


def _incompressible(n: int) -> str:
    rng = random.Random(n)
    return "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(n))


def test_one_owner_cannot_take_the_whole_local_store() -> None:
    store = _store(memory_bytes=400_000, key_bytes=100_000)
    for i in range(10):  # about 30 kB compressed each
        assert asyncio.run(store.put(f"a{i}", _entry(_incompressible(10_000), "alice")))
    asyncio.run(store.put("b0", _entry("mine", "bob")))
    assert store._owner_bytes["alice"] <= 100_000
    assert asyncio.run(store.get("a9", "alice")) is not None  # the newest stay
    assert asyncio.run(store.get("a0", "alice")) is None  # the oldest of alice's went
    assert asyncio.run(store.get("b0", "bob")) is not None
    assert store._local_bytes <= 400_000


def test_a_large_entry_is_decoded_off_the_event_loop(monkeypatch: Any) -> None:
    store = _store(max_entry_bytes=8 << 20)
    threads: list[int] = []
    decode = StoredResponse.decode.__func__  # type: ignore[attr-defined]

    def spy(cls: type[StoredResponse], blob: bytes) -> StoredResponse:
        threads.append(threading.get_ident())
        return decode(cls, blob)
    monkeypatch.setattr(StoredResponse, "decode", classmethod(spy))

    async def run() -> int:
        await store.put("big", _entry(_incompressible(40_000)))
        await store.put("small", _entry("x"))
        await store.get("big", "alice")
        await store.get("small", "alice")
        return threading.get_ident()
    loop_thread = asyncio.run(run())
    assert len(store._local["big"][1]) > store_mod.INLINE_DECODE_BYTES
    assert threads[0] != loop_thread and threads[1] == loop_thread


class _Pipe:
    def __init__(self, redis: _Redis) -> None:
        self.redis, self.ops = redis, []  # type: ignore[var-annotated]

    def incrby(self, key: str, n: int) -> None:
        self.ops.append((key, n))

    def decrby(self, key: str, n: int) -> None:
        self.ops.append((key, -n))

    def pexpire(self, key: str, ms: int) -> None:
        self.ops.append((key, None))

    async def execute(self) -> list[Any]:
        out = []
        for key, n in self.ops:
            if n is None:
                out.append(True)
            else:
                self.redis.counts[key] = self.redis.counts.get(key, 0) + n
                out.append(self.redis.counts[key])
        return out


class _Redis:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.data: dict[str, bytes] = {}

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)

    async def set(self, key: str, value: bytes, px: int) -> None:
        self.data[key] = value

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)


def test_redis_keeps_the_owner_bound_too() -> None:
    redis = _Redis()
    store = ResponseStore(redis, "kvroute", 60.0, 1 << 20, 400_000,  # type: ignore[arg-type]
                          key_bytes=100_000)
    for i in range(10):
        asyncio.run(store.put(f"a{i}", _entry(_incompressible(10_000), "alice")))
    stored = [k for k in redis.data if k.endswith(tuple(f"a{i}" for i in range(10)))]
    assert 1 <= len(stored) < 10
    assert redis.counts["{kvroute}:resp:bytes:alice"] <= 100_000


def test_each_owners_share_of_redis_is_reported() -> None:
    """What ``kvroute_key_redis_*{store="responses"}`` shows: the owner's counted bytes,
    what it wrote, and what its bound refused."""
    seen: list[tuple[str, int, int, int]] = []
    store = ResponseStore(_Redis(), "kvroute", 60.0, 1 << 20, 400_000,  # type: ignore[arg-type]
                          key_bytes=100_000, on_share=lambda *a: seen.append(a))
    for i in range(10):
        asyncio.run(store.put(f"a{i}", _entry(_incompressible(10_000), "alice")))
    written = [s for s in seen if s[2]]
    refused = [s for s in seen if s[3]]
    assert written and refused and all(s[0] == "alice" for s in seen)
    assert max(s[1] for s in seen) <= 100_000
