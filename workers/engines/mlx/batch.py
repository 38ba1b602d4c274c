"""The mlx engine's thread: continuous batching with mlx-lm's ``BatchGenerator``.

``BatchLoop.run`` is the body of the engine's one dedicated thread; every MLX call
(model load included) happens there. Other threads only talk to it through a
thread-safe inbox (submit / cancel / stop) and per-request asyncio queues fed with
``loop.call_soon_threadsafe``. Each loop turn, like mlx-lm's own server:

1. drain the inbox (blocking with a timeout when idle, so no spinning and a prompt
   shutdown); for each new request look up the nearest cached prefix in the
   ``PrefixKVStore`` (deep copy, trimmed to the shared prefix, at most prompt - 1
   tokens) and ``insert`` it into the ``BatchGenerator`` with its uncached suffix,
   its own sampler, max_tokens and EOS stop tokens (none with ``ignore_eos``);
2. ``next()``: one decode step for the running batch plus one prefill chunk for
   waiting prompts, so new prompts join while others decode;
3. route each token to its request: detokenize (one streaming detokenizer per
   request), apply stop strings (``StopMatcher``), and on finish store the
   returned KV in the ``PrefixKVStore`` keyed by exactly the tokens it covers,
   which turns into precise ``BlockStored``/``BlockRemoved`` events.

Sampling (``workers.engines.mlx.sampling``): each job gets its own sampler (None: greedy
requests share one batched argmax), logits processors (logit bias, min tokens, bad words,
penalties) and stop token ids (EOS unless ``ignore_eos``, plus ``stop_token_ids``), all
built under a guard of their own (``_samplers``): sampling input the engine cannot use
(a seed outside ``[0, 2**64)``, which ``mx.random.key`` refuses) fails that job alone with
``SamplingError``, which the worker shim returns as a 400; the other sequences in the batch
never see it.
"""

from __future__ import annotations

import copy
import gc
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cache_service.hashing import model_salt
from workers.engines.mlx import logprobs as lp
from workers.engines.mlx.grammar import Grammars, constrained
from workers.engines.mlx.jobs import BatchConfig, Job
from workers.engines.mlx.kv_disk import mlx_disk_tier, model_fingerprint
from workers.engines.mlx.kv_store import PrefixKVStore
from workers.engines.mlx.sampling import SamplingError, SequenceSampling
from workers.engines.stops import StopMatcher
from workers.protocol import (
    EngineError,
    Finished,
    TokenChunk,
    Usage,
)

log = logging.getLogger(__name__)
_IDLE_POLL_S = 0.1  # idle wait on the inbox; stop() also wakes it at once


@dataclass(slots=True)
class _Seq:
    job: Job
    reused: int
    detok: Any
    stops: StopMatcher
    generated: int = 0
    held: list[int] = field(default_factory=list)  # ids whose text the StopMatcher holds
    logprobs: lp.SeqLogprobs | None = None  # asked for (``workers.engines.mlx.logprobs``)

    def chunk(self, text: str) -> TokenChunk:
        """The held tokens as one chunk of ``text``."""
        if self.logprobs is None:
            return TokenChunk(text, tuple(self.held))
        return self.logprobs.chunk(text, self.held)


class BatchLoop:
    """State owned by the engine thread, plus the thread-safe ways in."""

    def __init__(self, cfg: BatchConfig) -> None:
        self.cfg = cfg
        self.ready: Future[None] = Future()
        self.events_lock = threading.Lock()
        self.store: PrefixKVStore[list[Any]] | None = None
        self.active_bytes = 0  # KV held by running sequences
        # Cumulative prefill work (mlx-lm's own counters; int/float reads are atomic).
        self.prefill_tokens_total = 0
        self.prefill_busy_s = 0.0
        self._inbox: queue.SimpleQueue[tuple[str, Job | None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._seqs: dict[int, _Seq] = {}
        self._new: list[Job] = []
        self._prompts: dict[int, lp.SeqLogprobs] = {}  # by id(job): prompt logprobs read
        self._model: Any = None
        self._tokenizer: Any = None
        self._gen: Any = None
        self._eos: Any = None
        self._no_eos: Any = None
        self._eos_ids: list[int] = []
        self._grammars: Grammars | None = None  # constrained decoding (workers.engines.mlx.grammar)
        self._text: lp.TokenText | None = None

    # -- any thread ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._lock:  # after _close has drained the inbox nothing may be left in it
            if self._closed:
                raise EngineError("mlx engine not running")
            self._inbox.put(("submit", job))

    def cancel(self, job: Job) -> None:
        self._inbox.put(("cancel", job))

    def stop(self) -> None:
        self._inbox.put(("stop", None))

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the engine thread -----------------------------------------------------------
    def run(self) -> None:
        try:
            self._load()
        except Exception as e:
            self.ready.set_exception(e)
        else:
            self.ready.set_result(None)
            self._serve()
        finally:
            self._close()

    def _load(self) -> None:
        try:
            from mlx_lm import load
            from mlx_lm.generate import StopSequences
        except ImportError as e:  # pragma: no cover - depends on the install
            raise EngineError(
                "the mlx engine needs the 'mlx' extra: pip install 'kvroute[mlx]'"
            ) from e
        c = self.cfg
        self._model, self._tokenizer = load(c.model_path)
        self._eos_ids = sorted(self._tokenizer.eos_token_ids)
        self._eos = StopSequences([[t] for t in self._eos_ids])
        self._no_eos = StopSequences()
        self._grammars = Grammars(self._tokenizer._tokenizer, self._eos_ids)
        self._text = lp.TokenText(self._tokenizer)
        self.store = PrefixKVStore(
            c.model_name, c.replica_id, c.cache_bytes, c.block_size,
            model_salt(c.model_name), _kv_nbytes, c.max_cache_entries,
            disk=mlx_disk_tier(c.disk_bytes, c.disk_path, model_fingerprint(
                c.model_path, c.block_size, model_salt(c.model_name))),
            lease_fraction=c.lease_fraction,
        )
        self._gen = self._new_generator()

    def _new_generator(self) -> Any:
        from mlx_lm.generate import BatchGenerator

        step, batch = self._prefill_settings()
        return BatchGenerator(
            self._model,
            completion_batch_size=self.cfg.max_batch,
            prefill_batch_size=min(batch, self.cfg.max_batch),
            prefill_step_size=step,
        )

    def _prefill_settings(self) -> tuple[int, int]:
        """(prefill chunk tokens, prompts prefilled together).

        On a GPU, mlx-lm's server defaults (2048, 8). On CPU, measured with the tiny
        model: 512-token chunks prefill long prompts ~2x faster than 2048 (attention cost
        grows with the chunk) and let decode steps, aborts and shutdown interleave; one
        prompt at a time beats padded batched prefill for both TTFT and throughput.
        """
        import mlx.core as mx

        cpu = mx.default_device() == mx.cpu
        step = self.cfg.prefill_step_size or (512 if cpu else 2048)
        return step, self.cfg.prefill_batch_size or (1 if cpu else 8)

    def _serve(self) -> None:
        while True:
            try:
                if not self._admit():
                    return
                if self._new:
                    self._insert()
                if self._seqs:
                    self._step()
            except Exception as e:  # fail what is in flight, keep serving
                log.exception("mlx batch step failed")
                self._fail_all(e)

    def _admit(self) -> bool:
        """Drain the inbox into ``self._new`` / cancellations; False on stop."""
        wait = not self._seqs and not self._new
        while True:
            try:
                if wait:
                    kind, job = self._inbox.get(timeout=_IDLE_POLL_S)
                else:
                    kind, job = self._inbox.get_nowait()
            except queue.Empty:
                return True
            wait = False
            if kind == "stop":
                return False
            assert job is not None
            if kind == "submit":
                self._new.append(job)
            elif job in self._new:
                self._new.remove(job)
                self._finish_unstarted(job, "abort")
            else:
                self._abort(job)

    def _insert(self) -> None:
        # Jobs stay in self._new until inserted, so _fail_all reaches them if this raises.
        self._new, samplers = self._samplers(self._new)
        self._new, processors = constrained(self._grammars, self._new)
        args: list[tuple[Job, list[Any], int]] = []
        for job in self._new:
            if job.aborted.is_set() or job.request.sampling.max_tokens <= 0:
                self._finish_unstarted(job, "abort" if job.aborted.is_set() else "length")
                continue
            cache, reused = self._fetch_cache(job) if job.request.sampling.prompt_logprobs \
                is None else self._prompt_pass(job)
            job.prefill_left = len(job.request.token_ids) - reused
            args.append((job, cache, reused))
        if not args:
            self._new = []
            return
        reqs = [job.request for job, _, _ in args]
        uids = self._gen.insert(
            [job.request.token_ids[n:] for job, _, n in args],  # the uncached suffix
            max_tokens=[r.sampling.max_tokens for r in reqs],
            caches=[cache for _, cache, _ in args],
            all_tokens=[job.request.token_ids[:n] for job, _, n in args],  # what the KV covers
            samplers=[samplers[id(job)].sampler for job, _, _ in args],
            # the grammar's mask last: no bias or penalty can lift a token it forbids
            logits_processors=[[*samplers[id(job)].processors, *processors.get(id(job), ())]
                               for job, _, _ in args],
            stop_sequences=[self._stops(samplers[id(job)].stops) for job, _, _ in args],
        )
        self._new = []
        for (job, _, reused), uid in zip(args, uids, strict=True):
            job.uid = uid
            stops = StopMatcher(job.request.sampling.stop)
            seq = self._seqs[uid] = _Seq(job, reused, self._tokenizer.detokenizer, stops)
            seq.logprobs = self._prompts.pop(id(job), None) or lp.asks(job.request)
            if job.request.sampling.prompt_logprobs is not None:
                seq.reused = 0  # prefilled whole here: none of it came from the cache

    def _samplers(self, jobs: list[Job]) -> tuple[list[Job], dict[int, Any]]:
        """Each job's sampler, built under its own guard: a job whose sampling input the
        engine refuses fails alone (``SamplingError``) and is left out of the batch."""
        kept: list[Job] = []
        samplers: dict[int, Any] = {}
        for job in jobs:
            try:
                samplers[id(job)] = SequenceSampling(
                    job.request.sampling, len(job.request.token_ids), self._eos_ids,
                    self._encode)
            except Exception as e:  # the caller's input, not the batch's fault
                err = e if isinstance(e, SamplingError) else SamplingError(f"sampling: {e}")
                job.prefill_left = 0
                job.put(err)
                continue
            kept.append(job)
        return kept, samplers

    def _stops(self, ids: list[int]) -> Any:
        """The ``StopSequences`` of these stop ids (EOS alone and none are shared)."""
        from mlx_lm.generate import StopSequences

        if ids == self._eos_ids:
            return self._eos
        return StopSequences([[t] for t in ids]) if ids else self._no_eos

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _step(self) -> None:
        with self._gen.stats() as work:
            prompt_responses, gen_responses = self._gen.next()
        self.prefill_tokens_total += work.prompt_tokens  # the uncached suffixes inserted
        self.prefill_busy_s += work.prompt_time
        for r in prompt_responses:
            if seq := self._seqs.get(r.uid):
                done, total = r.progress
                seq.job.prefill_left = 0 if r.end_of_prompt else max(0, total - done)
        lp.attach(((s.logprobs, r.token, r.logprobs) for r in gen_responses
                   if (s := self._seqs.get(r.uid)) and s.logprobs and r.finish_reason != "stop"),
                  self._text)  # type: ignore[arg-type]
        for r in gen_responses:
            if seq := self._seqs.get(r.uid):
                self._on_token(seq, r)
        self.active_bytes = int(self._gen.prompt_cache_nbytes)

    def _on_token(self, seq: _Seq, r: Any) -> None:
        if r.finish_reason == "stop":  # an EOS or stop token id: neither emitted nor counted
            return self._finish(seq, "stop", r.prompt_cache, r.all_tokens)
        seq.generated += 1
        seq.stops.armed = seq.generated > seq.job.request.sampling.min_tokens  # as vLLM
        seq.held.append(r.token)
        seq.detok.add_token(r.token)
        text, hit = seq.stops.feed(seq.detok.last_segment)
        if text or hit:
            seq.job.put(seq.chunk(text))
            seq.held = []
        if r.finish_reason is not None:  # already out of the batch
            self._finish(seq, "stop" if hit else "length", r.prompt_cache, r.all_tokens, hit)
        elif hit:
            uid = seq.job.uid
            cache, tokens = self._gen.remove([uid], return_prompt_caches=True)[uid]
            self._finish(seq, "stop", cache, tokens, hit)

    def _finish(
        self, seq: _Seq, reason: str, cache: list[Any], tokens: list[int], hit: bool = False
    ) -> None:
        job = seq.job
        self._seqs.pop(job.uid, None)  # type: ignore[arg-type]
        tail = ""
        if not hit:  # flush text the detokenizer or the stop matcher still holds
            seq.detok.finalize()
            tail, hit = seq.stops.feed(seq.detok.last_segment)
            reason = "stop" if hit else reason
            tail += "" if hit else seq.stops.flush()
        if tail or seq.held:
            job.put(seq.chunk(tail))
        self._store_cache(job.request.token_ids, tokens, cache, job.request.cache_salt,
                          job.request.lease_s)
        usage = job.usage(seq.generated, seq.reused)
        job.put(Finished(usage, reason, seq.stops.matched))

    def _abort(self, job: Job) -> None:
        seq = self._seqs.pop(job.uid, None) if job.uid is not None else None
        if seq is None:  # already finished
            return
        self._gen.remove([job.uid])
        job.prefill_left = 0
        job.put(Finished(job.usage(seq.generated, seq.reused), "abort"))

    def _finish_unstarted(self, job: Job, reason: str) -> None:
        job.prefill_left = 0
        job.put(Finished(Usage(len(job.request.token_ids), 0, 0), reason))

    def _fail_all(self, error: Exception) -> None:
        for job in [s.job for s in self._seqs.values()] + self._new:
            job.prefill_left = 0
            job.put(error)
        self._seqs.clear()
        self._new = []
        self._prompts.clear()
        if self._gen is not None:
            self._gen.close()
            self._gen = self._new_generator()

    def _close(self) -> None:
        with self._lock:
            self._closed = True
        for seq in self._seqs.values():
            usage = seq.job.usage(seq.generated, seq.reused)
            seq.job.put(Finished(usage, "abort"))
        for job in self._new:
            self._finish_unstarted(job, "abort")
        while True:  # requests submitted after the stop
            try:
                kind, job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit" and job is not None:
                self._finish_unstarted(job, "abort")
        self._seqs.clear()
        self._new = []
        self._release_mlx()

    def _release_mlx(self) -> None:
        """Free MLX state on the thread that made it, and drop the cached prefixes."""
        if self._gen is not None:
            self._gen.close()
        self._gen = self._model = None
        if self.store is not None:
            with self.events_lock:
                self.store.release()  # BlockRemoved for all; a disk_path keeps its files
        gc.collect()
        try:
            import mlx.core as mx

            mx.synchronize()
        except ImportError:  # pragma: no cover - never loaded
            pass

    def _prompt_pass(self, job: Job) -> tuple[list[Any], int]:
        """The prompt prefilled here, its logprobs read on the way (kept for its _Seq)."""
        assert self._text is not None
        started = time.perf_counter()
        cache, n, self._prompts[id(job)] = lp.prompt_pass(
            self._model, job.request, self._prefill_settings()[0], self._text)
        self.prefill_tokens_total += n
        self.prefill_busy_s += time.perf_counter() - started
        return cache, n

    # -- prefix KV store ----------------------------------------------------------
    def _fetch_cache(self, job: Job) -> tuple[list[Any], int]:
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        assert self.store is not None
        prompt = job.request.token_ids
        with self.events_lock:  # a disk hit moves entries (and emits events)
            match = self.store.nearest(prompt, job.request.cache_salt)  # this tenant's KV only
        reuse = min(match.common, len(prompt) - 1) if match else 0
        if not match or reuse <= 0:
            return make_prompt_cache(self._model), 0
        job.disk_reused = reuse if match.tier == "disk" else 0
        cache = copy.deepcopy(match.kv)  # the stored entry stays intact for others
        trim_prompt_cache(cache, _offset(cache) - reuse)
        return cache, reuse

    def _store_cache(self, prompt: list[int], tokens: list[int], cache: list[Any],
                     salt: str | None, lease_s: float) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        assert self.store is not None
        offset = _offset(cache)
        if offset > len(tokens):  # KV beyond the known tokens cannot be keyed
            trim_prompt_cache(cache, offset - len(tokens))
            offset = len(tokens)
        key = list(tokens[:offset])  # the KV may lack the last sampled token
        n = min(len(key), len(prompt))
        if not key or key[:n] != prompt[:n]:  # a wrong key would mislead the router
            log.warning("mlx: KV tokens do not extend the prompt; not caching")
            return
        with self.events_lock:
            self.store.insert(key, cache, salt, lease_s)


def _offset(cache: list[Any]) -> int:
    return int(cache[0].offset)


def _kv_nbytes(cache: list[Any]) -> int:
    return int(sum(c.nbytes for c in cache))
