"""The prompt cache's second level: token ids of prompt segments shared in Redis.

A router replica that misses its local prefix cache (``router.prompt.cache``) for a long
prompt (after a restart, a scale-out, a session's first visit to this replica) asks Redis
for the ids of the longest prefix another replica tokenized, tokenizes only the rest and
writes back what it tokenized, from a background thread.

Keys: ``{namespace}:tok:<digest>``, where the digest chains the rendered text's segments
(the same boundary cuts as the local cache): ``d_0`` = the tokenizer's and the template's
fingerprints, the boundary tokens and the scope (how the text was encoded; the tenant
under isolation: ``router.prompt.cache.Scope``), ``d_j = blake2b(d_{j-1} + segment_j)``.
An entry, keyed by the digest at its last cut, holds a run of consecutive segments: each
one's text and token ids.

Exactness: a reader uses an entry only if each of its segments' stored text equals its own
segment at the same position (compared, not trusted to the digest); the entry's key is the
digest at one of the reader's own cuts, so its segments start and end at the reader's cuts.
Each stored segment's ids are the standalone tokenization of that text by the same
tokenizer (its fingerprint seeds the digests), and a segment between two boundary cuts
tokenizes alone as within the whole text (``router.prompt.cache``'s argument), so the ids
are bit-identical to full tokenization. Segments no entry covers (an expired or lost key,
e.g. a common system prompt written long ago) are tokenized with the rest.

Each key's share: an admitted request's writes (and the renewals of what it read) count
against its key, ``key_bytes`` at most within a TTL (``router.prompt_cache.redis_bytes_per_key``),
in counters ``{namespace}:tokuse:<key>:<quarter of the TTL>`` that live a TTL and a quarter;
the share is their sum, so it may over-count by a quarter of a TTL's writes, never
under-count (two replicas writing at once may each pass it by one entry). Past it, the
key's new segments are not shared: its replicas tokenize them themselves. ``on_share``
reports each key's share, its written and its refused bytes (``kvroute_key_redis_*``).

Failure: a short socket timeout and ``cache_service.breaker.CircuitBreaker``: a dead or
slow Redis costs at most one timeout per back-off, then the replica tokenizes. Writes go
through a bounded queue to one thread (dropped when the queue is full or the circuit open).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import queue
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import redis

from cache_service.breaker import CircuitBreaker
from cache_service.redis_conn import sync_client

log = logging.getLogger(__name__)

MIN_LOOKUP_CHARS = 16384  # below ~4k tokens (~5 ms cold) tokenizing beats a round trip
MAX_ENTRY_BYTES = 8 << 20  # one entry's bound; a longer run is split at segment cuts
QUARTERS = 4  # a key's share is counted in quarters of the TTL
ShareReport = Callable[[str, int, int, int], None]  # key, its share, bytes written, refused
_MAGIC = b"KT1\0"
_QUEUE = 256
_U32 = next(c for c in "IL" if array(c).itemsize == 4)


class Segment(Protocol):
    """A local cache node as the writer sees it."""

    text: str
    ids: list[int]
    digest: bytes
    stored: int  # 0: not in Redis, 1: queued, 2: written


def chain_seed(fingerprint: str, boundaries: Sequence[str], scope: Sequence[str] = ()
               ) -> bytes:
    """``d_0``: the tokenizer and template, the boundary tokens, and the scope (how the text
    was encoded, and the tenant under isolation: ``router.prompt.cache.Scope``)."""
    return hashlib.blake2b("\0".join([fingerprint, *boundaries, "\1", *scope]).encode(),
                           digest_size=16).digest()


def chain(prev: bytes, pieces: Sequence[str]) -> list[bytes]:
    """The digests at the end of each piece, continuing the chain from ``prev``."""
    out = []
    for piece in pieces:
        prev = hashlib.blake2b(prev + piece.encode("utf-8", "surrogatepass"),
                               digest_size=16).digest()
        out.append(prev)
    return out


def pack(texts: Sequence[str], ids: Sequence[Sequence[int]]) -> bytes:
    raw = [t.encode("utf-8", "surrogatepass") for t in texts]
    head = struct.pack(f"<I{2 * len(raw)}I", len(raw),
                       *(n for r, i in zip(raw, ids, strict=True) for n in (len(r), len(i))))
    flat = array(_U32, itertools.chain.from_iterable(ids))
    if sys.byteorder == "big":
        flat.byteswap()  # stored little-endian
    return b"".join([_MAGIC, head, *raw, flat.tobytes()])


def unpack(blob: bytes) -> tuple[list[str], list[list[int]]]:
    """An entry's segments; ``ValueError`` if it is not one (truncated, foreign)."""
    if not blob.startswith(_MAGIC):
        raise ValueError("not a token entry")
    (n,) = struct.unpack_from("<I", blob, 4)
    sizes = struct.unpack_from(f"<{2 * n}I", blob, 8)
    pos = 8 + 8 * n
    texts = []
    for size in sizes[::2]:
        texts.append(blob[pos:pos + size].decode("utf-8", "surrogatepass"))
        pos += size
    flat = np.frombuffer(blob, dtype="<u4", offset=pos)
    if len(flat) != sum(sizes[1::2]):
        raise ValueError("token entry of the wrong length")
    ids, at = [], 0
    for count in sizes[1::2]:
        ids.append(flat[at:at + count].tolist())
        at += count
    return texts, ids


def cover(pieces: Sequence[str], blobs: Sequence[bytes | None]
          ) -> tuple[list[list[int] | None], list[int]]:
    """The ids of each of ``pieces`` (segments right after the local prefix) that Redis's
    entries hold (None where none does: the caller tokenizes those), and which entries (by
    piece index) gave them. ``blobs[j]`` is the entry keyed by the digest at the end of
    ``pieces[j]``; an entry's segment counts only if its text equals the piece's."""
    out: list[list[int] | None] = [None] * len(pieces)
    used: list[int] = []
    for j, blob in enumerate(blobs, 1):
        if blob is None:
            continue
        try:
            texts, ids = unpack(blob)
        except (ValueError, struct.error, UnicodeDecodeError):
            continue
        start = j - len(texts)
        use = max(start, 0)
        if texts[use - start:] == list(pieces[use:j]):
            out[use:j] = ids[use - start:]
            used.append(j - 1)
    return out, used


class TokenStore:
    """Reads on the caller's thread (a short timeout); writes from one background thread."""

    def __init__(self, url: str, namespace: str, ttl_s: float, timeout_s: float = 0.05,
                 backoff_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 key_bytes: int = 0, on_share: ShareReport | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.prefix = f"{{{namespace}}}:tok:"
        self.use_prefix = f"{{{namespace}}}:tokuse:"
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.key_bytes, self.on_share, self._wall = key_bytes, on_share, wall
        self._quarter_s = ttl_s / QUARTERS
        self.min_lookup_chars = MIN_LOOKUP_CHARS
        self._redis = sync_client(url, socket_timeout=timeout_s,
                                  socket_connect_timeout=timeout_s)
        self.breaker = CircuitBreaker("prompt token cache", backoff_s, clock=clock,
                                      on_error=self._count, meanwhile="tokenizing locally")
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(_QUEUE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.counts = {"reads": 0, "read_errors": 0, "writes": 0, "write_errors": 0,
                       "dropped": 0, "hit_entries": 0, "over_share": 0}

    def _count(self, op: str) -> None:
        self.counts[f"{op}_errors"] += 1

    def key(self, digest: bytes) -> str:
        return self.prefix + digest.hex()

    def fetch(self, digests: Sequence[bytes]) -> list[bytes | None]:
        """The entries at ``digests`` (one MGET); all None when Redis fails or the circuit
        is open."""
        if not digests or not self.breaker.allow():
            return [None] * len(digests)
        self.counts["reads"] += 1
        try:
            got = self._redis.mget([self.key(d) for d in digests])
        except (redis.RedisError, OSError) as e:
            self.breaker.failed("read", e)
            return [None] * len(digests)
        except BaseException:
            self.breaker.release()
            raise
        self.breaker.succeeded()
        return list(got)

    # -- writes, off the request's path ------------------------------------------------
    def put(self, runs: Sequence[Sequence[Segment]], owner: str | None = None) -> None:
        """Queue runs of consecutive segments (each written as entries keyed by the digest
        of their last segment), counted against ``owner``'s share. The caller marked them
        ``stored = 1``."""
        self._submit("put", (runs, owner),
                     lambda: [setattr(s, "stored", 0) for r in runs for s in r])

    def touch(self, digests: list[bytes], size: int, owner: str | None = None) -> None:
        """Renew the TTL of entries a read used (``size`` bytes, counted against
        ``owner``'s share as a write would be: a renewal keeps them another TTL)."""
        self._submit("touch", (digests, size, owner), lambda: None)

    def _submit(self, op: str, arg: Any, undo: Callable[[], Any]) -> None:
        self._start()
        try:
            self._queue.put_nowait((op, arg))
        except queue.Full:
            self.counts["dropped"] += 1
            undo()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                                name="kvroute-token-store")
                self._thread.start()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the queued writes are done (tests, benchmarks)."""
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.005)

    def _write_loop(self) -> None:
        while True:
            op, arg = self._queue.get()
            try:
                self._write(op, arg)
            except Exception:  # never let the writer die
                log.exception("token store writer")
            finally:
                self._queue.task_done()

    def _write(self, op: str, arg: Any) -> None:
        segs = [s for run in arg[0] for s in run] if op == "put" else []
        if not self.breaker.allow():
            self.counts["dropped"] += 1
            for s in segs:
                s.stored = 0
            return
        if op == "put":
            writes = [(self.key(part[-1].digest), pack([s.text for s in part],
                                                       [s.ids for s in part]))
                      for run in arg[0] for part in split(run)]
            owner, size = arg[1], sum(len(blob) for _, blob in writes)
        else:
            writes, size, owner = [], arg[1], arg[2]
        try:
            if not self._charge(owner, size):
                self.counts["over_share"] += 1
                for s in segs:
                    s.stored = 0
                return
            pipe = self._redis.pipeline(transaction=False)
            for key, blob in writes:
                pipe.set(key, blob, px=self.ttl_ms)
            for d in [] if op == "put" else arg[0]:
                pipe.pexpire(self.key(d), self.ttl_ms)
            pipe.execute()
        except (redis.RedisError, OSError) as e:
            self.breaker.failed("write", e)
            for s in segs:
                s.stored = 0
            return
        self.breaker.succeeded()
        self.counts["writes"] += 1
        for s in segs:
            s.stored = 2

    def _charge(self, owner: str | None, size: int) -> bool:
        """Count ``size`` bytes against ``owner``'s share; False (nothing counted) when it
        would pass ``key_bytes``. No owner (keys off) or no bound: always True."""
        if owner is None or not self.key_bytes:
            return True
        now = int(self._wall() // self._quarter_s)
        keys = [f"{self.use_prefix}{owner}:{now - i}" for i in range(QUARTERS + 1)]
        share = sum(int(v or 0) for v in self._redis.mget(keys))
        if share + size > self.key_bytes:
            if self.on_share is not None:
                self.on_share(owner, share, 0, size)
            return False
        pipe = self._redis.pipeline(transaction=False)
        pipe.incrby(keys[0], size)
        pipe.pexpire(keys[0], self.ttl_ms + int(self._quarter_s * 1000))
        pipe.execute()
        if self.on_share is not None:
            self.on_share(owner, share + size, size, 0)
        return True

    def close(self) -> None:
        self._redis.close()


def split(run: Sequence[Segment]) -> list[list[Segment]]:
    """A run cut into entries of at most ``MAX_ENTRY_BYTES`` (a segment larger than that
    ends the run: what follows could not chain)."""
    out: list[list[Segment]] = []
    part: list[Segment] = []
    size = 0
    for seg in run:
        n = 4 * len(seg.text) + 4 * len(seg.ids) + 8
        if n > MAX_ENTRY_BYTES:
            break
        if part and size + n > MAX_ENTRY_BYTES:
            out.append(part)
            part, size = [], 0
        part.append(seg)
        size += n
    if part:
        out.append(part)
    return out
