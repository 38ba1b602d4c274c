"""The router ingress: a FastAPI app as a Serve deployment.

parse + validate → template + tokenize (once) → ``RouterCore`` (index lookup,
pipeline, dispatch) → stream back. Errors use the OpenAI error shape.

No ``from __future__ import annotations`` here: FastAPI must see real types on
the route methods that Serve's ingress wrapper re-binds.
"""

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from deploy.config import KvrouteConfig
from router import openai_api as oa
from router.core import Generation, RouterCore
from router.errors import ApiError, openai_error
from router.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from router.tokenization import TemplateRenderError

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 32 << 20

app = FastAPI(title="kvroute", docs_url=None, redoc_url=None)


@app.exception_handler(ApiError)
async def _api_error(_: Request, err: ApiError) -> JSONResponse:
    return openai_error(err)


@app.exception_handler(Exception)
async def _unexpected(_: Request, err: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=err)
    return openai_error(ApiError(500, "internal error in the router", "internal_error"))


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    return openai_error(ApiError(400, f"invalid request: {err.errors()[:3]}"))


async def _parse(request: Request, schema: type[BaseModel]) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", "body_too_large")
    try:
        return schema.model_validate(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ApiError(400, f"body is not valid JSON: {e}", "invalid_json") from None
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(400, f"{param}: {first.get('msg')}", "invalid_request", param) from None


def _messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        msg["content"] = m.text()
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [_tool_call(tc.model_dump()) for tc in m.tool_calls]
        out.append(msg)
    return out


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    args = tc["function"]["arguments"]
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):
            tc["function"]["arguments"] = json.loads(args)
    return tc


async def _stream(
    gen: Generation, rid: str, model: str, chat: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    if chat:
        yield oa.sse(oa.chat_chunk(rid, model, {"role": "assistant", "content": ""}, None))
    try:
        async for msg in gen.messages():
            if text := msg.get("text"):
                yield oa.sse(oa.chat_chunk(rid, model, {"content": text}, None) if chat
                             else oa.text_chunk(rid, model, text, None))
        reason = oa.finish_reason(gen.final)
        yield oa.sse(oa.chat_chunk(rid, model, {}, reason) if chat
                     else oa.text_chunk(rid, model, "", reason))
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield oa.sse(oa.usage_chunk(rid, model, obj, gen.final))
    except Exception as e:  # a replica died mid-stream: end cleanly with an error chunk
        log.warning("stream %s failed: %r", rid, e)
        yield oa.sse(oa.stream_error(f"generation failed on replica {gen.replica}"))
    yield oa.sse("[DONE]")


def _request_id(chat: bool) -> str:
    """Serve's request id, so the body id, logs and the x-request-id header agree."""
    rid = serve.context._get_serve_request_context().request_id  # noqa: SLF001
    return rid or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


# Serve pickles the ingress class when it is decorated: everything it uses
# must be defined above this line.
@serve.ingress(app)
class Ingress:
    async def __init__(self, config: dict[str, Any], handles: dict[str, DeploymentHandle]) -> None:
        self._config = KvrouteConfig.model_validate(config)
        self._core = RouterCore(self._config, handles)
        self._maintainer = asyncio.get_running_loop().create_task(self._maintain())

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._core.maintain()
            except Exception:  # never let housekeeping die
                log.exception("router maintenance failed")

    @app.get("/health")
    async def health(self) -> Response:
        ready = self._core.ready()
        ok = all(n > 0 for n in ready.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "replicas": ready},
                            status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        data = [{"id": m.name, "object": "model", "owned_by": "kvroute", "created": 0}
                for m in self._config.models]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        req: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
        tok = self._tokenizer(req.model)
        try:
            text = tok.render(_messages(req), tools=req.tools)
        except TemplateRenderError as e:
            raise ApiError(400, str(e), "invalid_messages") from None
        return await self._serve(request, req, tok.encode(text), chat=True)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        req: CompletionRequest = await _parse(request, CompletionRequest)
        tok = self._tokenizer(req.model)
        if isinstance(req.prompt, str):
            ids = tok.encode(req.prompt)
        else:
            ids = list(req.prompt)
            if any(t < 0 or t >= tok.vocab_size for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {tok.vocab_size})",
                               "invalid_token_ids", "prompt")
        if not ids:
            raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
        return await self._serve(request, req, ids, chat=False)

    def _tokenizer(self, model: str) -> Any:
        if model not in self._core.models:
            raise ApiError(404, f"model {model!r} does not exist", "model_not_found", "model")
        return self._core.tokenizers[model]

    def _sampling(self, req: SamplingFields, prompt_len: int) -> dict[str, Any]:
        cfg = self._core.models[req.model]
        room = cfg.context_window - prompt_len
        limit = req.output_limit()
        if room <= 0 or (limit is not None and limit > room):
            raise ApiError(413, f"prompt ({prompt_len} tokens) plus max_tokens ({limit}) exceed "
                           f"the context window of {req.model} ({cfg.context_window})",
                           "context_length_exceeded", "messages")
        return {
            "max_tokens": limit or min(cfg.default_max_tokens, room),
            "temperature": 0.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "stop": req.stop_list(), "seed": req.seed,
        }

    async def _serve(self, request: Request, req: SamplingFields, ids: list[int],
                     chat: bool) -> Response:
        rid = _request_id(chat)
        sampling = self._sampling(req, len(ids))
        gen = await self._core.generate(
            req.model, ids, sampling, rid, request.headers, request.headers.get("x-session-id"),
        )
        headers = {
            "x-kvroute-model": gen.model, "x-kvroute-replica": gen.replica,
            "x-kvroute-predicted-cached-tokens": str(gen.predicted_cached_tokens),
        }  # Serve itself echoes x-request-id (the client's, or its own)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = _stream(gen, rid, req.model, chat, include_usage)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        text = "".join([m.get("text", "") async for m in gen.messages()])
        build = oa.chat_completion if chat else oa.text_completion
        return JSONResponse(build(rid, req.model, text, gen.final), headers=headers)
