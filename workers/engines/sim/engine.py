"""The ``sim`` engine: an engine EMULATOR (no model runs) behind the Engine protocol.

For testing and benchmarking routing at scale on CPUs, like NVIDIA Dynamo's mocker or
llm-d's inference simulator. The model (KV cache of C blocks with LRU eviction, FIFO
prefill at P tok/s, batch-dependent TPOT, deterministic tokens) lives in
``workers.engines.sim.core.SimCore``, a clock-free state machine; this adapter drives it in real
time with the event loop's clock: a single timer (``loop.call_at``) fires at the core's
next event time, and outputs are dispatched to per-request queues. No threads.

The adapter hashes token ids into canonical block hashes (``block_hashes`` with
``model_salt(model_name)`` and the router's block size), so its cache events are exactly
the router's hashes. Output tokens are whole words of the model's own tokenizer when the
model folder has one (``workers.engines.sim.vocab``: the text tokenizes back to the same
ids), else ``f" w{t}"`` per token ``t``; stop strings are matched on that text
(``StopMatcher``) and end the request with finish_reason "stop".
Of the sampling controls it honours ``max_tokens``, ``seed``, stop strings, ``ignore_eos``,
``min_tokens`` and ``stop_token_ids``; the others (temperature, top-p, top-k, min-p, the
penalties, logit bias, bad words) are accepted with no effect: the output is a pure
function of (prompt, seed, position).

With a ``script`` (``workers.engines.sim.script.SimScript``, from ``engine_kwargs.script_path``)
a prompt that matches one of its rules gets the rule's reply instead: the core emits the
reply's real token ids and this adapter streams their real text, so the router's tool-call
parser sees the model's own markup. Without a script no prompt is decoded.

A request with a ``Constraint`` (structured output, a forced tool call) that no script
rule answers gets a minimal reply the constraint accepts (``workers.engines.sim.structured``),
spelled with the model's tokenizer when there is one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from cache_service.events import CacheEvent
from cache_service.hashing import (
    DEFAULT_BLOCK_SIZE,
    block_hashes,
    model_salt,
    tenant_salt,
    token_bytes,
)
from workers.engines.sim.core import LABEL, SimCore, SimFinish, SimOutput, SimParams, SimRequest
from workers.engines.sim.logprobs import SimLogprobs
from workers.engines.sim.structured import spelled
from workers.engines.sim.vocab import SimVocab
from workers.engines.stops import StopMatcher
from workers.protocol import (
    EngineError,
    Finished,
    GenerateRequest,
    LoadStats,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    Usage,
    take_ready,
)

if TYPE_CHECKING:  # only engines with a script pay for its tokenizer imports
    from workers.engines.sim.script import SimScript
    from workers.engines.sim.vllm_wire import VllmEventPublisher

__all__ = ["SimEngine", "SimParams", "token_text"]


def token_text(token_id: int) -> str:
    """The emulator's detokenization: one word per token."""
    return f" w{token_id}"


def sim_logprobs(stream: _Stream, sp: SamplingParams, prompt: list[int]) -> None:
    """Give ``stream`` its synthetic logprobs (``workers.engines.sim.logprobs``), if asked."""
    if sp.logprobs is None and sp.prompt_logprobs is None:
        return
    vocab = stream.vocab
    lp = SimLogprobs(vocab.ids if vocab else None,
                     token_text if vocab is None else lambda t: vocab.texts.get(t, token_text(t)))
    if sp.logprobs is not None:
        stream.logprobs, stream.top = lp, sp.logprobs
    if sp.prompt_logprobs is not None:
        stream.prompt_logprobs = lp.prompt(prompt, sp.prompt_logprobs)


@dataclass(slots=True)
class _Stream:
    stops: StopMatcher
    queue: asyncio.Queue[TokenChunk | Finished] = field(default_factory=asyncio.Queue)
    held: list[int] = field(default_factory=list)  # ids whose text the StopMatcher holds
    pieces: tuple[str, ...] | None = None  # a scripted reply's text per token
    min_tokens: int = 0
    vocab: SimVocab | None = None
    logprobs: SimLogprobs | None = None  # when the request asks for them
    top: int = 0
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # sent with the first chunk

    def text(self, token_id: int, index: int) -> str:
        if self.pieces is not None:
            return self.pieces[index]
        return token_text(token_id) if self.vocab is None else self.vocab.text(token_id)

    def hold(self, token_id: int, index: int, text: str) -> None:
        self.held.append(token_id)
        if self.logprobs is not None:
            self.held_logprobs.append(self.logprobs.at(token_id, index, self.top, text))

    def release(self, text: str) -> TokenChunk:
        """The held tokens as one chunk of ``text``."""
        chunk = TokenChunk(text, tuple(self.held), tuple(self.held_logprobs),
                           self.prompt_logprobs)
        self.held, self.held_logprobs, self.prompt_logprobs = [], [], ()
        return chunk


class SimEngine:
    """Engine EMULATOR replica (see the module docstring)."""

    label = LABEL

    def __init__(
        self,
        model_name: str,
        replica_id: str,
        block_size: int = DEFAULT_BLOCK_SIZE,
        params: SimParams | None = None,
        script: SimScript | None = None,
        vocab: SimVocab | None = None,
    ) -> None:
        params = params or SimParams(block_size=block_size)
        if params.block_size != block_size:
            # Events must be the router's hashes, so emulated blocks are canonical blocks.
            raise ValueError(
                f"sim block_size {params.block_size} != canonical block size {block_size}"
            )
        self.model_name, self.replica_id = model_name, replica_id
        self.params = params
        self._script, self._vocab = script, vocab
        self._salt = model_salt(model_name)
        self._core = SimCore(self.params, model_name, replica_id,
                             vocab.ids if vocab is not None else None)
        self._streams: dict[str, _Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._events: list[CacheEvent] = []
        self._tap: VllmEventPublisher | None = None

    def set_event_tap(self, tap: VllmEventPublisher) -> None:
        """Also publish the cache events as they happen in vLLM's wire format (benchmarks
        of peer routers, ``workers.engines.sim.vllm_wire``), besides kvroute's own drain."""
        self._tap = tap

    @property
    def kv_events_endpoint(self) -> str | None:
        return self._tap.endpoint if self._tap is not None else None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]:
        rid, sp = request.request_id, request.sampling
        if self._loop is None or self._closed:
            raise EngineError(f"{LABEL} is not running")
        if not request.token_ids:
            raise EngineError("empty prompt")
        if rid in self._streams:
            raise EngineError(f"request {rid!r} is already running")
        # The wire's ids carry their u32 bytes (U32Ids): a view, no copy. np.asarray on a
        # list of 155k ints took 5.7 ms of the loop (a plain list here: 2.2 ms).
        ids = np.frombuffer(token_bytes(request.token_ids), dtype="<u4")
        reply = self._script.reply_for(request.token_ids) if self._script else None
        if sp.constraint is not None and reply is None:  # a valid reply without a model
            from workers.engines.sim.script import ScriptedReply

            reply = ScriptedReply(*spelled(sp.constraint, self._vocab and self._vocab.tokenizer))
        hashes = block_hashes(ids, self.params.block_size,
                              tenant_salt(self._salt, request.cache_salt))
        if self._tap is not None:
            self._tap.note_prompt(ids, hashes)
        spec = SimRequest(
            rid,
            hashes,
            prompt_len=len(ids),
            max_tokens=sp.max_tokens,
            prompt_key=xxhash.xxh3_64_intdigest(ids.tobytes()),
            seed=sp.seed or 0,
            eos=not sp.ignore_eos,
            script=reply.token_ids if reply else None,
            lease_s=request.lease_s,
            min_tokens=sp.min_tokens,
            stop_ids=frozenset(sp.stop_token_ids),
            prefill_all=sp.prompt_logprobs is not None,
        )
        stream = _Stream(StopMatcher(sp.stop), pieces=reply.pieces if reply else None,
                         vocab=self._vocab, min_tokens=sp.min_tokens)
        sim_logprobs(stream, sp, request.token_ids)
        self._streams[rid] = stream
        self._core.submit(spec, self._now())
        self._reschedule()
        try:
            while True:
                for item in take_ready(await stream.queue.get(), stream.queue):
                    yield item
                    if isinstance(item, Finished):
                        return
        finally:
            if self._streams.get(rid) is stream:  # the consumer left early: abort
                del self._streams[rid]
                self._core.cancel(rid, self._now())
                self._reschedule()

    async def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            fin = self._core.cancel(request_id, self._now())
            if fin is not None:
                self._dispatch([fin])
            self._reschedule()

    def drain_cache_events(self) -> list[CacheEvent]:
        self._pull_events()
        events, self._events = self._events, []
        return events

    def _pull_events(self) -> None:
        """Take the core's new events: kept for ``drain_cache_events``, and published at
        once to the tap (a peer router learns of a block when the engine stores it)."""
        if events := self._core.drain_events():
            self._events.extend(events)
            if self._tap is not None:
                self._tap.publish(events)

    def load(self) -> LoadStats:
        # The core's clock lags between events: measure the running prefill's progress now.
        # Its time is the loop's; routers compare wall-clock times.
        load = self._core.load(self._now() if self._loop is not None else None)
        return replace(load, taken_at=time.time())

    async def check_health(self) -> None:
        if self._loop is None or self._closed:
            raise EngineError(f"{LABEL} is not running")

    async def shutdown(self) -> None:
        if self._closed:
            return
        for rid in list(self._streams):
            await self.abort(rid)
        self._closed = True
        if self._tap is not None:
            self._tap.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._core.clear()

    def reset_cache(self) -> None:
        """Drop the prefix cache (emits AllBlocksCleared)."""
        self._core.clear()
        self._pull_events()

    # -- driving the core in real time -------------------------------------------------
    def _now(self) -> float:
        assert self._loop is not None
        return max(self._loop.time(), self._core.now)

    def _reschedule(self) -> None:
        self._pull_events()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        t = self._core.next_event_time()
        if t is not None and not self._closed and self._loop is not None:
            self._timer = self._loop.call_at(t, self._tick, t)

    def _tick(self, due: float) -> None:
        self._timer = None
        # call_at may fire a hair early (clock resolution): the event is due, run it.
        self._dispatch(self._core.advance(max(due, self._now())))
        self._reschedule()

    def _dispatch(self, outputs: list[SimOutput]) -> None:
        for out in outputs:
            rid = out.request_id
            stream = self._streams.get(rid)
            if stream is None:  # its consumer already left
                continue
            if isinstance(out, SimFinish):
                self._finish(out.request_id, stream, out)
                continue
            piece = stream.text(out.token_id, out.index)
            stream.hold(out.token_id, out.index, piece)
            stream.stops.armed = out.index >= stream.min_tokens  # stop strings after min_tokens
            text, hit = stream.stops.feed(piece)
            if text or hit:
                stream.queue.put_nowait(stream.release(text))
            if hit:
                # A late tick can take the core past this token and to the request's end
                # in one advance: then cancel finds nothing and its SimFinish is in outputs.
                fin = self._core.cancel(out.request_id, self._core.now, reason="stop") or next(
                    o for o in outputs if isinstance(o, SimFinish) and o.request_id == rid)
                # The core may have run past this token within one advance; count to it.
                self._finish(rid, stream, replace(fin, reason="stop",
                                                  completion_tokens=out.index + 1))

    def _finish(self, rid: str, stream: _Stream, fin: SimFinish) -> None:
        tail = stream.stops.flush() if fin.reason != "abort" else ""
        if tail or stream.held:
            stream.queue.put_nowait(stream.release(tail))
        usage = Usage(fin.prompt_tokens, fin.completion_tokens, fin.cached_tokens,
                      fin.host_cached_tokens)
        stream.queue.put_nowait(Finished(usage, fin.reason, stream.stops.matched))
        del self._streams[rid]
