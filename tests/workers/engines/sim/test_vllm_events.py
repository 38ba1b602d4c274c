"""The sim engine's vLLM-format KV events (workers/engines/sim/vllm_wire.py), read back over a real
ZMQ SUB socket by a decoder that does what the peer routers do (PEERS.md, and the fields
vllm-router's ``src/kv_index/wire.rs`` requires): check the three frames, unpack the
map-tagged events, re-hash ``token_ids`` per block and chain them by
``parent_block_hash``; removals are by the published hashes."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import numpy as np
import pytest
import xxhash
import zmq

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored
from workers.engines.sim.core import SimParams
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.vllm_wire import VllmEventEncoder, VllmEventPublisher, pack_batch
from workers.protocol import Finished, GenerateRequest, SamplingParams

MODEL = "sim/vllm-events"
CANON = 64


class PeerIndex:
    """What a KV-event router keeps: published hash -> (its own chained hash, tokens)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.seqs: list[int] = []

    def apply(self, frames: list[bytes]) -> None:
        topic, seq, body = frames
        assert topic == b"" and len(seq) == 8
        self.seqs.append(int.from_bytes(seq, "big"))
        ts, events, dp_rank = msgpack.unpackb(body)
        assert isinstance(ts, float) and dp_rank == 0
        for ev in events:
            assert isinstance(ev, dict), "events are maps, not arrays"
            getattr(self, "_" + ev["type"])(ev)

    def _BlockStored(self, ev: dict) -> None:  # noqa: N802 (the wire's tag)
        bs, hashes, tokens = ev["block_size"], ev["block_hashes"], ev["token_ids"]
        assert bs == self.block_size and ev["group_idx"] == 0
        # vllm-router's wire.rs: these have no default, a batch without them is dropped
        assert {"lora_id", "medium", "lora_name", "parent_block_hash"} <= set(ev)
        assert len(tokens) == bs * len(hashes)
        parent = ev["parent_block_hash"]
        local = 0 if parent is None else self.blocks[parent][0]  # parent must be known
        for i, h in enumerate(hashes):
            assert isinstance(h, int) and 0 <= h < 1 << 64, "u64 hashes"
            block = tuple(tokens[i * bs:(i + 1) * bs])
            local = xxhash.xxh3_64_intdigest(struct.pack("<Q", local) + bytes(str(block), "ascii"))
            self.blocks[h] = (local, block)

    def _BlockRemoved(self, ev: dict) -> None:  # noqa: N802
        assert "medium" in ev
        for h in ev["block_hashes"]:
            self.blocks.pop(h)  # a removal names a block that was stored

    def _AllBlocksCleared(self, ev: dict) -> None:  # noqa: N802
        self.blocks.clear()

    def prefix_tokens(self, prompt: list[int]) -> int:
        """Tokens of ``prompt`` whose chained local hashes the index holds, from the start."""
        held = {local for local, _ in self.blocks.values()}
        local, n, bs = 0, 0, self.block_size
        while n + bs <= len(prompt):
            block = tuple(prompt[n:n + bs])
            local = xxhash.xxh3_64_intdigest(struct.pack("<Q", local) + bytes(str(block), "ascii"))
            if local not in held:
                break
            n += bs
        return n


def prompt(n: int, base: int) -> list[int]:
    return [(base + i * 13) % 3000 + 100 for i in range(n)]


async def serve(engine: SimEngine, tokens: list[int], rid: str) -> int:
    req = GenerateRequest(rid, tokens, SamplingParams(max_tokens=2))
    async for item in engine.generate(req):
        if isinstance(item, Finished):
            return item.usage.cached_tokens
    raise AssertionError("no Finished")


async def receive(sub: zmq.Socket, peer: PeerIndex) -> None:
    await asyncio.sleep(0.05)
    while sub.poll(200):
        peer.apply(sub.recv_multipart())


@pytest.mark.parametrize("block_size", [16, 64])
async def test_peer_index_follows_the_engine_cache(block_size: int) -> None:
    params = SimParams(block_size=CANON, kv_blocks=12, prefill_tok_s=1e7, tpot_s=0.001)
    engine = SimEngine(MODEL, "r0", CANON, params)
    pub = VllmEventPublisher(CANON, block_size)
    engine.set_event_tap(pub)
    await engine.start()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    peer = PeerIndex(block_size)
    try:
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
        await asyncio.sleep(0.2)  # the slow joiner: SUB connects before the first batch
        a = prompt(5 * CANON + 10, 1)
        await serve(engine, a, "a")
        await receive(sub, peer)
        assert peer.prefix_tokens(a) == 5 * CANON  # full blocks only
        b = a[: 3 * CANON] + prompt(2 * CANON, 2)  # shares three blocks with a
        assert await serve(engine, b, "b") == 3 * CANON
        await receive(sub, peer)
        assert peer.prefix_tokens(b) == 5 * CANON
        # 12 blocks hold 7 distinct ones; a third prompt of 8 blocks evicts LRU blocks
        await serve(engine, prompt(8 * CANON, 3), "c")
        await receive(sub, peer)
        assert len(peer.blocks) == 12 * (CANON // block_size)
        assert peer.prefix_tokens(a) < 5 * CANON
        assert peer.seqs == list(range(len(peer.seqs)))  # 8-byte big-endian sequence
        # kvroute's own drain still gets every event
        assert any(isinstance(e, BlockRemoved) for e in engine.drain_cache_events())
        engine.reset_cache()
        await receive(sub, peer)
        assert peer.blocks == {}
    finally:
        sub.close(0)
        await engine.shutdown()
        pub.close()


def test_runs_split_where_blocks_do_not_chain() -> None:
    enc = VllmEventEncoder(4, 2)
    ids = np.arange(100, 116, dtype="<u4")
    enc.note_prompt(ids, [11, 12, 13, 14])
    out = enc.encode([BlockStored("m", "r", (11, 13, 14)), BlockRemoved("m", "r", (14,)),
                      AllBlocksCleared("m", "r")])
    assert [e["type"] for e in out] == ["BlockStored", "BlockStored", "BlockRemoved",
                                        "AllBlocksCleared"]
    first, second = out[0], out[1]
    assert first["parent_block_hash"] is None and first["token_ids"] == [100, 101, 102, 103]
    assert first["block_hashes"][-1] == 11  # the last sub-block carries the canonical hash
    assert second["parent_block_hash"] == 12 and second["token_ids"] == list(range(108, 116))
    assert out[2]["block_hashes"] == enc.sub_hashes(14) and len(enc.sub_hashes(14)) == 2
    frames = pack_batch(7, out, ts=1.5)
    assert frames[1] == (7).to_bytes(8, "big")
    assert msgpack.unpackb(frames[2])[0] == 1.5


def test_block_size_must_divide_the_canonical_one() -> None:
    with pytest.raises(ValueError, match="divide"):
        VllmEventEncoder(64, 24)


async def test_the_registry_gives_a_sim_replica_its_publisher_and_shutdown_closes_it() -> None:
    """``vllm_kv_events`` on a sim model: the engine the registry makes publishes on loopback
    (the endpoint the replica's load report names) and stops when the engine shuts down."""
    from deploy.config import ModelConfig
    from workers.engines import make_engine

    base = {"name": "sim", "engine": "sim", "model_path": "unused"}
    plain = make_engine(ModelConfig.model_validate(base), "r0", CANON)
    assert plain.kv_events_endpoint is None
    cfg = ModelConfig.model_validate({**base, "vllm_kv_events": {"block_size": 16}})
    engine = make_engine(cfg, "r0", CANON)
    endpoint = engine.kv_events_endpoint
    assert endpoint is not None and endpoint.startswith("tcp://127.0.0.1:")
    await engine.start()
    await engine.shutdown()
    sock = zmq.Context.instance().socket(zmq.PUB)
    try:  # the port is free again: the publisher's socket was closed
        sock.bind(endpoint)
    finally:
        sock.close(0)
