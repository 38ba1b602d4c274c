"""A replica's own OpenAI endpoint on loopback, bypassing the router.

For ``kvroute bench compare``: other routers (sglang-router, a plain
round-robin) are pointed at these endpoints, so every router drives the same
replicas, and kvroute's own overhead is measured against calling a replica
directly. Turned on by ``ModelConfig.direct_http``.

It serves, on ``127.0.0.1`` and a free port:

* ``POST /v1/chat/completions``: the chat is templated and tokenized exactly as the
  router does it (``ChatCompletionRequest.template_messages``, the model's chat
  template via ``ChatTokenizer``), so a conversation reaches the engine as the same
  token ids whichever way it came; tool calls are parsed, and replies encoded, by the
  router's own code (``router.api.openai``: ``ChatReply`` over ``ChatOutput``).
* ``POST /v1/completions``: ``prompt`` as a string or a list of token ids.
* Both stream (SSE, ``stream_options.include_usage``) or not, with usage carrying
  ``prompt_tokens_details.cached_tokens`` from the engine, and the header
  ``x-kvroute-replica``.
* What sglang-router probes at startup and while routing: ``GET /health``,
  ``/health_generate``, ``/v1/models``, ``/get_model_info``, ``/get_server_info``
  (and ``/server_info``, ``/model_info``), ``/get_load``; ``POST /flush_cache`` is
  accepted and does nothing.

It runs with uvicorn inside the replica's event loop (``router/app/asgi_server.py``: a socket
bound first, no signal capture). Prompts are encoded on one worker thread of
its own (``encode_batch`` releases the GIL), which ``stop()`` shuts down: a long
prompt must not stall the engine that shares this event loop (a real serving
stack tokenizes outside its scheduler too).

Not kvroute's router: no prefix index, no retries, no API keys, no rate limits. Its POST
routes (generation, tokenization) need ``Authorization: Bearer <token>``, the random token
the app builder makes per deployment: any process on the pod's or
host's loopback could otherwise bypass kvroute's keys and limits. GET probes stay open. In
memory-index mode the worker piggybacks its cache events on each final message;
the ones of requests served here are dropped (nothing routes on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer

from router.api.common import sampling as sp
from router.api.openai import encode as oa
from router.api.openai import logprobs as lpx
from router.api.openai.routes import ChatReply
from router.api.openai.schema import (
    COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)
from router.api.openai.structured import output_constraint
from router.app.asgi_server import AsgiServer, bind
from router.errors import ApiError, openai_error
from router.output import tool_calls as tc
from router.prompt.tokenizer import ChatTokenizer, TemplateRenderError, resolve_model_dir
from workers.protocol import (
    Chunk,
    Final,
    Rejected,
    WorkerMessage,
    WorkRequest,
)

Generate = Callable[[WorkRequest], AsyncIterator[WorkerMessage]]
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)
DEFAULT_MAX_TOKENS = 1024
_STOP_TIMEOUT_S = 10.0


class _DirectCompletion(CompletionRequest):
    also_honoured = frozenset({"return_token_ids"})
    return_token_ids: bool = Field(False, description="vLLM's: each streamed choice also "
                                   "carries the engine's token ids (``token_ids``)")


class _TokenGate:
    """POST needs the deployment's bearer token (constant-time compare); GET probes do not."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self._expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self._expected):
                err = ApiError(401, "this endpoint needs the deployment's direct_http token",
                               "invalid_api_key")
                return await openai_error(err)(scope, receive, send)
        await self.app(scope, receive, send)


class DirectHttp:
    """One replica's OpenAI endpoint (see the module docstring); ``token`` None = open
    (in-process tests and tools only: the builder always sets one)."""

    def __init__(self, model: str, model_path: str, generate: Generate,
                 token: str | None = None, host: str = "127.0.0.1") -> None:
        self.model, self.model_path, self._generate, self.host = model, model_path, generate, host
        self._token = token
        self.address: str | None = None
        self.ongoing = 0
        self._tok: ChatTokenizer | None = None
        self._encoder: Tokenizer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._parser_family: str | None = None
        self._server: AsgiServer | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Bind a free port on ``host`` and serve; returns once the server accepts."""
        self._tok = ChatTokenizer(self.model_path)
        self._encoder = Tokenizer.from_file(str(resolve_model_dir(self.model_path) /
                                                "tokenizer.json"))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="direct-http-encode")
        self._parser_family = tc.family_for_model(self.model_path)
        self._server = AsgiServer(self.app(), bind(self.host), graceful_s=_STOP_TIMEOUT_S)
        await self._server.start()
        self.address = self._server.address
        log.info("direct OpenAI endpoint of %s on http://%s", self.model, self.address)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        self._server = None
        self.address = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def app(self) -> Starlette | _TokenGate:
        get = ["GET"]
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=get),
            Route("/health", self._health, methods=get),
            Route("/health_generate", self._health, methods=get),
            Route("/get_model_info", self._model_info, methods=get),
            Route("/model_info", self._model_info, methods=get),
            Route("/get_server_info", self._server_info, methods=get),
            Route("/server_info", self._server_info, methods=get),
            Route("/get_load", self._load, methods=get),
            Route("/flush_cache", self._health, methods=["POST", "GET"]),
            # vllm-router tokenizes through its workers before routing (kv_aware)
            Route("/v1/chat/completions/render", self._render_chat, methods=["POST"]),
            Route("/v1/completions/render", self._render_completion, methods=["POST"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/version", self._version, methods=get),
        ]
        app = Starlette(routes=routes)
        return app if self._token is None else _TokenGate(app, self._token)

    # -- info endpoints ----------------------------------------------------------------
    async def _health(self, _: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, _: Request) -> Response:
        data = [{"id": self.model, "object": "model", "owned_by": "kvroute", "created": 0,
                 "root": self.model_path}]
        return JSONResponse({"object": "list", "data": data})

    async def _model_info(self, _: Request) -> Response:
        return JSONResponse({"model_path": self.model_path, "tokenizer_path": self.model_path,
                             "served_model_name": self.model, "is_generation": True})

    async def _server_info(self, _: Request) -> Response:
        return JSONResponse({"model_path": self.model_path, "tokenizer_path": self.model_path,
                             "served_model_name": self.model, "dp_size": 1, "tp_size": 1,
                             "version": "kvroute-direct"})

    async def _version(self, _: Request) -> Response:
        return JSONResponse({"version": "kvroute-direct"})

    async def _load(self, _: Request) -> Response:
        return JSONResponse([{"dp_rank": 0, "num_reqs": self.ongoing, "num_waiting_reqs": 0}])

    # -- generation --------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        try:
            req = await _parse(request, ChatCompletionRequest)
            if req.copies() != 1:  # the router fans out, not a replica
                raise ApiError(400, "a replica's own endpoint serves n = 1", "invalid_request",
                               "n")
            parser = None
            if req.parses_tools():
                parser = tc.make_parser(self._parser_family, tc.schemas(req.template_tools()))
            return await self._serve(req, await self._chat_ids(req), True, parser)
        except ApiError as e:
            return openai_error(e)

    async def _chat_ids(self, req: ChatCompletionRequest) -> list[int]:
        self._check_model(req.model)
        assert self._tok is not None
        try:
            text, marked = self._tok.render_marked(req.template_messages(),
                                                   tools=req.template_tools())
        except TemplateRenderError as e:
            raise ApiError(400, str(e), "invalid_messages", "messages") from None
        return await self._encode(text, marked)

    async def _completions(self, request: Request) -> Response:
        try:
            req = await _parse(request, _DirectCompletion)
            return await self._serve(req, await self._prompt_ids(req), False, None)
        except ApiError as e:
            return openai_error(e)

    async def _prompt_ids(self, req: CompletionRequest) -> list[int]:
        self._check_model(req.model)
        assert self._tok is not None
        if len(req.prompts()) != 1 or req.copies() != 1:  # the router fans out, not a replica
            raise ApiError(400, "a replica's own endpoint serves one prompt and n = 1",
                           "invalid_request", "prompt" if len(req.prompts()) != 1 else "n")
        if isinstance(req.prompt, str):
            ids = await self._encode(req.prompt)
        else:
            ids = list(req.prompt)
            if any(t < 0 or t >= self._tok.vocab_size for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, "
                               f"{self._tok.vocab_size})", "invalid_token_ids", "prompt")
        if not ids:
            raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
        return ids

    # vLLM's render endpoints: the prompt's token ids, as the engine would get them.
    async def _render_chat(self, request: Request) -> Response:
        try:
            req = await _parse(request, ChatCompletionRequest)
            return JSONResponse({"token_ids": await self._chat_ids(req), "model": req.model})
        except ApiError as e:
            return openai_error(e)

    async def _render_completion(self, request: Request) -> Response:
        try:
            req = await _parse(request, CompletionRequest)
            return JSONResponse([{"token_ids": await self._prompt_ids(req), "model": req.model}])
        except ApiError as e:
            return openai_error(e)

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize``: ``prompt`` (text) or ``messages`` (a chat)."""
        try:
            body = json.loads(await request.body())
            if isinstance(body, dict) and "messages" in body:
                ids = await self._chat_ids(ChatCompletionRequest.model_validate(body))
            elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
                ids = await self._encode(body["prompt"])
            else:
                raise ApiError(400, "give `prompt` (a string) or `messages`", "invalid_request")
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as e:
            return openai_error(ApiError(400, f"invalid body: {e}", "invalid_request"))
        except ApiError as e:
            return openai_error(e)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": None})

    async def _encode(self, text: str, marked: bool = False) -> list[int]:
        """``ChatTokenizer.encode_full`` (same file, same flags) off the event loop."""
        assert self._encoder is not None and self._pool is not None and self._tok is not None
        enc, tok = self._encoder, self._tok

        def run() -> list[int]:
            if marked:  # client special-token strings in it (router.prompt.specials)
                return tok.encode_full(text, marked)
            return enc.encode_batch([text], add_special_tokens=False)[0].ids

        return await asyncio.get_running_loop().run_in_executor(self._pool, run)

    def abort(self, stream: AsyncIterator[WorkerMessage]) -> None:
        """Close an engine stream its reply left (a client gone mid-stream)."""
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            task = asyncio.get_running_loop().create_task(_quietly(aclose()))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _check_model(self, model: str) -> None:
        if model != self.model and model != self.model_path:
            raise ApiError(404, f"model {model!r} does not exist", "model_not_found", "model")

    async def _serve(self, req: SamplingFields, ids: list[int], chat: bool,
                     parser: tc.ToolParser | None) -> Response:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        assert self._tok is not None
        limit = req.output_limit() or (DEFAULT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS)
        asks = lpx.asks_of(req, ids, self._tok.decode)
        sampling = lpx.with_logprobs(dataclasses.replace(
            sp.params(self._tok, limit, req.temperature, req.top_p, req.stop_list(), req.seed,
                      controls=req),
            constraint=output_constraint(req)),  # a 400 (ApiError) before the engine
            asks.top, asks.prompt)
        self.ongoing += 1
        gen = self._generate(WorkRequest(rid, ids, sampling))
        try:
            first = await anext(gen)
        except Exception as e:  # the engine failed before its first token
            self.ongoing -= 1
            await gen.aclose()
            log.warning("direct request %s failed: %r", rid, e)
            return openai_error(ApiError(503, "generation failed", "replica_failed"))
        if isinstance(first, Rejected):
            self.ongoing -= 1
            await gen.aclose()
            return openai_error(ApiError(first.status, first.message, "engine_rejected"))
        headers = {"x-kvroute-replica": first.replica, "x-request-id": rid}
        ids_back = req.stream and not chat and getattr(req, "return_token_ids", False)
        run = _EngineStream(gen, first, self, [] if ids_back else None)
        enc = (_WithIds(rid, req.model, run.ids) if run.ids is not None
               else oa.ChunkEncoder(rid, req.model, chat) if req.stream else None)
        include = bool(req.stream_options and req.stream_options.include_usage)
        # the router's own reply and accumulator, with no reasoning parser (the router's
        # baseline: what a replica's plain OpenAI server returns)
        stream: Any = run
        notes = None
        if asks.any:  # logprobs, echo (``router.api.openai.logprobs``)
            stream = tap = lpx.LogprobTap(run)
            notes = lpx.Notes(tap, asks, chat)
        reply = ChatReply(stream, oa.ChatOutput(enc, notes=notes), parser, None, rid, req.model,
                          chat, include)
        if req.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream",
                                     headers=headers)
        try:
            body = await reply.collect()
        except ApiError as e:  # the engine failed mid-generation
            return openai_error(e)
        finally:
            await gen.aclose()
        return JSONResponse(body, headers=headers)


class _EngineStream:
    """One engine generation as ``ChatReply`` reads a router ``Generation``: its messages
    (the engine's token ids collected when asked), its final message and its close."""

    def __init__(self, stream: AsyncIterator[WorkerMessage], first: WorkerMessage,
                 owner: DirectHttp, ids: list[int] | None) -> None:
        self.stream, self.first, self.replica, self._owner = stream, first, first.replica, owner
        self.final: Final | None = None
        self.ids = ids  # a list: the engine's token ids are collected
        self._closed = False

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        try:
            msg: WorkerMessage | None = self.first
            while msg is not None:
                if isinstance(msg, Final):
                    self.final = msg
                elif self.ids is not None and isinstance(msg, Chunk):
                    self.ids.extend(msg.token_ids)
                yield msg
                msg = None if self.final else await anext(self.stream, None)
        finally:
            await self.stream.aclose()  # also on a failure: aborts the generation

    def close(self) -> None:
        """The reply is over; a generation left unfinished (the client went) is aborted."""
        if self._closed:
            return
        self._closed = True
        self._owner.ongoing -= 1
        if self.final is None:
            self._owner.abort(self.stream)


class _WithIds(oa.ChunkEncoder):
    """vLLM's ``return_token_ids``: each completion chunk carries the engine's ids since the
    last one (Dynamo's worker shim passes them on instead of re-encoding the text)."""

    def __init__(self, rid: str, model: str, ids: list[int]) -> None:
        super().__init__(rid, model, chat=False)
        self.ids = ids  # filled by ``_EngineStream.messages``

    def text(self, text: str) -> bytes:
        return self.delta({"text": text})

    def delta(self, delta: dict[str, Any], reason: str | None = None,
              logprobs: dict[str, Any] | None = None) -> bytes:
        chunk = oa.text_chunk(self.rid, self.model, delta.get("text", ""), reason, self.created,
                              logprobs=logprobs)
        chunk["choices"][0]["token_ids"] = list(self.ids)
        self.ids.clear()
        return oa.sse(chunk)


async def _quietly(closing: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):  # a stream already closing, or its own failure
        await closing


async def _parse(request: Request, schema: type[M]) -> M:
    body = await request.body()
    try:
        return schema.model_validate(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ApiError(400, f"body is not valid JSON: {e}", "invalid_json") from None
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(400, f"{param}: {first.get('msg')}", "invalid_request", param) from None
