"""vLLM's KV event media onto kvroute tiers (workers.engines.vllm.blocks), from recorded events.

The fixture holds msgpack ``KVEventBatch``es built with vLLM 0.32's own event classes
(``vllm.distributed.kv_events``; regenerate it in the vLLM venv): the GPU pool stores a
chain, the CPU offloading tier stores its second half, the GPU drops it, a CPU hit loads it
back and the CPU copy goes, then events of the storage tier, of an unknown medium and a
clear. Decoded here as the subscriber sees them (plain msgpack; events are tagged maps whose
omitted fields take vLLM's defaults)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored
from cache_service.hashing import block_hashes, model_salt
from workers.engines.vllm.blocks import TieredMapper, tier_of

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm_kv_events_offload.json"
DEFAULTS = {"group_idx": None, "extra_keys": None, "lora_id": None, "lora_name": None}


def _events(raw: bytes) -> list[Any]:
    _, events, *_ = msgpack.unpackb(raw, raw=False)
    out = []
    for e in events:
        kind = e.pop("type")
        out.append(type(kind, (), {**DEFAULTS, **e})())  # the class name is what apply reads
    return out


def test_media_map_to_tiers() -> None:
    assert [tier_of(m) for m in (None, "GPU", "CPU", "cpu", "STORAGE", "NVME?")] == [
        "device", "device", "host", "host", "disk", None]


def test_recorded_offload_events_keep_each_block_tier_exact() -> None:
    data = json.loads(FIXTURE.read_text())
    canon = block_hashes(data["token_ids"], 64, model_salt("m"))  # 2 canonical blocks
    mapper = TieredMapper("m", "r", 64)
    seen = []
    for raw in data["batches_msgpack_hex"]:
        for event in _events(bytes.fromhex(raw)):
            mapper.apply(event)
        seen.append(mapper.drain())
    assert seen[0] == [BlockStored("m", "r", tuple(canon))]
    # The offloaded half's parent is only known to the GPU mapper: placed all the same.
    assert seen[1] == [BlockStored("m", "r", (canon[1],), "host")]
    assert seen[2] == [BlockRemoved("m", "r", (canon[1],))]
    assert seen[3] == [BlockStored("m", "r", (canon[1],)),
                       BlockRemoved("m", "r", (canon[1],), "host")]
    # STORAGE is the disk tier (its 16-token block completes no canonical block); an unknown
    # medium is ignored; a clear covers every tier, once.
    assert seen[4] == [AllBlocksCleared("m", "r")]


@pytest.mark.parametrize("medium", ["CPU", "STORAGE"])
def test_a_removed_offload_copy_leaves_the_device_copy(medium: str) -> None:
    data = json.loads(FIXTURE.read_text())
    first = _events(bytes.fromhex(data["batches_msgpack_hex"][0]))[0]
    mapper = TieredMapper("m", "r", 64)
    mapper.apply(first)
    offload = type("BlockStored", (), {**vars(type(first)), "medium": medium})()
    mapper.apply(offload)
    gone = type("BlockRemoved", (), {**DEFAULTS, "block_hashes": first.block_hashes,
                                     "medium": medium})()
    mapper.apply(gone)
    events = mapper.drain()
    tier = tier_of(medium)
    assert [(type(e).__name__, e.tier) for e in events] == [  # type: ignore[union-attr]
        ("BlockStored", "device"), ("BlockStored", tier), ("BlockRemoved", tier)]
