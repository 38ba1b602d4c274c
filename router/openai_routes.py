"""The OpenAI endpoints: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from router import openai_api as oa
from router.core import Generation, RouterCore
from router.errors import ApiError
from router.http_util import output_budget, parse_body, request_id, routing_headers, sampling
from router.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from router.tokenization import TemplateRenderError

log = logging.getLogger(__name__)


def list_models(core: RouterCore) -> dict[str, Any]:
    data = [{"id": name, "object": "model", "owned_by": "kvroute", "created": 0}
            for name in core.models]
    return {"object": "list", "data": data}


async def chat_completions(core: RouterCore, request: Request) -> Response:
    req = await parse_body(request, ChatCompletionRequest)
    tok = core.tokenizer(req.model)
    try:
        text = tok.render(_messages(req), tools=req.tools)
    except TemplateRenderError as e:
        raise ApiError(400, str(e), "invalid_messages", "messages") from None
    return await _serve(core, request, req, tok.encode(text), chat=True)


async def completions(core: RouterCore, request: Request) -> Response:
    req = await parse_body(request, CompletionRequest)
    tok = core.tokenizer(req.model)
    if isinstance(req.prompt, str):
        ids = tok.encode(req.prompt)
    else:
        ids = list(req.prompt)
        if any(t < 0 or t >= tok.vocab_size for t in ids):
            raise ApiError(400, f"prompt token ids must lie in [0, {tok.vocab_size})",
                           "invalid_token_ids", "prompt")
    if not ids:
        raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
    return await _serve(core, request, req, ids, chat=False)


def _messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                               "content": m.text()}
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
    if isinstance(args, str):  # templates expect a mapping
        with contextlib.suppress(json.JSONDecodeError):
            tc["function"]["arguments"] = json.loads(args)
    return tc


async def _serve(core: RouterCore, request: Request, req: SamplingFields, ids: list[int],
                 chat: bool) -> Response:
    rid = request_id("chatcmpl" if chat else "cmpl")
    budget = output_budget(core, req.model, len(ids), req.output_limit())
    params = sampling(budget, req.temperature, req.top_p, req.stop_list(), req.seed)
    gen = await core.generate(
        req.model, ids, params, rid, request.headers, request.headers.get("x-session-id"),
    )
    headers = routing_headers(gen)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        body = _stream(gen, rid, req.model, chat, include_usage)
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    text = "".join([m.get("text", "") async for m in gen.messages()])
    build = oa.chat_completion if chat else oa.text_completion
    return JSONResponse(build(rid, req.model, text, gen.final), headers=headers)


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
