"""The OpenAI endpoints: /v1/chat/completions, /v1/completions, /v1/models.

Chat requests are normalised like Anthropic ones where it matters for the cache
(``router.api.anthropic.normalize.strip_volatile`` on the leading system message), rendered
with the model's chat template (tools included) and tokenized once. With tools
(and ``tool_choice`` other than ``"none"``) the output is parsed for tool calls
in the model family's format (``router.output.tool_calls``); ``tool_choice`` values
``"required"`` and a named function are accepted but not enforced (decoding is
not constrained), and ``parallel_tool_calls: false`` keeps the first call.
``response_format`` adds an instruction to the system message (see
``router.api.openai.schema``). A thinking model's reasoning is parsed first
(``router.output.reasoning_parsers``) and returned as ``reasoning_content``; the tool-call
parser reads the answer after it; ``reasoning_effort`` goes to the template. A client
that disconnects aborts the generation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from router import telemetry
from router.api.common import request as hu
from router.api.common.identity import session_key
from router.api.openai import encode as oa
from router.api.openai.schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from router.auth.keys import ApiKeyConfig
from router.core import Generation, RouterCore
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt, place_system

log = logging.getLogger(__name__)


def list_models(core: RouterCore) -> dict[str, Any]:
    """Models and groups. ``max_model_len`` (vLLM's and SGLang's field, which agent clients
    read to size their context) is the context window; a group's is its smallest member's,
    since any member may serve it."""
    windows = {name: m.context_window for name, m in core.models.items()}
    windows |= {g.name: min(windows[m.model] for m in g.models) for g in core.config.groups}
    data = [{"id": name, "object": "model", "owned_by": "kvroute", "created": 0,
             "max_model_len": window} for name, window in windows.items()]
    return {"object": "list", "data": data}


async def chat_completions(core: RouterCore, request: Request) -> Response:
    key = await hu.admit_caller(core, request)  # 401 / 429 before reading the body
    req = await hu.parse_body(request, ChatCompletionRequest, hu.body_limits(core))
    tok = core.tokenizer(req.model)
    messages = place_system(req.template_messages(), tok.system_in_place)
    ids = await hu.encode_prompt(tok, ChatPrompt(messages, req.template_tools(),
                                                 options=req.template_options()))
    parser = None
    if req.parses_tools():
        parser = tc.parser_for(core.primary(req.model), req.template_tools())
    out = _Output(parser, single_call=req.parallel_tool_calls is False)
    out.reasoner = rp.for_request(core.primary(req.model), tok, ids)
    return await _serve(core, request, req, ids, out, key)


async def completions(core: RouterCore, request: Request) -> Response:
    key = await hu.admit_caller(core, request)  # 401 / 429 before reading the body
    req = await hu.parse_body(request, CompletionRequest, hu.body_limits(core))
    tok = core.tokenizer(req.model)
    if isinstance(req.prompt, str):
        ids = await tok.aencode(req.prompt)
    else:
        ids = list(req.prompt)
        hu.output_budget(core, req.model, len(ids), req.output_limit())  # 413 before the scan
        if any(t < 0 or t >= tok.vocab_size for t in ids):
            raise ApiError(400, f"prompt token ids must lie in [0, {tok.vocab_size})",
                           "invalid_token_ids", "prompt")
    if not ids:
        raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
    return await _serve(core, request, req, ids, None, key)


class _Output:
    """Chat output: reasoning, text and parsed tool calls (``parser`` None: no tool calls;
    ``reasoner`` None: no reasoning)."""

    def __init__(self, parser: tc.ToolParser | None, single_call: bool) -> None:
        self.parser, self.single = parser, single_call
        self.reasoner: rp.ReasoningParser | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[tc.ToolCall] = []

    def add(self, ev: rp.Event) -> dict[str, Any] | None:
        """Record one event; the chat delta to stream for reasoning or a tool call (None:
        text, or nothing to send)."""
        if isinstance(ev, rp.Reasoning):
            self.reasoning.append(ev.text)
            return {"reasoning_content": ev.text}
        if isinstance(ev, str):  # streamed by ChunkEncoder.text
            self.text.append(ev)
            return None
        if self.single and self.calls:
            return None
        self.calls.append(ev)
        telemetry.current().tool_calls += 1  # the turn ends in a tool call (router.routing.leases)
        return {"tool_calls": [oa.tool_call(ev, len(self.calls) - 1)]}


async def _serve(core: RouterCore, request: Request, req: SamplingFields, ids: list[int],
                 out: _Output | None, key: ApiKeyConfig | None) -> Response:
    """Generate and reply; ``out`` None for /v1/completions (plain text)."""
    chat = out is not None
    rid = hu.request_id("chatcmpl" if chat else "cmpl")
    budget, _ = hu.output_budget(core, req.model, len(ids), req.output_limit())
    params = hu.sampling(budget, req.temperature, req.top_p, req.stop_list(), req.seed)
    session = session_key(request.headers, prompt_cache_key=req.prompt_cache_key,
                          tenant=key.name if key else None)
    gen = await core.generate(
        req.model, ids, params, rid, hu.forwarded_headers(request), session, api_key=key,
        has_tools=bool(getattr(req, "tools", None)),
    )
    headers = hu.routing_headers(core, gen)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return hu.GenerationStream(_stream(gen, rid, req.model, out, include_usage), gen, headers)
    result = out or _Output(None, False)
    try:
        async for ev in rp.events(gen.messages(), result.parser, result.reasoner):
            result.add(ev)
    except Exception as e:  # the replica failed mid-generation: retryable for the client
        log.warning("generation %s failed: %r", rid, e)
        raise ApiError(503, f"generation failed on replica {gen.replica}",
                       "replica_failed") from None
    finally:
        gen.close()  # also when the client went away: aborts the worker's generation
    text = "".join(result.text)
    if chat:
        return JSONResponse(oa.chat_completion(rid, req.model, text, gen.final, result.calls,
                                               "".join(result.reasoning)), headers=headers)
    return JSONResponse(oa.text_completion(rid, req.model, text, gen.final), headers=headers)


async def _stream(
    gen: Generation, rid: str, model: str, out: _Output | None, include_usage: bool
) -> AsyncIterator[bytes]:
    """One write per worker message: its events' chunks joined (``ChunkEncoder``)."""
    enc = oa.ChunkEncoder(rid, model, chat=out is not None)
    try:
        if out is not None:
            yield enc.delta({"role": "assistant", "content": ""})
        async for batch in rp.event_batches(gen.messages(), out.parser if out else None,
                                            out.reasoner if out else None):
            # one write per worker message; mostly one event (a token's text): no join
            data = (_encode(enc, out, batch[0]) if len(batch) == 1
                    else b"".join([_encode(enc, out, ev) for ev in batch]))
            if data:
                yield data
        reason = oa.finish_reason(gen.final, bool(out and out.calls))
        end = enc.delta({} if out is not None else {"text": ""}, reason)
        yield end + enc.usage(gen.final) + DONE if include_usage else end + DONE
        return
    except Exception as e:  # a replica died mid-stream: end cleanly with an error chunk
        log.warning("stream %s failed: %r", rid, e)
        yield oa.sse(oa.stream_error(f"generation failed on replica {gen.replica}")) + DONE
    finally:
        gen.close()  # also on client disconnect: aborts the worker's generation


DONE = oa.sse("[DONE]")


def _encode(enc: oa.ChunkEncoder, out: _Output | None, ev: rp.Event) -> bytes:
    """One event's chunk (b"" when it sends nothing: a second call with parallel calls off)."""
    delta = out.add(ev) if out is not None else None
    if isinstance(ev, str):
        return enc.text(ev)
    return enc.delta(delta) if delta is not None else b""
