"""The narrow engine protocol every worker engine (mlx, vllm, sim) implements, and the
typed records that cross the Serve handle between router and worker.

The Serve deployment in ``workers.deployment`` is a thin shim over this: it feeds
token ids in, streams ``TokenChunk``s out, ends with ``Finished`` (usage measured
by the engine itself), and forwards the engine's cache events to the index.

Across the handle (router → worker → router), one request is one ``WorkRequest``
and its reply is a stream of ``WorkerMessage``s: ``Chunk``s of released text, then
one ``Final`` (usage, finish reason, the cache events the router applies itself with
the embedded index), or a ``Rejected`` first message when the engine refuses the
input (``InputRejected``): a 400 for the client that no other replica would accept
either, so it is never retried. Every field is named here once; nothing crosses as a
dict with string keys.
"""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar, Protocol, runtime_checkable

from cache_service.events import CacheEvent
from cache_service.hashing import token_bytes

CONSTRAINT_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class Constraint:
    """Decoding held to a grammar: structured outputs and forced tool calls.

    ``kind``: ``json`` (``text`` is a JSON schema, as JSON text), ``json_object`` (any JSON
    object; ``text`` empty), ``regex`` (``text`` is the pattern, matched whole), ``choice``
    (one of ``choices``, exactly) or ``grammar`` (``text`` is a Lark grammar in
    llguidance's dialect: ``%json {schema}`` and ``<[token id]>`` allowed; the router's
    forced tool calls are written so). The grammar never enters the prompt, so it never
    changes the prompt's prefix hashes. The output must end where the grammar does: the
    engine allows only EOS once it is complete."""

    kind: str
    text: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"constraint kind must be one of {CONSTRAINT_KINDS}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    constraint: Constraint | None = None  # structured output (none: free text)
    # The controls below default to off (docs/api.md, sampling); the engines honour each
    # (workers.engines.mlx.sampling, the vllm engine's SamplingParams, the sim where it can).
    top_k: int = 0  # 0 (or vLLM's -1): off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    min_tokens: int = 0  # EOS and stop_token_ids cannot end the output before this many
    stop_token_ids: tuple[int, ...] = ()  # end the output (also with ignore_eos)
    bad_words: tuple[str, ...] = ()  # words the output never contains (vLLM's bad_words)
    # Logprobs (``workers.logprobs``): None = off. ``logprobs``: each generated token's
    # logprob and this many most likely alternatives (0: the token's own only);
    # ``prompt_logprobs``: the same for every prompt token after the first (the engine
    # prefills the whole prompt for it: a cached prefix holds no logits).
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_salt: str | None = None  # the tenant: its KV is kept apart (engines salt per it)
    lease_s: float = 0.0  # keep the prompt's KV this long after the request ends (0: no lease)


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of a position's most likely tokens: its id, its text (as the engine decodes
    that id alone) and its logprob."""

    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position's token (sampled, or the prompt's): its logprob, its rank among the
    vocabulary (1: the most likely) and the position's ``top`` tokens, most likely first."""

    token_id: int
    token: str
    logprob: float
    rank: int = 1
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenChunk:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when asked for
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # prompt tokens 1.., on the first chunk

    def then(self, other: TokenChunk) -> TokenChunk:
        """This chunk and ``other`` as one (released together)."""
        return TokenChunk(self.text + other.text, self.token_ids + other.token_ids,
                          self.logprobs + other.logprobs,
                          self.prompt_logprobs or other.prompt_logprobs)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    host_cached_tokens: int = 0  # of cached_tokens, reloaded from a slower tier (host, disk)


@dataclass(frozen=True, slots=True)
class Finished:
    usage: Usage
    finish_reason: str  # "stop" | "length" | "abort"
    stop_sequence: str | None = None  # the stop string that ended it, if one did


@dataclass(frozen=True, slots=True)
class LoadStats:
    """An engine's load, as its worker reports it in Serve's routing stats.

    ``queued_prefill_tokens`` is prompt tokens not yet prefilled, as well as the engine can
    tell. ``decode_batch`` is the sequences past prefill (decoding together);
    ``prefill_tok_s`` the engine's own known prefill rate (0: unknown, the sim's is its
    parameter). ``remaining_prefill_exact`` says it is exactly the uncached tokens still to
    prefill, the rest of the running prefill included: the router then trusts it over its
    own estimate (``router.routing.context.build_candidate``). The cumulative counters (uncached
    tokens prefilled, seconds spent prefilling; 0 = not reported) let the router learn
    the replica's prefill rate. ``taken_at`` is wall-clock time, comparable across hosts.
    ``reload_cost`` (0 = no slower tier): the time to bring one token's KV back from the
    host or disk tier, in prefill tokens' worth (reload time / prefill time per token).
    """

    ongoing_requests: int
    queued_prefill_tokens: int
    kv_usage: float  # fraction of the KV budget in use, 0..1
    remaining_prefill_exact: bool = False
    prefill_tokens_total: int = 0
    prefill_busy_s: float = 0.0
    decode_batch: int = 0
    prefill_tok_s: float = 0.0
    taken_at: float = field(default_factory=time.time, compare=False)
    reload_cost: float = 0.0

    def prefill_rate(self) -> float:
        """Tokens/s: the lifetime average when counted, else the engine's own figure, else
        ``FALLBACK_PREFILL_TOK_S`` (vLLM before it reports: its backlog is a bound anyway)."""
        if self.prefill_busy_s > 0 and self.prefill_tokens_total > 0:
            return self.prefill_tokens_total / self.prefill_busy_s
        return self.prefill_tok_s if self.prefill_tok_s > 0 else FALLBACK_PREFILL_TOK_S

    def routing_stats(self) -> dict[str, float]:
        """The routing-stats keys the router reads (``router.routing.context.build_candidate``)."""
        out: dict[str, float] = {
            "ongoing_requests": self.ongoing_requests,
            "queued_prefill_tokens": self.queued_prefill_tokens,
            "kv_usage": self.kv_usage,
            "stats_time": self.taken_at,
        }
        if self.remaining_prefill_exact:
            out["remaining_prefill_tokens"] = self.queued_prefill_tokens
        if self.prefill_busy_s > 0:
            out["prefill_tokens_total"] = self.prefill_tokens_total
            out["prefill_busy_s"] = self.prefill_busy_s
        if self.reload_cost > 0:
            out["reload_cost"] = self.reload_cost
        return out


FALLBACK_PREFILL_TOK_S = 4000.0  # as the router's prior (RouterConfig.prefill_tokens_per_s)


@dataclass(slots=True)
class BackgroundWork:
    """A worker's tally of ``WorkRequest.background`` requests, in prompt tokens (those
    running, those ended: finished or cancelled), and the work figure it last reported.
    A prompt's length bounds its uncached prefill, so subtracting it never reads
    background work as demand; it over-subtracts the cached part and, for a cancelled
    request, the part never prefilled, so the figure only takes a tick's rises
    (``work_s``, advanced by ``AutoscalingStats.from_load``)."""

    running_tokens: int = 0
    ended_tokens: int = 0
    work_s: float = 0.0  # the reported cumulative user work
    net_s: float | None = None  # done + queued - the background bound, at the last report

    def begin(self, prompt_tokens: int) -> None:
        self.running_tokens += prompt_tokens

    def end(self, prompt_tokens: int) -> None:
        """Whether it finished or was cancelled (a pre-warm past its ``timeout_s``): its
        prefill so far stays in the engine's counters either way."""
        self.running_tokens -= prompt_tokens
        self.ended_tokens += prompt_tokens

    def advance(self, net_s: float) -> float:
        """The cumulative user work, given this tick's net figure: its rises only (a drop
        is background over-subtracted or a cancelled request, never negative demand)."""
        if self.net_s is None:
            self.work_s = max(0.0, net_s)
        else:
            self.work_s += max(0.0, net_s - self.net_s)
        self.net_s = net_s
        return self.work_s


@dataclass(frozen=True, slots=True)
class AutoscalingStats:
    """What a worker reports to Serve's autoscaler (``record_autoscaling_stats``), read by
    the kvroute policy (``deploy.autoscale.policy``). Serve carries a flat
    ``dict[str, float]`` per replica; the key names live here only.

    ``backlog_s``: seconds of prefill still to do (exact on sim and mlx, an upper bound on
    vLLM). ``prefill_work_s``: cumulative prefill seconds this replica was given (done +
    still queued), whose slope is the replica's offered prefill load. ``requests_total``:
    cumulative requests started, for the mean prefill work per request.
    """

    backlog_s: float
    prefill_work_s: float
    requests_total: int
    decode_batch: int
    kv_usage: float

    PREFIX: ClassVar[str] = "kvroute_"

    @classmethod
    def from_load(cls, load: LoadStats, requests_total: int,
                  background: BackgroundWork | None = None) -> AutoscalingStats:
        """``background``: the router's own work on this replica, taken out of the demand
        (pre-warm on a new replica must not read as load that asks for more replicas).

        Its whole prompt comes off from the moment it starts: the engine's counters hold
        its done part while it runs (taking it off only at its end read each pre-warm as
        1 prefill-s/s of offered load with no request, and a cancelled one never came
        off). Where the engine counts done work (sim, mlx) the figure is cumulative and
        ``background`` keeps it rising with user work only; on vLLM it is the backlog.
        """
        bg = background if background is not None else BackgroundWork()
        rate = load.prefill_rate()
        backlog_s = max(0, load.queued_prefill_tokens - bg.running_tokens) / rate
        if load.prefill_busy_s > 0 or load.prefill_tokens_total > 0:
            done_s = load.prefill_busy_s if load.prefill_busy_s > 0 \
                else load.prefill_tokens_total / rate
            bg_tokens = bg.running_tokens + bg.ended_tokens
            work_s = bg.advance(done_s + (load.queued_prefill_tokens - bg_tokens) / rate)
        else:
            work_s = backlog_s
        return cls(backlog_s, work_s, requests_total, load.decode_batch, load.kv_usage)

    def to_serve(self) -> dict[str, float]:
        return {self.PREFIX + f.name: float(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_serve(cls, values: dict[str, float]) -> AutoscalingStats | None:
        """The stats from Serve's per-replica values; None if a key is missing (a replica
        from before an upgrade, or one whose first report has not arrived)."""
        try:
            got = {f.name: values[cls.PREFIX + f.name] for f in fields(cls)}
        except KeyError:
            return None
        got["requests_total"] = int(got["requests_total"])
        got["decode_batch"] = int(got["decode_batch"])
        return cls(**got)


class EngineError(RuntimeError):
    """The engine failed a request (not the caller's fault)."""


class InputRejected(ValueError):
    """The engine refuses this request's input (the caller's fault: a 400, not retried).

    A ``ValueError`` so that the runtimes' own input checks (vLLM raises ``ValueError``)
    are treated alike."""


@dataclass(frozen=True, slots=True)
class WorkRequest:
    """Router → worker: one generation. ``trace``: the W3C carrier of the router's span.
    ``cache_salt``: the tenant when ``index.tenant_isolation`` is on; the engine keeps and
    hashes its KV per salt, so tenants never share a cached prefix. ``lease_s``: keep this
    request's KV for that long after it ends, before unleased KV goes (``router.routing.leases``;
    engines without leases ignore it). ``loopback_node``: set by a router with
    ``router.stream_transport: loopback``; a replica on that node answers with a
    ``Handoff`` and sends the chunks over its loopback socket (``workers.transport.loopback``).
``background``: kept out of the autoscaling stats (``AutoscalingStats.from_load``)."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    trace: dict[str, str] | None = None
    cache_salt: str | None = None
    lease_s: float = 0.0
    loopback_node: str | None = None  # the router's Ray node: stream chunks over loopback
    background: bool = False  # the router's own work (pre-warm, lease renewal): not demand


@dataclass(frozen=True, slots=True)
class Chunk:
    """Released text and the token ids behind it (what a stream resumes from)."""

    replica: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # as ``TokenChunk``'s
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Final:
    """The last message: engine-measured usage, why it ended, and (embedded index only)
    the replica's cache events for the router to apply."""

    replica: str
    usage: Usage
    finish_reason: str  # "stop" | "length" | "abort"
    stop_sequence: str | None = None
    events: tuple[CacheEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """The engine refused the input (``InputRejected``): always the first message."""

    replica: str
    message: str
    status: int = 400


WorkerMessage = Chunk | Final | Rejected


@dataclass(frozen=True, slots=True)
class Handoff:
    """Worker → router on the Serve stream, in place of the first ``Chunk`` (``first``):
    the next chunks come over the replica's loopback socket at ``address`` once the
    router presents ``key`` (``workers.transport.loopback``); the ``Final`` (or the error) still
    comes over the Serve stream, after them."""

    replica: str
    first: Chunk
    address: str  # "127.0.0.1:port"
    key: str


def take_ready(first: object, queue: asyncio.Queue) -> list:  # type: ignore[type-arg]
    """``first`` and whatever ``queue`` holds now (never waiting), consecutive
    ``TokenChunk``s merged into one: a stream then sends in one message what is ready in
    one go, and never holds a token back (a token alone is sent alone)."""
    items = [first]
    while not queue.empty():
        item, last = queue.get_nowait(), items[-1]
        if isinstance(item, TokenChunk) and isinstance(last, TokenChunk):
            items[-1] = last.then(item)
        else:
            items.append(item)
    return items


# The loopback stream's frames (worker → router, ``workers.transport.loopback``):
# ``<kind:u8><length:u32 LE><payload>``. ``CHUNK``: ``<n:u32 LE>``, n token ids as u32 LE,
# then the text as UTF-8; ``END``: empty (the ``Final`` follows on the Serve stream).
CHUNK, END = 1, 2
FRAME_HEADER = struct.Struct("<BI")
_COUNT = struct.Struct("<I")
END_FRAME = FRAME_HEADER.pack(END, 0)


def token_array(ids: Sequence[int], n_tokens: int | None = None) -> array:
    """Token ids ``[:n_tokens]`` as u32 (every id is below 2**32: the wire's width), by way of
    ``hashing.token_bytes``: a copy of the bytes the router's ids carry (155k ids: 0.1 ms),
    else ``array()`` on a slice of the list (2 ms)."""
    out = array("I")
    out.frombytes(token_bytes(ids, n_tokens))
    if sys.byteorder != "little":  # pragma: no cover
        out.byteswap()
    return out


def chunk_frame(text: str, token_ids: tuple[int, ...]) -> bytes:
    body = text.encode()
    n = len(token_ids)
    return (FRAME_HEADER.pack(CHUNK, 4 + 4 * n + len(body)) + _COUNT.pack(n)
            + struct.pack(f"<{n}I", *token_ids) + body)


def parse_chunk(payload: memoryview) -> tuple[str, tuple[int, ...]]:
    """(text, token ids) of a ``CHUNK`` frame's payload."""
    (n,) = _COUNT.unpack_from(payload)
    ids = struct.unpack_from(f"<{n}I", payload, 4)
    return bytes(payload[4 + 4 * n:]).decode(), ids


@runtime_checkable
class Engine(Protocol):
    """What the worker deployment needs from an engine."""

    # Where the engine publishes its KV events in vLLM's ZMQ wire format, for peer routers
    # that read them (benchmarks); None for an engine that publishes none.
    kv_events_endpoint: str | None

    async def start(self) -> None: ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]: ...

    async def abort(self, request_id: str) -> None: ...

    def drain_cache_events(self) -> list[CacheEvent]: ...

    def load(self) -> LoadStats: ...

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...
