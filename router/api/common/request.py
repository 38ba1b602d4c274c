"""Request plumbing every front end shares (``router.api.common.flow`` runs it): the
bounded body, its parse, the prompt's encoding, the output budget, sampling and the
reply's headers and stream. It reads the core only through its surface (``server``,
``targets``, ``predicted_header``); the model comes in as a ``Target``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from ray import serve

from router.auth.bodies import BodyWaits, body_owner
from router.auth.keys import ApiKeyConfig
from router.core import Generation, RouterCore
from router.errors import ApiError
from router.output.reasoning_parsers import fit_history
from router.prompt.template import ChatPrompt
from router.prompt.tokenizer import TemplateRenderError
from router.routing.target import Target

MAX_BODY_BYTES = 8 << 20  # the default of ServerConfig.max_body_bytes (docs/reliability.md)
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """How much body a route reads before refusing it, all before any parsing.

    ``max_bytes``: the configured hard limit. ``window_bytes``: the cheap bound against the
    context window, the largest window of the models × a generous bytes-per-token bound, plus
    slack for the JSON around the text and tools a template leaves out: a body over it cannot
    fit any model, so it is refused before it is parsed, templated or tokenized."""

    max_bytes: int = MAX_BODY_BYTES
    window_bytes: int | None = None
    read_timeout_s: float | None = None  # the whole body must arrive within it (slow clients)
    waits: BodyWaits | None = None  # bodies being read per owner (``router.auth.bodies``)
    owner: str = ""

    @property
    def limit(self) -> int:
        return min(self.max_bytes, self.window_bytes or self.max_bytes)

    def refusal(self, size: int) -> ApiError:
        if size > self.max_bytes:
            return ApiError(413, f"request body over {self.max_bytes} bytes", "body_too_large")
        return ApiError(413, f"request body over {self.limit} bytes cannot fit the context "
                        "window of any model served here", "body_too_large")


WINDOW_SLACK_BYTES = 1 << 20


def body_limits(core: RouterCore, key: ApiKeyConfig | None = None,
                request: Request | None = None) -> BodyLimits:
    """With ``request``: its body counts against its key's bound (``router.auth.bodies``;
    keys off: its client address's) while it is read."""
    server = core.server
    owner = "" if request is None else \
        body_owner(key, request.client.host if request.client else None)
    return BodyLimits(server.max_body_bytes,
                      core.targets.max_window * server.body_bytes_per_token + WINDOW_SLACK_BYTES,
                      server.body_read_timeout_s, core.body_waits if owner else None, owner)


async def read_body(request: Request, limits: BodyLimits | None = None) -> bytes:
    """The body, refused with a 413 as soon as it is known to be over the limit.

    A declared ``Content-Length`` over the limit is refused before reading anything, and a
    chunked body stops being read at the limit, so an oversized upload is never held whole.
    While it is read it counts against its owner's bound (a 429 past it, before reading).
    """
    limits = limits or BodyLimits()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.limit:
        raise limits.refusal(int(declared))
    if limits.waits is None:
        return await _read(request, limits)
    with limits.waits.hold(limits.owner):
        return await _read(request, limits)


async def _read(request: Request, limits: BodyLimits) -> bytes:
    limit = limits.limit
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise limits.refusal(size)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.read_timeout_s} s",
                       "body_timeout") from None
    return b"".join(chunks)


async def parse_body(request: Request, schema: type[M], limits: BodyLimits | None = None) -> M:
    """JSON body → pydantic model; every failure is a 400/413 ``ApiError``."""
    body = await read_body(request, limits)
    try:
        # pydantic's own JSON parser: it rejects invalid UTF-8, lone surrogates (which
        # json.loads lets through and the tokenizer then chokes on) and absurd nesting.
        return schema.model_validate_json(body)
    except ValidationError as e:
        raise _invalid(e.errors()) from None


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _invalid(errors: list[Any]) -> ApiError:
    """The 400 for the most specific error: a union's deepest branch, not its first."""
    if bad_json := next((e for e in errors if e.get("type") == "json_invalid"), None):
        reason = (bad_json.get("ctx") or {}).get("error", bad_json.get("msg"))
        return ApiError(400, f"body is not valid JSON: {reason}", "invalid_json")
    err = max(errors, key=lambda e: len(e.get("loc", ())))
    parts: list[str] = []
    for p in map(str, err.get("loc", ())):  # drop pydantic's union-branch labels
        if "[" not in p and p not in _TYPE_LABELS and (not parts or parts[-1] != p):
            parts.append(p)
    param = ".".join(parts)
    return ApiError(400, f"{param}: {err.get('msg')}", "invalid_request", param)


_SECRET_HEADERS = frozenset({"authorization", "x-api-key"})


def forwarded_headers(request: Request) -> dict[str, str]:
    """Request headers for routing plugins and traces, without the API key."""
    return {k: v for k, v in request.headers.items() if k not in _SECRET_HEADERS}


def request_id(prefix: str) -> str:
    """Serve's request id, so the body id, logs and the x-request-id header agree."""
    rid = serve.context._get_serve_request_context().request_id  # noqa: SLF001
    return rid or f"{prefix}-{uuid.uuid4().hex}"


class Closes(Protocol):
    """A generation, or all of a request's (``router.api.common.fanout.Generations``)."""

    def close(self) -> None: ...


class GenerationStream(StreamingResponse):
    """A streamed reply that closes its generation however the response ends: a client
    that leaves before the body's first byte never starts the body's generator, whose
    own ``finally`` would then never run (the worker request would go on)."""

    def __init__(self, body: AsyncIterator[bytes], gen: Closes,
                 headers: dict[str, str]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={**headers, "cache-control": "no-cache"})
        self.gen = gen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.gen.close()


def routing_headers(core: RouterCore, gen: Generation) -> dict[str, str]:
    # Serve itself echoes x-request-id (the client's, or its own).
    out = {"x-kvroute-router": gen.router, "x-kvroute-model": gen.model,
           "x-kvroute-replica": gen.replica}
    if core.predicted_header:  # index.predicted_cached_header
        out["x-kvroute-predicted-cached-tokens"] = str(gen.predicted_cached_tokens)
    return out


MAX_TOKENS_CUT = "x-kvroute-max-tokens-cut"


def budget_headers(cut: bool, budget: int) -> dict[str, str]:
    """Say that the client's output limit was cut to fit the window, and to what."""
    return {MAX_TOKENS_CUT: str(budget)} if cut else {}


async def encode_prompt(target: Target, prompt: ChatPrompt) -> list[int]:
    """Render the chat template and tokenize, once, in the tokenize pool (off the event
    loop; only the new part of a growing prompt is tokenized, ``router.prompt.cache``, in
    the target's tenant's cache); a conversation the template refuses is a 400."""
    tok = target.tokenizer
    messages = fit_history(tok.template_source, prompt.messages)
    try:
        return await tok.encode_chat(messages, prompt.tools, prompt.prefill or "",
                                    prompt.options, target.tenant)
    except TemplateRenderError as e:
        raise ApiError(400, str(e), "invalid_messages", "messages") from None


@dataclass(frozen=True, slots=True)
class Overflow:
    """A prompt that alone fills the context window: ``tokens`` counted (or, ``at_least``,
    a lower bound from its text before tokenizing) against ``window``."""

    tokens: int
    window: int
    at_least: bool = False


def too_long(o: Overflow, param: str = "messages") -> ApiError:
    """OpenAI's and vLLM's answer to a prompt over the window: a 400 (not a 413, which is
    for bodies over the byte limit)."""
    counted = f"at least {o.tokens}" if o.at_least else str(o.tokens)
    return ApiError(400, f"This model's maximum context length is {o.window} tokens. However, "
                    f"your prompt has {counted} tokens. Please reduce the length of the "
                    "prompt.", "context_length_exceeded", param)


def text_chars(prompt: ChatPrompt) -> int:
    """The characters of text in a prompt's messages (the template and tools only add)."""
    return len(prompt.prefill or "") + sum(
        len(c) for m in prompt.messages if isinstance(c := m.get("content"), str))


def output_budget(target: Target, prompt_len: int, limit: int | None,
                  overflow: Callable[[Overflow], ApiError] = too_long) -> tuple[int, bool]:
    """(the max_tokens to use, whether ``limit`` was cut to fit the context): the one
    context-window check of every API. A group's largest window counts. The limit is an
    upper bound on every API (Qwen Code asks for 32000 on any model): over the room the
    prompt leaves, it is cut to that room. No ``limit``: the models' default, capped by the
    room. A prompt that alone fills the window is ``overflow``'s 400."""
    room = target.window - prompt_len
    if room <= 0:
        raise overflow(Overflow(prompt_len, target.window))
    if limit is None:
        return min(target.default_max_tokens, room), False
    return min(limit, room), limit > room


def check_text_fits(target: Target, chars: int,
                    overflow: Callable[[Overflow], ApiError] = too_long) -> None:
    """The cheap bound before the template and the tokenizer run: a prompt of ``chars``
    characters of text holds at least ``chars / bytes_per_token`` tokens, so one over
    ``target.max_prompt_chars`` cannot fit, whatever its tokens."""
    if chars > target.max_prompt_chars:
        raise overflow(Overflow(-(-chars // target.bytes_per_token), target.window,
                                at_least=True))

