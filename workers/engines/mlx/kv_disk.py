"""The disk tier of ``PrefixKVStore``: entries evicted from memory are written to files
under a byte budget, and read back on a hit instead of being prefilled again.

The engine supplies ``save(path, kv)`` / ``load(path) -> kv`` (for mlx: mlx-lm's own
``save_prompt_cache`` / ``load_prompt_cache``, safetensors). Files live in one directory per
store (``root``), named by a counter; the least recently used go first past ``max_bytes``.

A folder the operator names (``disk_path``) outlives the replica, as an SSD cache should: each
entry's file has a small sidecar (``N.json``: its tokens, cache salt, block hashes and the
model's fingerprint), and a replica started on the same folder takes back the entries of the
same model (oldest first, by modification time, under its own budget) and drops the rest. A
private temporary folder (no ``disk_path``) goes with the replica. Several replicas on one node
may share a ``disk_path``: each holds one ``slot-N`` subfolder under an exclusive lock, and a
replica started later takes a free slot, so a restarted replica finds its predecessor's files.

Faults never become errors: a write that fails (disk full, permissions) keeps nothing, a
read that fails (a missing, truncated or unreadable file) is a miss and drops the entry.
The caller turns each outcome into cache events (``disk`` tier).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
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
                 save: Callable[[str, KV], None], load: Callable[[str], KV],
                 fingerprint: str = "") -> None:
        self._owned = root is None  # a private temporary folder, removed by ``close``
        self._lock: int | None = None  # the fd holding this replica's slot of a shared folder
        if root is None:
            self.root = Path(tempfile.mkdtemp(prefix="kvroute-kv-"))
        else:
            self.root, self._lock = _claim_slot(Path(root))
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint  # the model the files were made by (restore checks it)
        self._save, self._load = save, load
        self.entries: OrderedDict[Key, DiskEntry] = OrderedDict()
        self.nbytes = 0
        self.read_s = 0.0  # cumulative seconds spent reading entries back, and their tokens
        self.read_tokens = 0
        self._names = itertools.count(self._restore())

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
        if size > self.max_bytes or not self._write_sidecar(path, key, hashes):
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
            _unlink(entry.path, _sidecar(entry.path))

    def remove(self, key: Key) -> DiskEntry:
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        _unlink(entry.path, _sidecar(entry.path))
        return entry

    def close(self) -> None:
        """A private folder goes with its files; an operator's folder keeps them for the next
        replica started on it."""
        if self._owned:
            for key in list(self.entries):
                self.remove(key)
            shutil.rmtree(self.root, ignore_errors=True)
        self.entries.clear()
        self.nbytes = 0
        if self._lock is not None:
            os.close(self._lock)  # the slot is free for the next replica
            self._lock = None

    def _write_sidecar(self, path: Path, key: Key, hashes: list[int]) -> bool:
        meta = {"fingerprint": self.fingerprint, "salt": key[0], "tokens": list(key[1]),
                "hashes": hashes}
        tmp = _sidecar(path).with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(meta, separators=(",", ":")))
            os.replace(tmp, _sidecar(path))  # never a half-written sidecar under its name
            return True
        except OSError as e:
            log.warning("kv disk tier: sidecar write failed (%s); the entry is dropped", e)
            _unlink(tmp)
            return False

    def _restore(self) -> int:
        """Take back a persistent folder's entries of this model (oldest first, within the
        budget), drop every other file; the next free file number."""
        if self._owned:
            return 0
        found: list[tuple[float, DiskEntry]] = []
        numbers = [-1]
        for path in self.root.glob("*.safetensors"):
            numbers += [int(path.stem)] if path.stem.isdigit() else []
            entry = self._read_sidecar(path)
            if entry is None:
                _unlink(path, _sidecar(path))
            else:
                found.append((path.stat().st_mtime, entry))
        for stray in [*self.root.glob("*.tmp"), *self.root.glob("*.json")]:
            if stray.suffix == ".tmp" or not stray.with_suffix(".safetensors").exists():
                _unlink(stray)  # a write cut short by a crash
        for _, entry in sorted(found, key=lambda f: f[0]):
            self.entries[entry.key] = entry
            self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self.remove(next(iter(self.entries)))
        if self.entries:
            log.info("kv disk tier: %d entries (%d bytes) taken back from %s",
                     len(self.entries), self.nbytes, self.root)
        return max(numbers) + 1

    def _read_sidecar(self, path: Path) -> DiskEntry | None:
        try:
            meta = json.loads(_sidecar(path).read_text())
            if meta["fingerprint"] != self.fingerprint:
                return None  # another model's KV: never served
            key: Key = (meta["salt"], tuple(int(t) for t in meta["tokens"]))
            return DiskEntry(key, path, path.stat().st_size, [int(h) for h in meta["hashes"]])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no sidecar, or a broken one: the file cannot be trusted


def reload_cost(disk: DiskTier[Any] | None, prefill_tokens: int, prefill_s: float) -> float:
    """Seconds per token read back / seconds per token prefilled, once both are measured
    (0: not yet; the router then assumes its default)."""
    if disk is None or not disk.read_tokens or prefill_tokens <= 0 or prefill_s <= 0:
        return 0.0
    per_read = disk.read_s / disk.read_tokens
    return min(1.0, max(1e-4, per_read / (prefill_s / prefill_tokens)))


def mlx_disk_tier(max_bytes: int, root: str | None,
                  fingerprint: str = "") -> DiskTier[list[Any]] | None:
    """mlx-lm's own prompt-cache files (safetensors) under ``max_bytes``; None if 0."""
    if max_bytes <= 0:
        return None
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    return DiskTier(root, max_bytes, save_prompt_cache, load_prompt_cache, fingerprint)


def model_fingerprint(model_path: str, block_size: int, salt: int) -> str:
    """What a restored file must have been made by: the model folder's config and weights
    (their sizes and times), and the block size and salt its hashes were made with."""
    h = hashlib.sha256(f"{Path(model_path).resolve()}|{block_size}|{salt}".encode())
    for path in sorted(Path(model_path).glob("*")):
        if path.suffix in (".json", ".safetensors") and path.is_file():
            st = path.stat()
            h.update(f"|{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _claim_slot(folder: Path) -> tuple[Path, int]:
    """The first ``slot-N`` of ``folder`` no live replica holds, locked (released with the
    process, so a crashed replica's slot is free again)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        slot = folder / f"slot-{n}"
        slot.mkdir(exist_ok=True)
        fd = os.open(slot / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, fd
        except OSError:
            os.close(fd)  # another replica's slot
    raise AssertionError("unreachable")


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _unlink(*paths: Path) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
