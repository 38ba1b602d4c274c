"""PrefixKVStore's disk tier and leases (workers.engines.mlx.kv_store, workers.engines.mlx.kv_disk)
on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cache_service.events import BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes
from workers.engines.mlx.kv_disk import DiskTier
from workers.engines.mlx.kv_store import PrefixKVStore

BS = 4


def _save(path: str, kv: int) -> None:
    Path(path).write_text(json.dumps({"kv": kv, "pad": "x" * kv}))


def _load(path: str) -> int:
    return int(json.loads(Path(path).read_text())["kv"])


def _store(tmp: Path, mem: int = 100, disk: int = 1000, **kw: object) -> PrefixKVStore[int]:
    tier = DiskTier(tmp, disk, _save, _load)
    return PrefixKVStore("m", "r", mem, BS, 7, lambda kv: kv, 8, disk=tier, **kw)  # type: ignore[arg-type]


def kv_files(folder: Path) -> list[str]:
    """The KV files of a disk tier's folder (without their sidecars and lock)."""
    return sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))


def tiers(events: list[CacheEvent]) -> list[tuple[str, str, int]]:
    return [(type(e).__name__, e.tier, len(e.hashes)) for e in events
            if isinstance(e, BlockStored | BlockRemoved)]


def test_evicted_entry_spills_to_disk_and_comes_back(tmp_path: Path) -> None:
    s = _store(tmp_path)
    a, b = list(range(12)), list(range(100, 112))
    s.insert(a, 60)
    s.insert(b, 60)  # over the 100-byte memory budget: "a" goes to disk
    assert tiers(s.drain_events()) == [
        ("BlockStored", "device", 3), ("BlockStored", "device", 3),
        ("BlockStored", "disk", 3), ("BlockRemoved", "device", 3)]
    assert s.disk is not None and len(kv_files(s.disk.root)) == 1
    m = s.nearest(a + [5])
    assert m is not None and (m.kv, m.common, m.tier) == (60, 12, "disk")
    # Back in memory ("b" spills to make room), its file gone.
    assert tiers(s.drain_events()) == [
        ("BlockRemoved", "disk", 3), ("BlockStored", "device", 3),
        ("BlockStored", "disk", 3), ("BlockRemoved", "device", 3)]
    m = s.nearest(a)
    assert m is not None and m.tier == "device"
    s.clear()
    assert ("BlockRemoved", "disk", 3) in tiers(s.drain_events()) and not kv_files(s.disk.root)


def test_disk_budget_drops_the_oldest_files(tmp_path: Path) -> None:
    s = _store(tmp_path, mem=50, disk=200)
    for i in range(5):
        s.insert([i * 100 + j for j in range(8)], 40)
    assert s.disk is not None and s.disk.nbytes <= 200 and len(s.disk.entries) == 3  # 61 B each
    held = {h for e in s.drain_events() if isinstance(e, BlockStored) and e.tier == "disk"
            for h in e.hashes}
    assert block_hashes([0, 1, 2, 3], BS, 7)[0] in held  # announced, then dropped:
    assert s.nearest([0, 1, 2, 3, 4]) is None


def test_unreadable_or_unwritable_disk_is_a_miss(tmp_path: Path) -> None:
    s = _store(tmp_path)
    a = list(range(12))
    s.insert(a, 60)
    s.insert(list(range(100, 112)), 60)
    s.drain_events()
    assert s.disk is not None
    (only,) = kv_files(s.disk.root)
    (s.disk.root / only).write_text("not json")  # a corrupt file
    assert s.nearest(a) is None
    assert tiers(s.drain_events()) == [("BlockRemoved", "disk", 3)]

    def full(path: str, kv: int) -> None:
        raise OSError(28, "No space left on device")

    broken = PrefixKVStore("m", "r", 100, BS, 7, lambda kv: kv, 8,
                           disk=DiskTier(tmp_path / "full", 1000, full, _load))
    broken.insert(a, 60)
    broken.insert(list(range(100, 112)), 60)
    assert tiers(broken.drain_events())[-1] == ("BlockRemoved", "device", 3)  # just evicted
    assert broken.disk is not None
    assert broken.nearest(a) is None and not kv_files(broken.disk.root)


def test_leased_entries_are_evicted_last_within_their_share() -> None:
    now = [0.0]
    s = PrefixKVStore("m", "r", 100, BS, 7, lambda kv: kv, 8, lease_fraction=0.5,
                      clock=lambda: now[0])
    def held() -> list[int]:
        return [key[1][0] for key in s._entries]  # first token of each entry, LRU first

    s.insert([1] * 8, 40, lease_s=10.0)
    s.insert([2] * 8, 40)
    s.insert([3] * 8, 40)  # over budget: the unleased [2] goes, not the older leased [1]
    assert held() == [1, 3]
    now[0] = 11.0  # the lease ran out: [1] is the least recently used unleased entry
    s.insert([4] * 8, 40)
    assert held() == [3, 4]
    s.insert([5] * 8, 35, lease_s=10.0)  # [3] goes
    s.insert([6] * 8, 35, lease_s=10.0)  # 70 B would be leased > half of 100: no lease; [4] goes
    assert held() == [5, 6]
    s.insert([7] * 8, 40)  # the unleased [6] goes, the leased [5] stays
    assert held() == [5, 7]


def test_a_replica_on_the_same_folder_takes_back_its_files(tmp_path: Path) -> None:
    """A restart on the same ``disk_path``: the new replica's store announces the entries it
    took back (disk tier) and serves them; the first one's shutdown kept them."""
    s = _store(tmp_path)
    a, b = list(range(12)), list(range(100, 112))
    s.insert(a, 60)
    s.insert(b, 60)  # "a" spills to disk
    s.release()
    assert ("BlockRemoved", "disk", 3) in tiers(s.drain_events())
    again = PrefixKVStore("m", "r2", 100, BS, 7, lambda kv: kv, 8,  # type: ignore[arg-type]
                          disk=DiskTier(tmp_path, 1000, _save, _load))
    assert tiers(again.drain_events()) == [("BlockStored", "disk", 3)]
    m = again.nearest(a)
    assert m is not None and (m.kv, m.common, m.tier) == (60, 12, "disk")


def test_only_the_same_models_files_are_taken_back(tmp_path: Path) -> None:
    first = DiskTier(tmp_path, 1000, _save, _load, fingerprint="model-a")
    assert first.put((None, (1, 2, 3, 4)), 40, [11]) == []
    assert first.put(("tenant", (5, 6, 7, 8)), 40, [12]) == []
    first.close()
    same = DiskTier(tmp_path, 1000, _save, _load, fingerprint="model-a")
    assert set(same.entries) == {(None, (1, 2, 3, 4)), ("tenant", (5, 6, 7, 8))}
    assert same.entries[(None, (1, 2, 3, 4))].hashes == [11]
    same.close()
    other = DiskTier(tmp_path, 1000, _save, _load, fingerprint="model-b")
    assert not other.entries and not kv_files(other.root)  # never served, and removed


def test_replicas_sharing_a_folder_hold_a_slot_each(tmp_path: Path) -> None:
    one = DiskTier(tmp_path, 1000, _save, _load)
    two = DiskTier(tmp_path, 1000, _save, _load)
    assert one.root != two.root and one.root.parent == two.root.parent == tmp_path
    one.put((None, (1, 2, 3, 4)), 40, [11])
    one.close()
    three = DiskTier(tmp_path, 1000, _save, _load)  # takes the slot the first one left
    assert three.root == one.root and set(three.entries) == {(None, (1, 2, 3, 4))}


def test_a_broken_sidecar_or_a_stray_file_is_dropped(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1000, _save, _load)
    tier.put((None, (1, 2, 3, 4)), 40, [11])
    tier.put((None, (5, 6, 7, 8)), 40, [12])
    tier.close()
    (tier.root / "0.json").write_text("{")  # cut short
    (tier.root / "9.tmp").write_text("x")
    again = DiskTier(tmp_path, 1000, _save, _load)
    assert set(again.entries) == {(None, (5, 6, 7, 8))}
    assert sorted(os.listdir(again.root)) == ["1.json", "1.safetensors", "lock"]
    assert again.put((None, (9, 9, 9, 9)), 40, [13]) == []  # numbering goes on past the files
    assert "2.safetensors" in kv_files(again.root)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="workers.engines.mlx.kv_disk")


@pytest.mark.slow
async def test_mlx_prefix_evicted_to_disk_is_served_from_it_after_a_restart(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real mlx engine: an entry pushed out of its one-entry store is written with
    mlx-lm's save_prompt_cache, read back on the next hit (cached and disk tokens reported),
    and the events say where the blocks are. A replica restarted on the same ``disk_path``
    announces what it took back and serves it from disk."""
    from workers.engines.mlx.engine import MlxEngine
    from workers.protocol import Finished, GenerateRequest, SamplingParams

    def engine_on_disk(replica: str) -> MlxEngine:
        return MlxEngine(str(tiny_model_dir), "m", replica, 64, cache_bytes=1 << 20,
                         max_cache_entries=1, disk_bytes=64 << 20, disk_path=str(tmp_path))

    async def usage(engine: MlxEngine, rid: str, ids: list[int]) -> object:
        async for item in engine.generate(GenerateRequest(rid, ids, SamplingParams(max_tokens=1))):
            if isinstance(item, Finished):
                return item.usage
        raise AssertionError("no Finished")

    def kinds(engine: MlxEngine) -> set[tuple[str, str]]:
        return {(type(e).__name__, e.tier) for e in engine.drain_cache_events()
                if isinstance(e, BlockStored | BlockRemoved)}

    a, b = [10 + i % 50 for i in range(200)], [500 + i % 70 for i in range(200)]
    engine = engine_on_disk("r")
    await engine.start()
    try:
        await usage(engine, "a", a)
        await usage(engine, "b", b)  # one entry at most: "a" goes to disk
        assert kv_files(tmp_path / "slot-0")
        got = await usage(engine, "a2", a)  # back from disk; "b" goes there instead
        assert (got.cached_tokens, got.host_cached_tokens) == (199, 199)  # type: ignore[attr-defined]
        assert engine.load().routing_stats().get("reload_cost", 0) > 0  # measured, reported
        assert {("BlockStored", "disk"), ("BlockRemoved", "disk")} <= kinds(engine)
    finally:
        await engine.shutdown()
    assert kv_files(tmp_path / "slot-0")  # the operator's folder keeps its files
    restarted = engine_on_disk("r-restarted")
    await restarted.start()
    try:
        got = await usage(restarted, "b2", b)
        assert (got.cached_tokens, got.host_cached_tokens) == (199, 199)  # type: ignore[attr-defined]
        assert ("BlockStored", "disk") in kinds(restarted)  # reported to the index
    finally:
        await restarted.shutdown()
