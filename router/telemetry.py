"""Request-scoped telemetry for the router: the root span and the request metrics.

An ASGI middleware opens one server span per API request (continuing an incoming
W3C ``traceparent``) and keeps it open until the last byte of a streamed body is
sent, so router spans (tokenize, index lookup, each plugin, dispatch) and the
worker's spans (prefill, decode) all land in one trace. A mutable
``RequestInfo`` travels in a context variable; the routing core fills it in and
the middleware turns it into metrics when the response ends.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context, trace

from deploy.tracing import extract, tracer
from router import metrics
from workers.protocol import Usage

TRACER = tracer("kvroute.router")


@dataclass(slots=True)
class RequestInfo:
    started: float = field(default_factory=time.monotonic)
    model: str = ""
    first_token_at: float | None = None
    tokens_out: int = 0
    failed: bool = False


CURRENT: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "kvroute_request", default=None
)


def current() -> RequestInfo:
    return CURRENT.get() or RequestInfo()


def record_usage(info: RequestInfo, usage: Usage, predicted: int) -> None:
    """Called once per finished generation: usage counters and span attributes."""
    prompt, cached, out = usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
    m = info.model
    metrics.PROMPT_TOKENS.labels(m).inc(prompt)
    metrics.CACHED_TOKENS.labels(m).inc(cached)
    if usage.host_cached_tokens:
        metrics.HOST_CACHED_TOKENS.labels(m).inc(usage.host_cached_tokens)
    metrics.PREDICTED_TOKENS.labels(m).inc(predicted)
    metrics.OUTPUT_TOKENS.labels(m).inc(out)
    info.tokens_out = out
    span = trace.get_current_span()
    span.set_attribute("gen_ai.usage.input_tokens", prompt)
    span.set_attribute("gen_ai.usage.output_tokens", out)
    span.set_attribute("kvroute.cached_tokens", cached)
    span.set_attribute("kvroute.predicted_cached_tokens", predicted)


def _finish(info: RequestInfo, status: int) -> None:
    if not info.model:
        return  # rejected before a model was known: counted by status only
    now = time.monotonic()
    outcome = "ok" if status < 400 and not info.failed else ("error" if status >= 500 or
                                                            info.failed else "rejected")
    metrics.REQUESTS.labels(info.model, outcome).inc()
    metrics.E2E.labels(info.model).observe(now - info.started)
    if info.first_token_at is not None:
        metrics.TTFT.labels(info.model).observe(info.first_token_at - info.started)
        if info.tokens_out > 1:
            tpot = (now - info.first_token_at) / (info.tokens_out - 1)
            metrics.TPOT.labels(info.model).observe(tpot)


API_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses",
                        "/v1/messages", "/v1/messages/count_tokens", "/v1/models"})


def span_name(method: str, path: str) -> str:
    """The route, never the raw path: clients must not mint span names (review finding 15)."""
    return f"{method} {path if path in API_ROUTES else '/v1/{unknown}'}"


class TelemetryMiddleware:
    """Pure ASGI, so it sees the end of streamed bodies."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        span = TRACER.start_span(span_name(scope["method"], scope["path"]),
                                 context=extract(headers),
                                 kind=trace.SpanKind.SERVER)
        # Consumed here: inner instrumentation (FastAPI's own) then nests under our span
        # instead of starting a sibling from the same header.
        scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                      if k.lower() not in (b"traceparent", b"tracestate")]}
        token = context.attach(trace.set_span_in_context(span))
        info = RequestInfo()
        info_token = CURRENT.set(info)
        status = 500

        async def send_wrapped(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            span.set_attribute("http.response.status_code", status)
            if info.model:
                span.set_attribute("gen_ai.request.model", info.model)
            span.end()
            _finish(info, status)
            CURRENT.reset(info_token)
            context.detach(token)
