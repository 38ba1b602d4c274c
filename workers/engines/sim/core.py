"""Core of the ``sim`` engine EMULATOR: a pure, clock-free state machine.

It emulates an LLM engine for routing tests and benchmarks on CPUs (like NVIDIA
Dynamo's mocker or llm-d's inference simulator); it runs no model. The model:

* KV cache: ``kv_blocks`` (C) blocks keyed by chained block hashes, with an optional host
  tier of ``host_kv_blocks`` and leases (``workers.engines.sim.kv``). Blocks used by a running
  request are pinned; cached blocks no request uses are evictable, LRU first (a released
  prompt's deepest block goes first, so shared prefixes survive longest).
  Only a prompt's hashed blocks occupy the cache; the partial tail and decoded tokens
  are not charged. The emulator never refuses or preempts: if pinned blocks leave no
  room, the rest of the prompt is simply not cached.
* Host tier: host blocks in the request's leading run are reloaded onto the device, at
  ``host_reload_tok_s``; they count as cached tokens (``host_cached_tokens`` says how many)
  and their reload runs in the prefill slot: the prefill takes ``uncached / P + reloaded /
  R`` seconds. The prefill work is counted in prefill tokens: a reloaded token costs
  ``reload_cost = P / R`` of one (reported in the load, so the router prices it alike).
  Two more costs, both 0 by default and fitted to a real engine by ``kvroute bench
  calibrate``: ``prefill_base_s``, a fixed time per prefill, and ``cache_load_tok_s``, the
  rate a device-cached prefix is taken up at (mlx copies the cached KV); both count as
  prefill work in tokens (``P * prefill_base_s``, ``cached * P / cache_load_tok_s``).
* Prefill: FIFO, one request at a time. When a request reaches the head, its hit is the
  longest cached leading run of its hashes; ``cached_tokens = min(hit * block_size,
  prompt_len - 1)`` (at least one token is computed, to produce the first token, as vLLM
  does). Its uncached tokens take ``uncached / prefill_tok_s`` seconds; the first token
  is produced when prefill ends (so TTFT = queueing + own prefill). Slots for its new
  blocks are reserved (evicting, ``BlockRemoved``) at prefill start; the blocks are
  stored (``BlockStored``) at prefill end. ``load(now)`` reports the prefill work still to
  do (the running prefill only its rest) and cumulative counters of the work done, as a
  worker reports them in its routing stats.
* Decode: in parallel, independent of prefill. After each token a request schedules its
  next one ``tpot_s + tpot_per_batch_s * (batch - 1)`` seconds later, batch = requests
  decoding at that moment.
* Tokens: ``sim_token(prompt_key, seed, position)``, a pure function. With
  ``eos_every = k > 0`` the k-th decode step yields EOS: finish "stop" after k-1 tokens
  (EOS itself is not emitted nor counted, as in the mlx adapter), or after ``min_tokens``
  when that is more. A token among ``stop_ids`` ends the output the same way, once
  ``min_tokens`` are out. A request may instead
  carry ``script``, token ids chosen by the adapter (``workers.engines.sim.script``): they are
  emitted in order, and the request finishes "stop" with its last one (``eos_every`` and
  ``eos`` do not apply), or "length" first if ``max_tokens`` is smaller.

Time is a float supplied by the caller: ``SimEngine`` passes the event loop's clock, an
offline simulator passes virtual time. Protocol: ``submit(req, now)`` /
``cancel(rid, now)`` whenever they happen; ``next_event_time()`` says when the core next
changes state; ``advance(now)`` processes everything due up to ``now`` and returns the
outputs (``SimToken``/``SimFinish``) in time order. Times must not go backwards.
"""

from __future__ import annotations

import heapq
import itertools
import math
import struct
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import xxhash

from cache_service.events import CacheEvent
from cache_service.hashing import DEFAULT_BLOCK_SIZE
from workers.engines.sim.kv import SimKv
from workers.protocol import LoadStats

LABEL = "sim (engine emulator)"
_TOKEN_KEY = struct.Struct("<QQQ")
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SimParams:
    """Every constant of the emulator (see the module docstring)."""

    kv_blocks: int = 1000  # C: cache capacity in blocks
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per block (the canonical hash block size)
    prefill_tok_s: float = 12000.0  # P: prefill throughput of uncached tokens
    tpot_s: float = 0.02  # decode step time at batch 1
    tpot_per_batch_s: float = 0.0002  # added per extra decoding request
    vocab_size: int = 4096
    eos_every: int = 0  # 0 = never emit EOS
    host_kv_blocks: int = 0  # C2: host-tier blocks (0: no host tier)
    host_reload_tok_s: float = 120000.0  # R: host -> device reload rate
    lease_fraction: float = 0.25  # most of C that leases may hold
    prefill_base_s: float = 0.0  # fixed time of every prefill (a forward pass's own cost)
    cache_load_tok_s: float = 0.0  # rate a device-cached prefix is taken up at; 0: free

    def __post_init__(self) -> None:
        if self.host_kv_blocks < 0 or self.host_reload_tok_s <= 0:
            raise ValueError("host_kv_blocks must be >= 0 and host_reload_tok_s > 0")
        if not 0.0 <= self.lease_fraction <= 1.0:
            raise ValueError("lease_fraction must be in [0, 1]")
        if self.kv_blocks < 1 or self.block_size < 1 or self.vocab_size < 1:
            raise ValueError("kv_blocks, block_size and vocab_size must be >= 1")
        if self.prefill_tok_s <= 0 or self.tpot_s < 0 or self.tpot_per_batch_s < 0:
            raise ValueError("prefill_tok_s must be > 0, tpot_s and tpot_per_batch_s >= 0")
        if self.eos_every < 0:
            raise ValueError("eos_every must be >= 0")
        if self.prefill_base_s < 0 or self.cache_load_tok_s < 0:
            raise ValueError("prefill_base_s and cache_load_tok_s must be >= 0")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], block_size: int) -> SimParams:
        """Params from config ``engine_kwargs``; ``block_size`` defaults to the canonical one."""
        known = {f.name: f.type for f in fields(cls)}
        unknown = set(kwargs) - set(known)
        if unknown:
            raise ValueError(f"unknown sim engine parameters: {sorted(unknown)}")
        casts = {"int": int, "float": float}
        values = {k: casts[str(known[k])](v) for k, v in kwargs.items()}
        values.setdefault("block_size", block_size)
        return cls(**values)

    def step_time(self, batch: int) -> float:
        return self.tpot_s + self.tpot_per_batch_s * max(0, batch - 1)

    @property
    def reload_cost(self) -> float:
        """Prefill tokens' worth of time to reload one host token (0: no host tier)."""
        return self.prefill_tok_s / self.host_reload_tok_s if self.host_kv_blocks else 0.0


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    block_hashes: Sequence[int]  # the prompt's block hashes, taken as given
    prompt_len: int  # tokens, >= 1
    max_tokens: int
    prompt_key: int = 0  # seeds the token stream (SimEngine: a hash of the token ids)
    seed: int = 0
    eos: bool = True  # False = ignore EOS (SamplingParams.ignore_eos)
    script: tuple[int, ...] | None = None  # scripted reply: emitted instead of sim_token
    lease_s: float = 0.0  # keep the prompt's blocks this long after the request finishes
    min_tokens: int = 0  # EOS and stop ids cannot end the output before this many tokens
    stop_ids: frozenset[int] = frozenset()  # a token among them ends the output (not emitted)
    prefill_all: bool = False  # no cached prefix counts (prompt logprobs need every logit)


@dataclass(frozen=True, slots=True)
class SimToken:
    request_id: str
    time: float
    token_id: int
    index: int  # 0-based position in the completion


@dataclass(frozen=True, slots=True)
class SimFinish:
    request_id: str
    time: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reason: str  # "stop" | "length" | "abort"
    host_cached_tokens: int = 0  # of cached_tokens, reloaded from the host tier


SimOutput = SimToken | SimFinish


def sim_token(prompt_key: int, seed: int, position: int, vocab_size: int) -> int:
    """The emulator's output token: a pure function of prompt, seed and position."""
    key = _TOKEN_KEY.pack(prompt_key & _MASK, seed & _MASK, position & _MASK)
    return xxhash.xxh3_64_intdigest(key) % vocab_size


@dataclass(slots=True)
class _Req:
    spec: SimRequest
    state: str = "waiting"  # "waiting" | "prefill" | "decode"
    uncached: int = 0  # prefill work (tokens): an estimate at submit; exact from prefill start
    cached: int = 0
    host_cached: int = 0
    reloaded: list[int] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)
    to_store: list[int] = field(default_factory=list)  # reserved, stored at prefill end
    own: list[int] = field(default_factory=list)  # blocks it computed (stored)
    generated: int = 0
    seq: int = -1  # sequence number of its live heap event; other entries are stale


class SimCore:
    """One emulated engine replica, driven by an external clock."""

    def __init__(self, params: SimParams, model: str = "", replica: str = "",
                 output_ids: tuple[int, ...] | None = None) -> None:
        self.params, self.model, self.replica = params, model, replica
        self._output_ids = output_ids  # the tokens to emit (SimVocab); None: any below vocab_size
        self._now = float("-inf")
        self._reqs: dict[str, _Req] = {}
        self._waiting: deque[str] = deque()
        self._prefilling: str | None = None
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._decoding = 0
        self.kv = SimKv(params.kv_blocks, params.host_kv_blocks, params.lease_fraction,
                        model, replica)
        self._queued_tokens = 0  # uncached tokens of waiting and prefilling requests
        self._prefill_start = 0.0  # when the running prefill started
        self._prefilled_tokens = 0  # cumulative counters of finished prefill work
        self._prefill_busy_s = 0.0
        self._pending: list[SimOutput] = []

    # -- clock-facing API ------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now

    def submit(self, req: SimRequest, now: float) -> None:
        if req.prompt_len < 1:
            raise ValueError("prompt_len must be >= 1")
        if req.request_id in self._reqs:
            raise ValueError(f"request {req.request_id!r} is already running")
        self._run_until(now)
        r = _Req(req)
        r.uncached = self._work(req, *self.kv.prefix(req.block_hashes))[0]
        self._reqs[req.request_id] = r
        self._queued_tokens += r.uncached
        self._waiting.append(req.request_id)
        self._start_next(self._now)

    def next_event_time(self) -> float | None:
        if self._pending:
            return self._now
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance(self, now: float) -> list[SimOutput]:
        self._run_until(now)
        out, self._pending = self._pending, []
        return out

    def cancel(self, request_id: str, now: float, reason: str = "abort") -> SimFinish | None:
        """End a request early (abort, or a stop string seen by the adapter)."""
        self._run_until(now)
        r = self._reqs.get(request_id)
        if r is None:
            return None
        if r.state == "waiting":
            self._waiting.remove(request_id)
        fin = self._finish(r, self._now, reason)
        self._start_next(self._now)
        return fin

    # -- cache-facing API ------------------------------------------------------------
    def cached_prefix_blocks(self, req: SimRequest) -> int:
        """Leading blocks of ``req`` cached right now, any tier (does not touch the LRU)."""
        return self.kv.prefix(req.block_hashes)[0]

    @property
    def cached_blocks(self) -> int:
        return self.kv.cached

    def drain_events(self) -> list[CacheEvent]:
        events, self.kv.events = self.kv.events, []
        return events

    def clear(self) -> None:
        """Reset the prefix cache: drop evictable blocks; blocks in use stay (re-announced)."""
        self.kv.clear()

    def load(self, now: float | None = None) -> LoadStats:
        """Load at ``now`` (default: the core's clock; not before it, and no event is run).

        ``queued_prefill_tokens`` is the remaining prefill work: the running prefill counts
        only its tokens not yet done. The counters include the running prefill's progress.
        """
        t = self._now if now is None else max(now, self._now)
        done_tok, done_s = self._running_progress(t)
        # Like vLLM's kv_cache_usage: evictable cached blocks count as free.
        used = len(self.kv.pinned) + self.kv.reserved
        return LoadStats(
            len(self._reqs), self._queued_tokens - done_tok, used / self.params.kv_blocks,
            remaining_prefill_exact=True,
            prefill_tokens_total=self._prefilled_tokens + done_tok,
            prefill_busy_s=self._prefill_busy_s + done_s, decode_batch=self._decoding,
            prefill_tok_s=self.params.prefill_tok_s, taken_at=t,
            reload_cost=self.params.reload_cost,
        )

    # -- internals -------------------------------------------------------------------
    def _running_progress(self, t: float) -> tuple[int, float]:
        """(tokens, seconds) of the running prefill done by ``t``."""
        if self._prefilling is None:
            return 0, 0.0
        r = self._reqs[self._prefilling]
        busy = min(max(0.0, t - self._prefill_start), r.uncached / self.params.prefill_tok_s)
        return min(r.uncached, int(busy * self.params.prefill_tok_s)), busy

    def _credit_prefill(self, tokens: int, busy_s: float) -> None:
        self._prefilled_tokens += tokens
        self._prefill_busy_s += busy_s

    def _run_until(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if not self._live(entry):
                continue
            self._now = entry[0]
            r = self._reqs[entry[2]]
            if r.state == "prefill":
                self._end_prefill(r)
            else:
                self._step(r)
        self._now = now

    def _live(self, entry: tuple[float, int, str]) -> bool:
        r = self._reqs.get(entry[2])
        return r is not None and r.seq == entry[1]

    def _schedule(self, r: _Req, at: float) -> None:
        r.seq = next(self._seq)
        heapq.heappush(self._heap, (at, r.seq, r.spec.request_id))

    def _work(self, req: SimRequest, hit: int, host: int) -> tuple[int, int, int]:
        """(prefill work in tokens, cached tokens, of which reloaded from host): at least
        one token is computed; a reloaded token costs ``reload_cost`` of a prefill token."""
        p = self.params
        if req.prefill_all:
            hit = host = 0
        cached = min(hit * p.block_size, req.prompt_len - 1)
        host_tok = min(host * p.block_size, cached)
        reload = math.ceil(host_tok * p.reload_cost)
        if p.cache_load_tok_s > 0:  # the device-cached part is not free either
            reload += math.ceil((cached - host_tok) * p.prefill_tok_s / p.cache_load_tok_s)
        base = math.ceil(p.prefill_base_s * p.prefill_tok_s)
        return req.prompt_len - cached + reload + base, cached, host_tok

    def _start_next(self, t: float) -> None:
        if self._prefilling is not None or not self._waiting:
            return
        r = self._reqs[self._waiting.popleft()]
        hit, host = self.kv.prefix(r.spec.block_hashes)
        work, r.cached, r.host_cached = self._work(r.spec, hit, host)
        self._queued_tokens += work - r.uncached
        r.uncached = work
        needed: dict[int, None] = {}  # blocks to reload (the leading run's), then to compute
        reload: set[int] = set()
        for i, h in enumerate(r.spec.block_hashes):
            if self.kv.on_device(h):
                self.kv.pin(h, r.pinned)
            else:
                needed[h] = None
                if i < hit:
                    reload.add(h)
        self.kv.make_room(len(needed), t)
        r.to_store = list(needed)[: max(0, self.kv.room())]
        r.reloaded = [h for h in r.to_store if h in reload]
        self.kv.take_from_host(r.reloaded)
        self.kv.reserved += len(r.to_store)
        r.state, self._prefilling = "prefill", r.spec.request_id
        self._prefill_start = t
        self._schedule(r, t + r.uncached / self.params.prefill_tok_s)

    def _end_prefill(self, r: _Req) -> None:
        self.kv.reserved -= len(r.to_store)
        self.kv.store(r.to_store, r.pinned, r.reloaded)
        r.own.extend(r.to_store)
        r.to_store, r.reloaded = [], []
        self._queued_tokens -= r.uncached
        self._credit_prefill(r.uncached, r.uncached / self.params.prefill_tok_s)
        self._prefilling = None
        r.state = "decode"
        self._decoding += 1
        self._step(r)
        self._start_next(self._now)

    def _step(self, r: _Req) -> None:
        """One decode step of ``r`` at ``self._now`` (the first one ends prefill)."""
        spec, i = r.spec, r.generated
        if i >= spec.max_tokens:
            self._pending.append(self._finish(r, self._now, "length"))
        elif self._eos_at(spec, i):
            self._pending.append(self._finish(r, self._now, "stop"))
        else:
            script = spec.script
            if script is None:
                tok = self._token(spec, i)
            else:
                tok = script[i]
            if tok in spec.stop_ids and i >= spec.min_tokens and script is None:
                self._pending.append(self._finish(r, self._now, "stop"))  # as EOS: not emitted
                return
            r.generated += 1
            self._pending.append(SimToken(spec.request_id, self._now, tok, i))
            if script is not None and r.generated == len(script):
                # The script's end is its EOS, seen with its last token: no extra step.
                self._pending.append(self._finish(r, self._now, "stop"))
            elif r.generated >= spec.max_tokens:
                self._pending.append(self._finish(r, self._now, "length"))
            else:
                self._schedule(r, self._now + self.params.step_time(self._decoding))

    def _token(self, spec: SimRequest, i: int) -> int:
        if self._output_ids is None:
            return sim_token(spec.prompt_key, spec.seed, i, self.params.vocab_size)
        return self._output_ids[sim_token(spec.prompt_key, spec.seed, i, len(self._output_ids))]

    def _eos_at(self, spec: SimRequest, i: int) -> bool:
        """Whether decode step ``i`` (0-based) yields EOS instead of a token."""
        if spec.script is not None:
            return i >= len(spec.script)  # only an empty script gets here
        every = self.params.eos_every  # min_tokens holds EOS back until that many tokens
        return spec.eos and every > 0 and i + 1 == max(every, spec.min_tokens + 1)

    def _finish(self, r: _Req, t: float, reason: str) -> SimFinish:
        spec = r.spec
        if r.state == "prefill":
            self._credit_prefill(*self._running_progress(t))  # the work done before the cancel
        del self._reqs[spec.request_id]
        if r.state == "prefill":
            self.kv.reserved -= len(r.to_store)
            self.kv.store([], r.pinned, r.reloaded)  # reloads not done: they left the host
            self._queued_tokens -= r.uncached
            self._prefilling = None
        elif r.state == "waiting":
            self._queued_tokens -= r.uncached
        else:
            self._decoding -= 1
        self.kv.release(r.pinned, t + spec.lease_s if spec.lease_s > 0 else 0.0, t, set(r.own))
        r.pinned = []
        return SimFinish(spec.request_id, t, spec.prompt_len, r.generated, r.cached, reason,
                         r.host_cached)
