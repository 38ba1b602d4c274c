"""The disk tier of ``PrefixKVStore``: entries evicted from memory are written to files
under a byte budget, and read back on a hit instead of being prefilled again.

The engine supplies ``save(path, kv)`` / ``load(path) -> kv`` (for mlx: mlx-lm's own
``save_prompt_cache`` / ``load_prompt_cache``, safetensors). Files live in one directory per
store (``root``), named by a counter; the least recently used go first past ``max_bytes``.

Faults never become errors: a write that fails (disk full, permissions) keeps nothing, a
read that fails (a missing, truncated or unreadable file) is a miss and drops the entry.
The caller turns each outcome into cache events (``disk`` tier).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

KV = TypeVar("KV")
Key = tuple[str | None, tuple[int, ...]]  # (cache salt, tokens)


@dataclass(slots=True)
class DiskEntry:
    key: Key
    path: Path
    nbytes: int
    hashes: list[int]


class DiskTier(Generic[KV]):
    """Files of evicted KV entries, LRU under ``max_bytes``."""

    def __init__(self, root: str | Path | None, max_bytes: int,
                 save: Callable[[str, KV], None], load: Callable[[str], KV]) -> None:
        self._owned = root is None  # a private temporary folder, removed by ``close``
        self.root = Path(tempfile.mkdtemp(prefix="kvroute-kv-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._save, self._load = save, load
        self.entries: OrderedDict[Key, DiskEntry] = OrderedDict()
        self.nbytes = 0
        self._names = itertools.count()
        self.read_s = 0.0  # cumulative seconds spent reading entries back, and their tokens
        self.read_tokens = 0

    def put(self, key: Key, kv: KV, hashes: list[int]) -> list[DiskEntry] | None:
        """Write ``kv``; the entries dropped to make room, or None if nothing was kept."""
        path = self.root / f"{next(self._names)}.safetensors"
        try:
            self._save(str(path), kv)
            size = path.stat().st_size
        except Exception as e:  # noqa: BLE001 - any write failure (ENOSPC, EACCES...) is a skip
            log.warning("kv disk tier: write failed (%s); the entry is dropped", e)
            _unlink(path)
            return None
        if size > self.max_bytes:
            _unlink(path)
            return None
        self.entries[key] = DiskEntry(key, path, size, hashes)
        self.nbytes += size
        dropped = []
        while self.nbytes > self.max_bytes:
            dropped.append(self.remove(next(iter(self.entries))))
        return dropped

    def take(self, key: Key) -> KV | None:
        """Read an entry back and forget it (it goes back to memory); None if unreadable."""
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        started = time.perf_counter()
        try:
            kv = self._load(str(entry.path))
            self.read_s += time.perf_counter() - started
            self.read_tokens += len(key[1])
            return kv
        except Exception as e:  # noqa: BLE001 - a bad file is a miss, never an error
            log.warning("kv disk tier: read of %s failed (%s); a miss", entry.path, e)
            return None
        finally:
            _unlink(entry.path)

    def remove(self, key: Key) -> DiskEntry:
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        _unlink(entry.path)
        return entry

    def close(self) -> None:
        for key in list(self.entries):
            self.remove(key)
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)


def reload_cost(disk: DiskTier[Any] | None, prefill_tokens: int, prefill_s: float) -> float:
    """Seconds per token read back / seconds per token prefilled, once both are measured
    (0: not yet; the router then assumes its default)."""
    if disk is None or not disk.read_tokens or prefill_tokens <= 0 or prefill_s <= 0:
        return 0.0
    per_read = disk.read_s / disk.read_tokens
    return min(1.0, max(1e-4, per_read / (prefill_s / prefill_tokens)))


def mlx_disk_tier(max_bytes: int, root: str | None) -> DiskTier[list[Any]] | None:
    """mlx-lm's own prompt-cache files (safetensors) under ``max_bytes``; None if 0."""
    if max_bytes <= 0:
        return None
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    return DiskTier(root, max_bytes, save_prompt_cache, load_prompt_cache)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
