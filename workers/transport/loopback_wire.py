"""The frames of a loopback call (``workers.transport.loopback_call``): a request started on a
replica over its loopback socket, not the Serve handle, and every message back.

Frames are ``workers.protocol``'s ``<kind:u8><length:u32 LE><payload>``; ``CHUNK`` is
shared with the loopback stream. Router → worker: one ``REQUEST`` (a JSON header, then
the prompt's token ids as u32 LE). Worker → router: ``CHUNK``s, then one ``FINAL``;
or ``REJECTED`` (the engine refused the input), ``ERROR`` (the replica failed: retried
before the first chunk, resumed after it) or ``BUSY`` (the replica is at
``max_ongoing_requests`` or stopping: the router sends the request through Serve, which
queues it). The peer holds the app's stream token, yet every field is checked: a bad
frame is ``ValueError``, never a crash or a pickle.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from array import array
from dataclasses import replace
from typing import Any

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import U32Ids, token_bytes
from workers.protocol import (
    CHUNK,
    FRAME_HEADER,
    Constraint,
    Final,
    Rejected,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
    Usage,
    WorkRequest,
    chunk_frame,
)
from workers.transport.sampling_wire import controls, with_controls

CALL_KEY = "call"  # the handshake's first word for a call (a stream's slot keys are hex)
FINAL, REJECTED, ERROR, BUSY, REQUEST = 3, 4, 5, 6, 7
LOGPROBS = 8  # a CHUNK with its logprobs (``chunk_frames``)
KINDS = frozenset({CHUNK, FINAL, REJECTED, ERROR, BUSY, LOGPROBS})  # worker → router
BUSY_FRAME = FRAME_HEADER.pack(BUSY, 0)
MAX_REQUEST_BYTES = 64 << 20  # 16M token ids: far above any context window
IDS_STEP = 16384  # token ids parsed per step of the replica's loop (``ids_in_steps``)
_EVENTS = {"stored": BlockStored, "removed": BlockRemoved}


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` and wait for the socket. A connection the router closed is
    ``ConnectionResetError``: uvloop raises ``RuntimeError`` on a closed handle."""
    if writer.is_closing():
        raise ConnectionResetError("the router closed the loopback connection")
    writer.write(data)
    await writer.drain()


def _ints(data: bytes | memoryview) -> list[int]:
    out = array("I")
    out.frombytes(data)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tolist()


def _from_ids(data: bytes | memoryview) -> U32Ids:
    ids = U32Ids(_ints(data))
    ids.u32 = bytes(data)  # the engine's hashes slice it (``hashing.token_bytes``)
    return ids


async def ids_in_steps(data: bytes | memoryview) -> U32Ids:
    """``_from_ids`` ``IDS_STEP`` ids at a time, yielding to the loop between: one
    ``tolist`` of a 156k-id prompt held the replica's loop 6-10 ms, and every stream it
    serves with it."""
    view, ids = memoryview(data), U32Ids()
    for start in range(0, len(view), 4 * IDS_STEP):
        if start:
            await asyncio.sleep(0)
        ids += _ints(view[start:start + 4 * IDS_STEP])
    ids.u32 = bytes(view)
    return ids


def frame(kind: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(kind, len(payload)) + payload


def request_frame(work: WorkRequest) -> bytes:
    s = work.sampling
    head = json.dumps({
        "request_id": work.request_id, "trace": work.trace, "cache_salt": work.cache_salt,
        "lease_s": work.lease_s, "background": work.background,
        "sampling": [s.max_tokens, s.temperature, s.top_p, list(s.stop), s.seed,
                     s.ignore_eos],
        "constraint": _constraint_head(s.constraint),
        "controls": controls(s),
        "logprobs": [s.logprobs, s.prompt_logprobs],
    }).encode()
    return frame(REQUEST, len(head).to_bytes(4, "little") + head + token_bytes(work.token_ids))


def _constraint_head(c: Constraint | None) -> list[Any] | None:
    return None if c is None else [c.kind, c.text, list(c.choices)]


def _parse_constraint(v: Any) -> Constraint | None:
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 3:
        raise ValueError("loopback request: bad constraint")
    kind, text, choices = v
    try:
        return Constraint(_typed(kind, (str,), "constraint"), _typed(text, (str,), "constraint"),
                          tuple(_typed(c, (str,), "constraint")
                                for c in _typed(choices, (list,), "constraint")))
    except ValueError as e:
        raise ValueError(f"loopback request: bad constraint: {e}") from e


def _typed(value: Any, kinds: tuple[type, ...], name: str) -> Any:
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"loopback request: bad {name}")
    return value


def _number(value: Any, name: str, low: float = 0.0) -> float:
    """A finite number at least ``low`` (JSON lets NaN and Infinity through)."""
    out = float(_typed(value, (int, float), name))
    if not math.isfinite(out) or out < low:
        raise ValueError(f"loopback request: bad {name}")
    return out


def ids_part(payload: bytes) -> memoryview:
    """The token ids' bytes of a ``REQUEST`` frame's payload; ``ValueError`` if the
    lengths are off."""
    n = int.from_bytes(payload[:4], "little")
    if len(payload) < 4 + n or (len(payload) - 4 - n) % 4:
        raise ValueError("loopback request: bad lengths")
    return memoryview(payload)[4 + n:]


def parse_request(payload: bytes, token_ids: list[int] | None = None) -> WorkRequest:
    """The ``REQUEST`` frame's payload; ``ValueError`` if it is not one. ``token_ids``:
    its ids, already parsed (``ids_in_steps``)."""
    ids = ids_part(payload)
    n = len(payload) - len(ids) - 4
    head = json.loads(payload[4:4 + n])
    if not isinstance(head, dict):
        raise ValueError("loopback request: bad header")
    sampling = _typed(head.get("sampling"), (list,), "sampling")
    if len(sampling) != 6:
        raise ValueError("loopback request: bad sampling")
    mt, temp, top_p, stop, seed, ignore_eos = sampling
    trace = _typed(head.get("trace"), (dict, type(None)), "trace")
    if trace is not None and not all(isinstance(k, str) and isinstance(v, str)
                                     for k, v in trace.items()):
        raise ValueError("loopback request: bad trace")
    stop = tuple(_typed(x, (str,), "stop") for x in _typed(stop, (list,), "stop"))
    logprobs, prompt_logprobs = _logprob_counts(head.get("logprobs", [None, None]))
    work = WorkRequest(
        request_id=_typed(head.get("request_id"), (str,), "request_id"),
        token_ids=_from_ids(ids) if token_ids is None else token_ids,
        sampling=SamplingParams(int(_number(_typed(mt, (int,), "max_tokens"), "max_tokens", 1)),
                                _number(temp, "temperature"), _number(top_p, "top_p"), stop,
                                _typed(seed, (int, type(None)), "seed"),
                                _typed(ignore_eos, (bool,), "ignore_eos"),
                                constraint=_parse_constraint(head.get("constraint")),
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs),
        trace=trace,
        cache_salt=_typed(head.get("cache_salt"), (str, type(None)), "cache_salt"),
        lease_s=_number(head.get("lease_s"), "lease_s"),
        background=_typed(head.get("background"), (bool,), "background"),
    )
    return replace(work, sampling=with_controls(work.sampling, head.get("controls")))


def _event(e: CacheEvent) -> list[Any]:
    if isinstance(e, AllBlocksCleared):
        return ["cleared", e.model, e.replica]
    return ["stored" if isinstance(e, BlockStored) else "removed", e.model, e.replica,
            list(e.hashes), e.tier]


def _parse_event(v: Any) -> CacheEvent:
    if not isinstance(v, list) or not v:
        raise ValueError("loopback final: bad event")
    if v[0] == "cleared" and len(v) == 3:
        return AllBlocksCleared(str(v[1]), str(v[2]))
    if v[0] not in _EVENTS or len(v) != 5 or not isinstance(v[3], list):
        raise ValueError("loopback final: bad event")
    return _EVENTS[v[0]](str(v[1]), str(v[2]), tuple(int(h) for h in v[3]), v[4])


def final_frame(final: Final) -> bytes:
    u = final.usage
    return frame(FINAL, json.dumps({
        "replica": final.replica, "finish_reason": final.finish_reason,
        "stop_sequence": final.stop_sequence,
        "usage": [u.prompt_tokens, u.completion_tokens, u.cached_tokens,
                  u.host_cached_tokens],
        "events": [_event(e) for e in final.events]}).encode())


def parse_final(payload: bytes | memoryview) -> Final:
    v = json.loads(bytes(payload))
    usage = v["usage"]
    if not (isinstance(usage, list) and len(usage) == 4
            and all(isinstance(x, int) for x in usage)):
        raise ValueError("loopback final: bad usage")
    return Final(str(v["replica"]), Usage(*usage), str(v["finish_reason"]),
                 v["stop_sequence"] if isinstance(v["stop_sequence"], str) else None,
                 tuple(_parse_event(e) for e in v["events"]))


def rejected_frame(msg: Rejected) -> bytes:
    return frame(REJECTED, json.dumps([msg.replica, msg.message, msg.status]).encode())


def parse_rejected(payload: bytes | memoryview) -> Rejected:
    replica, message, status = json.loads(bytes(payload))
    return Rejected(str(replica), str(message), int(status))


def error_frame(message: str) -> bytes:
    return frame(ERROR, message.encode()[:4096])


def _logprob_counts(v: Any) -> tuple[int | None, int | None]:
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError("loopback request: bad logprobs")
    return tuple(None if n is None else int(_number(_typed(n, (int,), "logprobs"), "logprobs"))
                 for n in v)  # type: ignore[return-value]


def chunk_frames(text: str, token_ids: tuple[int, ...], logprobs: tuple[TokenLogprob, ...] = (),
                 prompt: tuple[TokenLogprob, ...] = ()) -> bytes:
    """A chunk's ``CHUNK`` frame or, when it carries logprobs, its ``LOGPROBS`` frame:
    ``<n:u32 LE>`` n bytes of JSON (the logprobs), then a ``CHUNK`` frame's payload."""
    chunk = chunk_frame(text, token_ids)
    if not logprobs and not prompt:
        return chunk
    body = json.dumps([[_logprob(x) for x in logprobs], [_logprob(x) for x in prompt]]).encode()
    return frame(LOGPROBS, len(body).to_bytes(4, "little") + body
                 + chunk[FRAME_HEADER.size:])


def _logprob(x: TokenLogprob) -> list[Any]:
    return [x.token_id, x.token, x.logprob, x.rank,
            [[t.token_id, t.token, t.logprob] for t in x.top]]


def parse_logprobs(payload: memoryview) -> tuple[
        memoryview, tuple[TokenLogprob, ...], tuple[TokenLogprob, ...]]:
    """(its ``CHUNK`` payload, the tokens' logprobs, the prompt's) of a ``LOGPROBS``
    frame's payload; ``ValueError`` if it is not one."""
    n = int.from_bytes(payload[:4], "little")
    if len(payload) < 4 + n:
        raise ValueError("loopback chunk: bad lengths")
    v = json.loads(bytes(payload[4:4 + n]))
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(p, list) for p in v):
        raise ValueError("loopback chunk: bad logprobs")
    chunk = memoryview(bytes(payload[4 + n:]))  # a copy: the caller's buffer may resize
    return chunk, tuple(map(_parse_logprob, v[0])), tuple(map(_parse_logprob, v[1]))


def _parse_logprob(v: Any) -> TokenLogprob:
    if not isinstance(v, list) or len(v) != 5 or not isinstance(v[4], list):
        raise ValueError("loopback chunk: bad logprob")
    top = tuple(TopLogprob(*_top(t)) for t in v[4])
    return TokenLogprob(*_top(v[:3]), rank=_typed(v[3], (int,), "rank"), top=top)


def _top(v: Any) -> tuple[int, str, float]:
    if not isinstance(v, list) or len(v) != 3:
        raise ValueError("loopback chunk: bad logprob")
    lp = float(_typed(v[2], (int, float), "logprob"))
    if lp != lp or lp > 0:  # NaN, or above log(1)
        raise ValueError("loopback chunk: bad logprob")
    return _typed(v[0], (int,), "token id"), _typed(v[1], (str,), "token"), lp
