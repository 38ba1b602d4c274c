"""Prefix block hashing shared by the router and the workers.

A prompt's token ids are cut into blocks of ``block_size`` tokens and each FULL block gets a
chained 64-bit hash::

    h_0 = xxh3_64(le_u64(salt)   || le_u32(tokens of block 0))
    h_i = xxh3_64(le_u64(h_{i-1}) || le_u32(tokens of block i))

so ``h_i`` identifies the whole prefix ``tokens[: (i + 1) * block_size]``, not just block ``i``.
Two prompts share their first ``k`` hashes iff they share their first ``k`` full blocks. The
partial tail (``len(tokens) % block_size`` tokens) is never hashed: an engine cannot reuse a
partially filled block across requests either, and hashing it would make every prompt's last
hash unique noise in the index.

Hash function: XXH3-64 (``xxhash.xxh3_64_intdigest``, seed 0). It is the fastest xxHash
variant for short inputs (a block is 8 + 4 * block_size bytes), and 64 bits keep the expected
number of collisions negligible for the ~1e9 distinct prefixes a fleet might ever see.
The bytes are fixed (little-endian, unsigned), so every process, platform and language gets the
same values; ``tests/cache_service/test_hashing.py`` pins golden vectors. Never change the
layout without changing those vectors AND the Redis namespace, or routers and workers drift.

Block size: ``DEFAULT_BLOCK_SIZE = 64``.
  * Index size: a 32k-token prompt is 512 hashes at 64 (2048 at 16). Each (block, replica)
    is one Redis HASH field (~75 bytes) and one probe in the lookup script (~0.25 us), so 64
    keeps the longest prompts' lookups around a millisecond and Redis memory 4x below
    engine-granular (16) hashing: ~1.2 bytes of Redis per cached KV token and replica.
  * Precision: routing only needs to rank replicas; losing up to 63 tokens of a shared prefix
    (under 1 ms of prefill on a GPU, a few ms on CPU) does not change which replica is best.
    Chat prompts share system prompts / earlier turns that are hundreds to thousands of tokens.
  * Engines: vLLM's KV blocks are 16 tokens (64 is a multiple, so a routed block boundary is
    always an engine block boundary); mlx-lm's prompt cache is token-granular; Mooncake traces
    use 512, which is too coarse for short chat turns (a 400-token system prompt would never
    match).
Workers compute hashes with this same function and block size (not the engine's own hashes).
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import xxhash

from deploy.config.index import DEFAULT_BLOCK_SIZE  # the config owns the default

__all__ = [
    "DEFAULT_BLOCK_SIZE", "HASH_MASK", "HashMemo", "block_hashes", "model_salt", "tenant_salt",
    "U32Ids", "token_bytes",
]

HASH_MASK: int = (1 << 64) - 1

_U64 = struct.Struct("<Q")
_U32_MAX = (1 << 32) - 1
_SALT_DOMAIN = b"kvroute/model-salt/v1\x00"
_TENANT_DOMAIN = b"kvroute/tenant-salt/v1\x00"


def model_salt(model_identity: str) -> int:
    """64-bit salt for a model/tokenizer identity (e.g. "org/model@revision").

    Salting the chain keeps identical token ids of different tokenizers/models apart.
    """
    return xxhash.xxh3_64_intdigest(_SALT_DOMAIN + model_identity.encode("utf-8"))


def tenant_salt(salt: int, cache_salt: str | None) -> int:
    """``salt`` (a model's) narrowed to one tenant: ``cache_salt`` (the API key's name when
    ``index.tenant_isolation`` is on) enters the chain's first hash, so two tenants' identical
    prompts share no block hash, in the index or in an engine's cache. ``None``: ``salt``."""
    if cache_salt is None:
        return salt
    return xxhash.xxh3_64_intdigest(
        _TENANT_DOMAIN + _U64.pack(salt & HASH_MASK) + cache_salt.encode("utf-8"))


class HashMemo(Protocol):
    """Chained hashes already known for a prefix of a prompt (``router.prompt.cache``):
    ``known`` returns the hashes of its leading full blocks, ``learn`` is told the whole
    list once computed. Chained hashes are a prefix property, so the prompt's hashes are
    ``known`` followed by the chain continued from ``known[-1]``."""

    def known(self, block_size: int, salt: int) -> list[int]: ...

    def learn(self, block_size: int, salt: int, hashes: Sequence[int]) -> None: ...


class U32Ids(list[int]):
    """Token ids that carry their u32 bytes (``u32``), made where those bytes are at hand
    (the loopback wire, the router's prompt cache) and never mutated after. Pickles as a
    plain list."""

    __slots__ = ("u32",)

    def __reduce_ex__(self, protocol: Any) -> Any:  # type: ignore[override]
        return (list, (), None, iter(self))


def token_bytes(token_ids: Sequence[int], n_tokens: int | None = None,
                start: int = 0) -> bytes | memoryview:
    """Token ids ``[start, n_tokens)`` as little-endian uint32 bytes (validated, no wrap):
    the layout of the block hashes and of the loopback wire. Ids that carry their bytes
    (``U32Ids``) are sliced, not converted: 2-5 ms per 155k ids otherwise, on every
    request."""
    stop = len(token_ids) if n_tokens is None else n_tokens
    held: bytes | None = getattr(token_ids, "u32", None)
    if held is not None and len(held) == 4 * len(token_ids):
        return memoryview(held)[4 * start:4 * stop]
    if isinstance(token_ids, np.ndarray):
        arr = token_ids[start:stop]
        if arr.dtype != np.dtype("<u4"):
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _U32_MAX):
                raise ValueError("token ids must be in [0, 2**32)")
            arr = arr.astype("<u4")
        return arr.tobytes()
    try:
        packed = array.array("I", token_ids[start:stop])
    except OverflowError as exc:
        raise ValueError("token ids must be in [0, 2**32)") from exc
    if packed.itemsize != 4:  # pragma: no cover - exotic platforms
        return np.asarray(packed, dtype="<u4").tobytes()
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def block_hashes(
    token_ids: Sequence[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    salt: int = 0,
    parent: int | None = None,
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (ints in [0, 2**64)).

    ``parent`` continues an existing chain: ``block_hashes(a + b)`` equals
    ``block_hashes(a) + block_hashes(b, parent=block_hashes(a)[-1])`` when ``len(a)`` is a
    multiple of ``block_size``. When ``parent`` is given, ``salt`` is ignored (it is already
    folded into the parent). ``token_ids`` carrying a ``hash_memo`` (a ``HashMemo``, set by
    the router's prompt cache) only hash the blocks past the memo's; the values are the same.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n_blocks = len(token_ids) // block_size
    memo: HashMemo | None = getattr(token_ids, "hash_memo", None) if parent is None else None
    if memo is None:
        return _chain(token_ids, 0, n_blocks, block_size, salt if parent is None else parent)
    known = memo.known(block_size, salt)[:n_blocks]
    rest = _chain(token_ids, len(known), n_blocks, block_size, known[-1] if known else salt)
    out = known + rest
    memo.learn(block_size, salt, out)
    return out


def _chain(token_ids: Sequence[int], first: int, n_blocks: int, block_size: int,
           prev: int) -> list[int]:
    """Hashes of blocks ``[first, n_blocks)``, chained from ``prev``."""
    if n_blocks <= first:
        return []
    prev &= HASH_MASK
    data = memoryview(token_bytes(token_ids, n_blocks * block_size, first * block_size))
    step = 4 * block_size
    digest = xxhash.xxh3_64_intdigest
    pack = _U64.pack
    out: list[int] = []
    append = out.append
    for start in range(0, (n_blocks - first) * step, step):
        prev = digest(pack(prev) + data[start : start + step])
        append(prev)
    return out
