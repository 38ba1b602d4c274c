"""Golden vectors and rules of the shared block hash. If a golden value changes, routers and
workers of different versions disagree: bump the Redis namespace along with it."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
import xxhash

from cache_service.hashing import (
    DEFAULT_BLOCK_SIZE,
    U32Ids,
    block_hashes,
    model_salt,
    token_bytes,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_default_block_size() -> None:
    assert DEFAULT_BLOCK_SIZE == 64


def test_model_salt_golden() -> None:
    assert model_salt(LLAMA) == 8653986750361980622
    assert model_salt("") == 6677608191789480903
    assert model_salt(LLAMA) != model_salt(LLAMA + "@rev2")


@pytest.mark.parametrize(
    ("tokens", "block_size", "salt", "expected"),
    [
        (list(range(128)), 64, 0, [15302102047924553749, 15763769194846966471]),
        (
            list(range(130)),
            16,
            8653986750361980622,
            [8350191945550146452, 15820795120315218996, 11578681526070924760],
        ),
        ([0] * 64, 64, 0, [8483491841116308575]),
        ([2**32 - 1] * 32, 16, 2**64 - 1, [8607706839944591595, 12662656661120388811]),
    ],
)
def test_block_hashes_golden(
    tokens: list[int], block_size: int, salt: int, expected: list[int]
) -> None:
    got = block_hashes(tokens, block_size=block_size, salt=salt)
    assert got[: len(expected)] == expected
    assert all(0 <= h < 2**64 for h in got)


def test_matches_documented_formula() -> None:
    """h_i = xxh3_64(le_u64(h_{i-1}) || le_u32 tokens), h_-1 = salt."""
    tokens = [7, 1 << 20, 3, 99999] * 8
    prev, expected = 12345, []
    for i in range(0, 32, 8):
        prev = xxhash.xxh3_64_intdigest(
            struct.pack("<Q", prev) + struct.pack("<8I", *tokens[i : i + 8])
        )
        expected.append(prev)
    assert block_hashes(tokens, block_size=8, salt=12345) == expected


def test_partial_tail_not_hashed() -> None:
    tokens = list(range(64 * 3))
    full = block_hashes(tokens)
    assert len(full) == 3
    assert block_hashes(tokens + [1, 2, 3]) == full
    assert block_hashes(tokens + list(range(63))) == full
    assert block_hashes(list(range(63))) == []
    assert block_hashes([]) == []


def test_chaining_identifies_whole_prefix() -> None:
    a = list(range(64)) + [5] * 64
    b = [1] + list(range(1, 64)) + [5] * 64  # same second block, different first block
    ha, hb = block_hashes(a), block_hashes(b)
    assert ha[0] != hb[0] and ha[1] != hb[1]
    c = list(range(64)) + [6] * 64  # same first block
    assert block_hashes(c)[0] == ha[0] and block_hashes(c)[1] != ha[1]


def test_salt_separates_models() -> None:
    tokens = list(range(64))
    assert block_hashes(tokens, salt=model_salt("a")) != block_hashes(tokens, salt=model_salt("b"))


def test_parent_continues_chain() -> None:
    tokens = list(range(1000))
    salt = model_salt(LLAMA)
    full = block_hashes(tokens, salt=salt)
    head = block_hashes(tokens[:128], salt=salt)
    tail = block_hashes(tokens[128:], salt=999, parent=head[-1])  # salt ignored with parent
    assert head + tail == full
    assert block_hashes(tokens[:64], parent=salt) == full[:1]


def test_input_types_agree() -> None:
    tokens = [3, 150_000, 0, 2**31] * 64
    expected = block_hashes(tokens)
    assert block_hashes(tuple(tokens)) == expected
    assert block_hashes(np.array(tokens, dtype=np.int64)) == expected
    assert block_hashes(np.array(tokens, dtype=np.uint32)) == expected
    assert block_hashes(np.array(tokens, dtype=">u4")) == expected  # byte order normalized


def test_held_bytes_are_sliced_and_ignored_once_the_ids_grow() -> None:
    tokens = [3, 150_000, 0, 2**31] * 64
    held = U32Ids(tokens)
    held.u32 = token_bytes(tokens)
    assert bytes(token_bytes(held, 130, 2)) == token_bytes(tokens[2:130])
    assert block_hashes(held, 16) == block_hashes(tokens, 16)
    held.append(7)  # grown after its bytes were taken: they no longer describe it
    assert token_bytes(held) == token_bytes([*tokens, 7])
    stale = U32Ids(tokens)
    stale.u32 = token_bytes([9] * len(tokens))  # a wrong memo of the right size is used:
    assert block_hashes(stale) != block_hashes(tokens)  # so only the prompt cache sets it


@pytest.mark.parametrize("bad", [[-1] * 64, [2**32] * 64])
def test_rejects_out_of_range_tokens(bad: list[int]) -> None:
    with pytest.raises(ValueError):
        block_hashes(bad)
    with pytest.raises(ValueError):
        block_hashes(np.array(bad, dtype=np.int64))


def test_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], block_size=0)


def test_speed_32k_tokens() -> None:
    tokens = np.random.default_rng(0).integers(0, 150_000, 32_768).tolist()
    block_hashes(tokens)
    best = min(_timed(block_hashes, tokens) for _ in range(5))
    assert best < 0.005, f"32k tokens took {best * 1e3:.2f} ms"  # ~0.4 ms typically


def _timed(fn: object, arg: list[int]) -> float:
    start = time.perf_counter()
    fn(arg)  # type: ignore[operator]
    return time.perf_counter() - start
