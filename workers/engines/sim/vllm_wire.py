"""The sim engine's KV-cache events in vLLM's ZMQ wire format, for peer routers.

``kvroute bench compare`` drives the same sim replicas through routers that index engine
KV events themselves (vllm-router ``kv_aware``, NVIDIA Dynamo's KV router). Both accept
vLLM's publisher format (``/work/shared/PEERS.md``, vLLM ``ZmqEventPublisher``):

* ZMQ PUB, three frames per batch: topic ``b""``, the batch's sequence number as 8
  big-endian bytes, and msgpack ``[timestamp, [event, ...], dp_rank]``;
* each event a map tagged ``"type"``: ``BlockStored`` (``block_hashes`` u64,
  ``parent_block_hash`` u64 or None, ``token_ids`` of those blocks, ``block_size``,
  ``lora_id``, ``medium``, ``lora_name``, ``group_idx``), ``BlockRemoved``
  (``block_hashes``, ``medium``, ``group_idx``), ``AllBlocksCleared``. vllm-router 0.1.17
  drops a batch whose BlockStored lacks ``lora_id``, ``medium`` or ``lora_name`` (they
  may be None, but must be there, as vLLM always sends them).

The peers re-hash ``token_ids`` themselves; our hashes only name blocks (for parents and
removals). The emulator's blocks are kvroute's canonical blocks (64 tokens); a peer given a
smaller block size ``b`` (a divisor) gets each one as ``64 / b`` sub-blocks whose last
sub-hash is the canonical hash (so a block's parent is its parent's canonical hash) and the
others ``xxh3(hash, i)``.

Events name hashes only, so the token ids of each prompt block are noted when the prompt
arrives (``note_prompt``) and kept in a bounded LRU until the block is stored. This is a
benchmark-only path (``ModelConfig.vllm_kv_events``), off by default.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import xxhash

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent

__all__ = ["BlockInfo", "VllmEventEncoder", "VllmEventPublisher"]

_SUB = struct.Struct("<QQ")
MEDIUM = "GPU"  # vLLM's name for the device tier


@dataclass(frozen=True, slots=True)
class BlockInfo:
    parent: int | None  # the canonical hash of the previous block; None for a prompt's first
    token_ids: np.ndarray  # the block's tokens (canonical block size)


class VllmEventEncoder:
    """CacheEvents -> vLLM event maps (pure; no sockets). See the module docstring."""

    def __init__(self, canonical_block_size: int, block_size: int,
                 max_blocks: int = 1 << 16) -> None:
        if block_size < 1 or canonical_block_size % block_size:
            raise ValueError(f"vLLM event block size {block_size} must divide the canonical "
                             f"block size {canonical_block_size}")
        self.canonical, self.block_size = canonical_block_size, block_size
        self._split = canonical_block_size // block_size
        self._blocks: OrderedDict[int, BlockInfo] = OrderedDict()
        self._max_blocks = max_blocks

    def note_prompt(self, token_ids: np.ndarray, hashes: Sequence[int]) -> None:
        """Remember the tokens of a prompt's blocks (``hashes``: its canonical chain)."""
        bs, parent = self.canonical, None
        for i, h in enumerate(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = BlockInfo(parent, token_ids[i * bs:(i + 1) * bs].copy())
            parent = h
        while len(self._blocks) > self._max_blocks:
            self._blocks.popitem(last=False)

    def sub_hashes(self, h: int) -> list[int]:
        """The peer-sized block hashes of canonical block ``h`` (the last one is ``h``)."""
        return [xxhash.xxh3_64_intdigest(_SUB.pack(h, i)) for i in range(self._split - 1)] + [h]

    def encode(self, events: Sequence[CacheEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                out.extend(self._stored(ev.hashes))
            elif isinstance(ev, BlockRemoved):
                hashes = [s for h in ev.hashes for s in self.sub_hashes(h)]
                out.append({"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM,
                            "group_idx": 0})
            elif isinstance(ev, AllBlocksCleared):
                out.append({"type": "AllBlocksCleared"})
        return out

    def _stored(self, hashes: Sequence[int]) -> Iterator[dict[str, Any]]:
        """One BlockStored per run of blocks that chain (each the next one's parent)."""
        run: list[int] = []
        for h in hashes:
            info = self._blocks.get(h)
            if info is None:  # never noted (cannot happen for the sim's own prompts): skip
                continue
            if run and info.parent != run[-1]:
                yield self._stored_event(run)
                run = []
            run.append(h)
        if run:
            yield self._stored_event(run)

    def _stored_event(self, run: list[int]) -> dict[str, Any]:
        tokens = np.concatenate([self._blocks[h].token_ids for h in run])
        return {
            "type": "BlockStored",
            "block_hashes": [s for h in run for s in self.sub_hashes(h)],
            "parent_block_hash": self._blocks[run[0]].parent,
            "token_ids": tokens.tolist(),
            "block_size": self.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
            "group_idx": 0,
        }


def pack_batch(seq: int, events: list[dict[str, Any]], ts: float | None = None,
               dp_rank: int = 0) -> list[bytes]:
    """The three ZMQ frames of one event batch."""
    body = msgpack.packb([time.time() if ts is None else ts, events, dp_rank])
    return [b"", seq.to_bytes(8, "big"), body]


class VllmEventPublisher:
    """A ZMQ PUB socket on loopback that publishes the engine's events as vLLM does.

    Sends never block (``NOBLOCK``; ZMQ drops batches nobody subscribed to, as vLLM's
    publisher does), so it runs on the engine's event loop."""

    def __init__(self, canonical_block_size: int, block_size: int,
                 host: str = "127.0.0.1") -> None:
        import zmq  # the bench extra; only replicas with vllm_kv_events import it

        self.encoder = VllmEventEncoder(canonical_block_size, block_size)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self._seq = 0
        self._noblock = zmq.NOBLOCK
        self._again = zmq.Again

    def note_prompt(self, token_ids: np.ndarray, hashes: Sequence[int]) -> None:
        self.encoder.note_prompt(token_ids, hashes)

    def publish(self, events: Sequence[CacheEvent]) -> None:
        encoded = self.encoder.encode(events)
        if not encoded:
            return
        frames = pack_batch(self._seq, encoded)
        self._seq += 1
        try:
            self._sock.send_multipart(frames, flags=self._noblock)
        except self._again:  # high-water mark reached: dropped, like vLLM's publisher
            pass

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
