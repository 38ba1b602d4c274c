"""The router ingress: a FastAPI app as a Serve deployment.

A thin shim: each route hands the request to its API module (OpenAI chat and
completions, OpenAI Responses, Anthropic), which parses, templates and tokenizes once, then calls
``RouterCore`` (index lookup → pipeline → dispatch). Errors come back in the
API's own JSON shape: Anthropic's on /v1/messages, OpenAI's elsewhere.

No ``from __future__ import annotations`` here: FastAPI must see real types on
the route methods that Serve's ingress wrapper re-binds.
"""

import asyncio
import inspect
import logging
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from deploy.config import KvrouteConfig
from deploy.tracing import setup_tracing, shutdown_tracing
from router import telemetry
from router.api.anthropic import routes as anthropic_routes
from router.api.openai import models as openai_models
from router.api.openai import routes as openai_routes
from router.api.openai import tokenize as tokenize_routes
from router.api.responses import routes as responses_routes
from router.api.responses.store import ResponseStore
from router.app.client_guard import ClientGuardMiddleware
from router.app.edge import EdgeLimits
from router.app.listener import ONGOING_STAT, Listener
from router.app.metrics_hub import MetricsCache, push_metrics
from router.app.openapi import kvroute_openapi
from router.auth.keys import exposure_warning
from router.core import RouterCore
from router.dispatch.loopback_stream import Loopback
from router.errors import ApiError, error_response
from router.telemetry import TelemetryMiddleware

log = logging.getLogger(__name__)

def _fastapi_kwargs() -> dict[str, Any]:
    # FastAPI >= 0.150 traces requests natively; our middleware owns the root span
    # (it stays open across streamed bodies and carries the GenAI attributes).
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                              "auto_configure": False}}
    return {}


# openapi_url=None: /openapi.json is the Ingress route below, which needs a key when keys are on.
app = FastAPI(title="kvroute", docs_url=None, redoc_url=None, openapi_url=None,
              **_fastapi_kwargs())
app.add_middleware(ClientGuardMiddleware)  # inside the telemetry span: its 408 is recorded
app.add_middleware(TelemetryMiddleware)
app.openapi = lambda: kvroute_openapi(app)  # type: ignore[method-assign]  # with body schemas


@app.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return error_response(err, request.url.path)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return error_response(ApiError(400, f"invalid request: {err.errors()[:3]}"), request.url.path)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    """Unknown routes and wrong methods (404 / 405) in the API's own shape, not FastAPI's."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    what = f"{request.method} {request.url.path[:200]}: {err.detail}"
    resp = error_response(ApiError(err.status_code, what, code), request.url.path)
    resp.headers.update(err.headers or {})  # 405 names the allowed methods
    return resp


@app.exception_handler(Exception)
async def _unexpected(request: Request, err: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=err)
    return error_response(ApiError(500, "internal error in the router", "internal_error"),
                          request.url.path)


# Serve pickles the ingress class when it is decorated: everything it uses
# must be defined above this line.
@serve.ingress(app)
class Ingress:
    async def __init__(
        self, config: dict[str, Any], handles: dict[str, DeploymentHandle],
        metrics_hub: DeploymentHandle | None = None, direct_token: str | None = None,
        stream_token: str | None = None,
    ) -> None:
        setup_tracing("kvroute-router")
        cfg = KvrouteConfig.model_validate(config)  # the Redis URL from this process's env:
        self._config = cfg.model_copy(update={"index": cfg.index.resolved()})
        # Our own deadline, whatever a client's x-request-timeout-seconds told the proxy.
        app.state.request_timeout_s = cfg.server.request_timeout_s
        self._hub = metrics_hub
        self._direct_token = direct_token  # workers' direct_http token (benchmarks)
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._metrics = MetricsCache(metrics_hub, self._replica)
        loopback = None if stream_token is None else \
            Loopback(ray.get_runtime_context().get_node_id(), stream_token)
        self._core = RouterCore(self._config, handles, loopback)
        self._core.router_id = self._replica
        cfg = self._config
        self._responses = ResponseStore.from_url(
            cfg.index.redis_url, cfg.index.namespace, cfg.responses.store_ttl_s,
            cfg.responses.max_entry_bytes, cfg.responses.memory_bytes,
            telemetry.redis_share("responses", cfg.auth.key_names_in_metrics))
        if warning := exposure_warning(self._config.server.host, self._core.auth):
            log.warning(warning)
        self._maintainer = asyncio.get_running_loop().create_task(self._maintain())
        self._listener: Listener | None = None
        if cfg.server.ingress == "direct":
            self._listener = Listener(cfg.server.host, cfg.server.port, max_open=(
                cfg.router.max_ongoing_requests + cfg.router.max_queued_requests),
                limits=EdgeLimits.of(cfg.server), keep_alive_s=cfg.server.keep_alive_s)
            self._listening = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        """Serve the app on this replica's own listener (``server.ingress: direct``). Serve's
        ingress wrapper sets ``_asgi_app`` (the app with its routes bound to this replica)
        right after ``__init__`` returns, before this task first runs."""
        assert self._listener is not None
        app = getattr(self, "_asgi_app", None)
        if app is None:
            raise RuntimeError("Serve's ingress wrapper has not set the app")
        await self._listener.start(app, serve.get_replica_context().app_name)
        log.info("router replica %s listening on http://%s", self._replica,
                 self._listener.address)

    async def _maintain(self) -> None:
        period = self._config.router.maintenance_s
        while True:
            await asyncio.sleep(period)
            try:  # each index call has its own cap; this bounds the whole tick
                async with asyncio.timeout(period):
                    await self._core.maintain()
            except Exception:  # never let housekeeping die
                log.exception("router maintenance failed")
            try:  # bounded, and apart: a slow hub must not hold up replica purges
                await push_metrics(self._hub, self._replica, timeout_s=period)
            except Exception as e:
                log.warning("metrics push to the hub failed: %r", e)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """For Serve's autoscaler with ``server.ingress: direct``: the requests open on this
        replica's own listener, which Serve's count misses (``deploy.autoscale.router``)."""
        return {} if self._listener is None else {ONGOING_STAT: float(self._listener.ongoing)}

    async def check_health(self) -> None:
        """Serve's replica health check: with ``server.ingress: direct``, a listener that
        failed or stopped makes this replica unhealthy, so Serve replaces it."""
        if self._listener is not None and self._listening.done():
            self._listening.result()  # its start-up error, if any
            if not self._listener.serving:
                raise RuntimeError("the router replica's HTTP listener stopped")

    @app.head("/health", include_in_schema=False)  # load balancers' probes
    @app.get("/health")
    async def health(self) -> Response:
        ready = self._core.ready()
        ok = all(n > 0 for n in ready.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "replicas": ready},
                            status_code=200 if ok else 503)

    @app.get("/kvroute/replicas")
    async def replicas(self, request: Request) -> dict[str, Any]:
        """This router replica and every worker replica it sees, with their load."""
        self._core.auth.authenticate(request.headers)
        direct = {"direct_http_token": self._direct_token} if self._direct_token else {}
        return {
            "router": {"replica": self._replica, "node": ray.get_runtime_context().get_node_id()},
            "models": self._core.replica_stats(), **direct,
        }

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(self, request: Request) -> Response:
        self._core.auth.authenticate(request.headers)
        return JSONResponse(app.openapi())

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """Open by design, for Prometheus scrapers (docs/auth.md); cached ~1 s."""
        text = await self._metrics.text()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.head("/v1/models", include_in_schema=False)
    @app.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        self._core.auth.authenticate(request.headers)
        return openai_models.list_models(self._core)

    @app.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str, request: Request) -> dict[str, Any]:
        self._core.auth.authenticate(request.headers)
        return openai_models.retrieve_model(self._core, model_id)

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> dict[str, Any]:
        return await tokenize_routes.tokenize(self._core, request)

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> dict[str, Any]:
        return await tokenize_routes.detokenize(self._core, request)

    @app.get("/version")
    async def version(self) -> dict[str, str]:
        """Open, as vLLM's is: what a client checks before it sends anything."""
        return tokenize_routes.version()

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await openai_routes.chat_completions(self._core, request)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await openai_routes.completions(self._core, request)

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        return await responses_routes.create(self._core, self._responses, request)

    @app.post("/v1/messages")
    async def messages(self, request: Request) -> Response:
        return await anthropic_routes.messages(self._core, request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(self, request: Request) -> Response:
        return await anthropic_routes.count_tokens(self._core, request)

    async def __del__(self) -> None:
        if self._listener is not None:  # first: stop taking connections, finish open ones
            await self._listener.stop()
        self._maintainer.cancel()
        await self._core.close()
        await self._responses.close()
        shutdown_tracing()
