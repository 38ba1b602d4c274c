from cache_service.events import BlockRemoved, BlockStored
from cache_service.hashing import block_hashes
from workers.engines.mlx.kv_store import PrefixKVStore

BS = 4


def _store(max_bytes: int = 1000, max_entries: int = 8) -> PrefixKVStore[int]:
    return PrefixKVStore("m", "r", max_bytes, BS, 7, lambda kv: kv, max_entries)


def test_nearest_prefers_longest_common_prefix() -> None:
    s = _store()
    s.insert(list(range(10)), 10)
    s.insert([0, 1, 2, 99, 98], 5)
    m = s.nearest(list(range(8)) + [42])
    assert m is not None and m.common == 8 and m.kv == 10
    assert s.nearest([55, 56]) is None


def test_insert_emits_stored_hashes_once() -> None:
    s = _store()
    toks = list(range(9))
    s.insert(toks, 1)
    s.insert(toks[:4] + [77, 78, 79, 80], 1)  # shares block 0 only
    ev = s.drain_events()
    assert ev[0] == BlockStored("m", "r", tuple(block_hashes(toks, BS, 7)))
    other = block_hashes(toks[:4] + [77, 78, 79, 80], BS, 7)
    assert ev[1] == BlockStored("m", "r", (other[1],))
    assert s.drain_events() == []


def test_prefix_entries_are_replaced_by_extension() -> None:
    s = _store()
    s.insert(list(range(8)), 8)
    s.insert(list(range(12)), 12)
    assert len(s) == 1
    ev = s.drain_events()
    assert all(not isinstance(e, BlockRemoved) for e in ev)  # the blocks stay held


def test_byte_budget_evicts_lru_and_emits_removed() -> None:
    s = _store(max_bytes=10)
    a, b = list(range(8)), list(range(100, 108))
    s.insert(a, 6)
    s.nearest(a)
    s.insert(b, 6)  # over budget: a is the least recently used
    ev = s.drain_events()
    assert BlockRemoved("m", "r", tuple(block_hashes(a, BS, 7))) in ev
    assert s.held_hashes() == set(block_hashes(b, BS, 7))
    assert s.nbytes == 6
