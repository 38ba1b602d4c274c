"""One behaviour suite, run against both backends (MemoryPrefixIndex and RedisPrefixIndex on a
real redis-server): whatever the router sees must not depend on the backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from cache_service import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexSettings,
    PrefixIndex,
    block_hashes,
    model_salt,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

IndexFactory = Callable[[IndexSettings], PrefixIndex]
SettingsFor = Callable[..., IndexSettings]

CHAIN = block_hashes(list(range(64 * 8)), salt=model_salt("m1"))  # 8 blocks
OTHER = block_hashes(list(range(64 * 8)), salt=model_salt("m2"))
TTL = 0.3  # short TTLs; sleeps are TTL + margin
WAIT = TTL + 0.25


async def test_protocol_and_empty_inputs(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for())
    assert isinstance(index, PrefixIndex)
    assert await index.lookup({}) == {}
    assert await index.lookup({"m1": []}) == {"m1": {}}
    await index.record_routed("m1", "r1", [])
    await index.apply_events([])
    assert await index.lookup({"m1": CHAIN}) == {"m1": {}}
    assert (await index.stats()).blocks == 0


async def test_longest_consecutive_leading_match(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for())
    await index.apply_events(
        [
            BlockStored("m1", "full", tuple(CHAIN)),
            BlockStored("m1", "five", tuple(CHAIN[:5])),
            BlockStored("m1", "gap", tuple(CHAIN[:2] + CHAIN[3:])),  # misses block 2
            BlockStored("m1", "no-head", tuple(CHAIN[1:])),  # misses block 0
        ]
    )
    await index.record_routed("m1", "routed", CHAIN[:3])
    got = await index.lookup({"m1": CHAIN})
    assert got["m1"] == {"full": 8, "five": 5, "gap": 2, "routed": 3}
    got = await index.lookup({"m1": CHAIN[:4] + [12345]})  # query diverges after block 3
    assert got["m1"] == {"full": 4, "five": 4, "gap": 2, "routed": 3}
    assert (await index.lookup({"m1": [999] + CHAIN}))["m1"] == {}


async def test_multiple_models_in_one_lookup(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for())
    await index.apply_events([BlockStored("m1", "a", tuple(CHAIN[:6]))])
    await index.record_routed("m2", "a", OTHER[:2])  # same replica name, other model
    await index.record_routed("m2", "b", OTHER[:7])
    got = await index.lookup({"m1": CHAIN, "m2": OTHER, "m3": CHAIN})
    assert got == {"m1": {"a": 6}, "m2": {"a": 2, "b": 7}, "m3": {}}
    # the model is part of the key: m2 does not see m1's blocks even with identical hashes
    assert (await index.lookup({"m2": CHAIN}))["m2"] == {}


async def test_routed_counts_at_once_then_expires(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for(routed_ttl_s=TTL))
    await index.record_routed("m1", "r1", CHAIN[:4])
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r1": 4}
    await asyncio.sleep(WAIT)
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {}


async def test_routed_write_never_shortens_stored(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for(routed_ttl_s=TTL))
    await index.apply_events([BlockStored("m1", "r1", tuple(CHAIN[:3]))])
    await index.record_routed("m1", "r1", CHAIN[:5])  # blocks 3-4 only in flight
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r1": 5}
    await asyncio.sleep(WAIT)
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r1": 3}


async def test_stored_entries_expire(new_index: IndexFactory, settings_for: SettingsFor) -> None:
    index = new_index(settings_for(routed_ttl_s=TTL / 2, stored_ttl_s=TTL))
    await index.apply_events([BlockStored("m1", "r1", tuple(CHAIN))])
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r1": 8}
    await asyncio.sleep(WAIT)
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {}
    assert await index.live_replicas("m1") == set()


async def test_removed_and_cleared_events(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for())
    await index.apply_events(
        [
            BlockStored("m1", "r1", tuple(CHAIN)),
            BlockStored("m1", "r2", tuple(CHAIN)),
            BlockStored("m2", "r1", tuple(OTHER)),
        ]
    )
    await index.apply_events([BlockRemoved("m1", "r1", (CHAIN[5], CHAIN[7]))])
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r1": 5, "r2": 8}
    await index.apply_events([AllBlocksCleared("m1", "r2")])
    got = await index.lookup({"m1": CHAIN, "m2": OTHER})
    assert got == {"m1": {"r1": 5}, "m2": {"r1": 8}}  # other replica/model untouched
    assert (await index.stats()).blocks == 6 + 8


async def test_events_apply_in_order(new_index: IndexFactory, settings_for: SettingsFor) -> None:
    index = new_index(settings_for())
    await index.apply_events(
        [
            BlockStored("m1", "a", tuple(CHAIN)),
            BlockRemoved("m1", "a", (CHAIN[2],)),  # after store: wins
            BlockStored("m1", "b", tuple(CHAIN)),
            AllBlocksCleared("m1", "b"),
            BlockStored("m1", "b", tuple(CHAIN[:3])),  # after clear: survives
        ]
    )
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"a": 2, "b": 3}


async def test_dead_replica_hidden_then_purged(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for(liveness_ttl_s=0.4))
    for replica in ("alive", "dying", "silent"):  # "silent" never heartbeats: live
        await index.apply_events([BlockStored("m1", replica, tuple(CHAIN[:4]))])
    await index.heartbeat("m1", "alive")
    await index.heartbeat("m1", "dying")
    assert await index.live_replicas("m1") == {"alive", "dying", "silent"}
    await asyncio.sleep(0.25)
    await index.heartbeat("m1", "alive")
    await asyncio.sleep(0.25)  # "dying" silent for 0.5 s > 0.4 s
    await index.heartbeat("m1", "alive")
    assert await index.live_replicas("m1") == {"alive", "silent"}
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"alive": 4, "silent": 4}
    assert (await index.stats()).replicas == 2
    assert await index.purge_dead() == 1
    assert await index.purge_dead() == 0
    assert (await index.stats()).blocks == 8  # dying's 4 entries are gone
    await index.record_routed("m1", "dying", CHAIN)  # late write: dropped (tombstone)
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"alive": 4, "silent": 4}
    await index.heartbeat("m1", "dying")  # back (e.g. restarted with the same name): empty
    assert await index.live_replicas("m1") == {"alive", "dying", "silent"}
    await index.record_routed("m1", "dying", CHAIN[:1])
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"alive": 4, "silent": 4, "dying": 1}


async def test_remove_replica_purges(new_index: IndexFactory, settings_for: SettingsFor) -> None:
    index = new_index(settings_for())
    many = block_hashes(list(range(64 * 1500)), salt=1)  # > one purge chunk
    await index.apply_events(
        [BlockStored("m1", "r1", tuple(many)), BlockStored("m1", "r2", tuple(CHAIN))]
    )
    await index.heartbeat("m1", "r1")
    await index.remove_replica("m1", "r1")
    assert await index.live_replicas("m1") == {"r2"}
    assert (await index.lookup({"m1": many, "x": CHAIN}))["m1"] == {}
    stats = await index.stats()
    assert (stats.blocks, stats.replicas) == (8, 1)
    await index.apply_events([BlockStored("m1", "r1", tuple(CHAIN))])  # dropped
    assert (await index.lookup({"m1": CHAIN}))["m1"] == {"r2": 8}
    await index.remove_replica("m1", "never-seen")  # no-op, no error


async def test_stats_counts(new_index: IndexFactory, settings_for: SettingsFor) -> None:
    index = new_index(settings_for())
    await index.record_routed("m1", "a", CHAIN[:3])
    await index.record_routed("m1", "a", CHAIN[:5])  # re-routing the same blocks adds none
    await index.apply_events([BlockStored("m2", "a", tuple(OTHER[:2]))])
    await index.heartbeat("m2", "b")  # heartbeat only, no entries
    stats = await index.stats()
    assert (stats.blocks, stats.replicas) == (7, 3)
    assert stats.backend in ("memory", "redis")


async def test_large_remove_and_clear(new_index: IndexFactory, settings_for: SettingsFor) -> None:
    index = new_index(settings_for())
    big = block_hashes(list(range(64 * 10_000)), salt=3)  # beyond Lua's unpack limit
    await index.apply_events(
        [BlockStored("m1", "a", tuple(big)), BlockStored("m1", "b", tuple(big))]
    )
    await index.apply_events([BlockRemoved("m1", "a", tuple(big[5:]))])
    await index.apply_events([AllBlocksCleared("m1", "b")])
    assert (await index.lookup({"m1": big}))["m1"] == {"a": 5}
    assert (await index.stats()).blocks == 5


async def test_sessions_remember_the_last_pair_then_expire(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    index = new_index(settings_for(session_ttl_s=TTL))
    assert await index.session("s1") is None
    await index.record_session("s1", "m1", "r1")
    await index.record_session("s1", "m2", "r7")  # the latest turn wins
    await index.record_session("user 2 with spaces\nand a newline", "m1", "r2")
    assert await index.session("s1") == ("m2", "r7")
    assert await index.session("user 2 with spaces\nand a newline") == ("m1", "r2")
    await asyncio.sleep(WAIT)
    assert await index.session("s1") is None


LONG = block_hashes(list(range(64 * 40)), salt=model_salt("m1"))  # 40 blocks: past the exact head


async def test_tiers_host_part_of_a_match(
    new_index: IndexFactory, settings_for: SettingsFor
) -> None:
    """Each held block carries its tiers: the match counts every tier, ``host`` the part
    past the leading device-held run; a block leaves the index when its last tier goes."""
    index = new_index(settings_for())
    await index.apply_events([
        BlockStored("m1", "dev", tuple(LONG)),  # no tier: device, as older workers send
        BlockStored("m1", "mixed", tuple(LONG[:30])),
        BlockStored("m1", "mixed", tuple(LONG[12:30]), tier="host"),  # offloaded copies
        BlockRemoved("m1", "mixed", tuple(LONG[12:30])),  # device copies dropped
        BlockStored("m1", "head", tuple(LONG[:5])),
        BlockStored("m1", "head", tuple(LONG[5:9]), tier="host"),
        BlockStored("m1", "disk", tuple(LONG[:20]), tier="disk"),
    ])
    got = (await index.lookup({"m1": LONG}))["m1"]
    assert got == {"dev": 40, "mixed": 30, "head": 9, "disk": 20}
    assert {r: m.host for r, m in got.items()} == {"dev": 0, "mixed": 18, "head": 4, "disk": 20}
    # A routed write puts the blocks back on the device; the host copies stay.
    await index.record_routed("m1", "mixed", LONG[:30])
    assert (await index.lookup({"m1": LONG}))["m1"]["mixed"].host == 0
    await index.apply_events([BlockRemoved("m1", "mixed", tuple(LONG[:12]))])  # no host copy
    assert "mixed" not in (await index.lookup({"m1": LONG}))["m1"]
    assert (await index.lookup({"m1": LONG[12:]}))["m1"]["mixed"] == 18  # 12..29: both tiers
    await index.apply_events([BlockRemoved("m1", "disk", tuple(LONG[10:20]), tier="disk"),
                              BlockRemoved("m1", "head", tuple(LONG[5:9]))])  # not on device
    got = (await index.lookup({"m1": LONG}))["m1"]
    assert (got["disk"], got["disk"].host) == (10, 10)
    assert (got["head"], got["head"].host) == (9, 4)
    await index.apply_events([AllBlocksCleared("m1", "disk")])
    assert "disk" not in (await index.lookup({"m1": LONG}))["m1"]
