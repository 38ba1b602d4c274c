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
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context, trace
from ray.serve import context as serve_context

from deploy.tracing import extract, tracer
from router import metrics
from workers.protocol import Usage

TRACER = tracer("kvroute.router")
# One line per API request (docs/observability.md); under ray.serve so Serve's handlers
# write it to the router replica's log, next to Serve's own access lines.
ACCESS = logging.getLogger("ray.serve.kvroute.access")


@dataclass(slots=True)
class RequestInfo:
    started: float = field(default_factory=time.monotonic)
    model: str = ""
    first_token_at: float | None = None
    tokens_out: int = 0
    tokens_in: int = 0
    failed: bool = False
    key: str = "unauthenticated"  # the caller's key name (identify); never the key itself
    key_label: str = "unauthenticated"  # what the per-key metrics say (bounded by config)
    replica: str = ""
    request_id: str = ""
    tool_calls: int = 0  # tool calls in the reply (the API layers count them)
    client_gone: bool = False  # the client left before its answer was complete (a 499)
    on_end: Callable[[RequestInfo], None] | None = None  # a turn's end (router.routing.leases)


CURRENT: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "kvroute_request", default=None
)


def current() -> RequestInfo:
    return CURRENT.get() or RequestInfo()


def identify(name: str | None, names_in_metrics: bool = False) -> None:
    """The authenticator's word on this request's caller: a key name, or None when keys
    are off. Metrics get the name only if configured (/metrics is open), else "keyed"."""
    info = current()
    info.key = name or "anonymous"
    info.key_label = "anonymous" if name is None else (name if names_in_metrics else "keyed")


def redis_share(store: str, names_in_metrics: bool = False
                ) -> Callable[[str, int, int, int], None]:
    """A shared-Redis store's report of a key's share (key name, share, bytes written,
    bytes refused) into ``kvroute_key_redis_*``, labelled as the other per-key metrics are
    (the name only with ``auth.key_names_in_metrics``, else "keyed")."""
    def report(name: str, share: int, written: int, refused: int) -> None:
        label = name if names_in_metrics else "keyed"
        metrics.KEY_REDIS_SHARE.labels(label, store).set(share)
        if written:
            metrics.KEY_REDIS_WRITTEN.labels(label, store).inc(written)
        if refused:
            metrics.KEY_REDIS_REFUSED.labels(label, store).inc(refused)
    return report


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
    metrics.KEY_TOKENS.labels(info.key_label, m, "prompt").inc(prompt)
    metrics.KEY_TOKENS.labels(info.key_label, m, "output").inc(out)
    info.tokens_out, info.tokens_in = out, prompt
    span = trace.get_current_span()
    span.set_attribute("gen_ai.usage.input_tokens", prompt)
    span.set_attribute("gen_ai.usage.output_tokens", out)
    span.set_attribute("kvroute.cached_tokens", cached)
    span.set_attribute("kvroute.predicted_cached_tokens", predicted)


CLIENT_CLOSED = 499  # as nginx logs a request whose client left before the answer was complete


def outcome_of(info: RequestInfo, status: int) -> str:
    """The ``status`` label of the request counters: ok, rejected (4xx), error (5xx or a
    failed stream), or cancelled (the client left: never the server's error)."""
    if status == CLIENT_CLOSED:
        return "cancelled"
    if status < 400 and not info.failed:
        return "ok"
    return "error" if status >= 500 or info.failed else "rejected"


def _finish(info: RequestInfo, status: int, route: str) -> None:
    now = time.monotonic()
    if info.client_gone:
        status = CLIENT_CLOSED
    outcome = outcome_of(info, status)
    metrics.KEY_REQUESTS.labels(info.key_label, info.model, outcome).inc()
    _access_log(info, status, route, now)
    if not info.model:
        return  # rejected before a model was known: counted by status only
    metrics.REQUESTS.labels(info.model, outcome).inc()
    if info.on_end is not None and outcome == "ok":
        try:
            info.on_end(info)
        except Exception:  # what follows a turn must never break its accounting
            logging.getLogger(__name__).exception("turn end hook")
    metrics.E2E.labels(info.model).observe(now - info.started)
    if info.first_token_at is not None:
        metrics.TTFT.labels(info.model).observe(info.first_token_at - info.started)
        if info.tokens_out > 1:
            tpot = (now - info.first_token_at) / (info.tokens_out - 1)
            metrics.TPOT.labels(info.model).observe(tpot)


def _access_log(info: RequestInfo, status: int, route: str, now: float) -> None:
    """One structured line: who, what, where, how it went. No prompt text, no key."""
    ACCESS.info("%s", json.dumps({
        "route": route, "key": info.key, "model": info.model, "replica": info.replica,
        "status": status, "failed": info.failed, "prompt_tokens": info.tokens_in,
        "output_tokens": info.tokens_out, "latency_s": round(now - info.started, 4),
        "request_id": info.request_id}))


API_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses",
                        "/v1/messages", "/v1/messages/count_tokens", "/v1/models",
                        "/tokenize", "/detokenize"})
MODEL_ROUTE = "/v1/models/{model_id}"  # one route for every model name a client sends


def traced(path: str) -> bool:
    """Requests that get a span, the access log and the request counters: the API's."""
    return path.startswith("/v1/") or path in API_ROUTES


def _request_id(headers: Any) -> str:
    """The response's ``x-request-id``; else the id Serve's proxy or the router's own
    listener gave the request (they add the header outside the app, after this layer)."""
    for k, v in headers:
        if k.lower() == b"x-request-id":
            return bytes(v[:128]).decode("latin-1")  # client-chosen: bounded
    return serve_context._get_serve_request_context().request_id[:128]  # noqa: SLF001


def span_name(method: str, path: str) -> str:
    """The route, never the raw path: clients must not mint span names."""
    if path in API_ROUTES:
        return f"{method} {path}"
    return f"{method} {MODEL_ROUTE if path.startswith('/v1/models/') else '/v1/{unknown}'}"


class TelemetryMiddleware:
    """Pure ASGI, so it sees the end of streamed bodies."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not traced(scope["path"]):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        route = span_name(scope["method"], scope["path"])
        span = TRACER.start_span(route,
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

        def send_wrapped(message: dict[str, Any]) -> Awaitable[None]:
            # Not a coroutine of its own: the caller awaits ``send``'s (one frame less per
            # streamed chunk, in each of the router's ASGI layers).
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                info.request_id = _request_id(message.get("headers", ()))
            return send(message)

        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            span.set_attribute("http.response.status_code", status)
            if info.model:
                span.set_attribute("gen_ai.request.model", info.model)
            span.end()
            _finish(info, status, route)
            CURRENT.reset(info_token)
            context.detach(token)
