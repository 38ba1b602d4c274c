"""The Anthropic Messages endpoints: POST /v1/messages and /v1/messages/count_tokens.

One request: parse (``router.api.anthropic.schema``) → normalise into the chat
template's input (``router.api.anthropic.normalize``) → render and tokenize once → check the
context → ``RouterCore.generate`` → parse tool calls from the output
(``router.output.tool_calls``) → reply as a message or as SSE (``router.api.anthropic.encode``).

Choices (see docs/api.md):

- ``max_tokens`` is required, as in Anthropic's API. It is an upper bound: when
  prompt + ``max_tokens`` overflow the model's context it is cut down to fit
  (Claude Code asks for 32000 on every turn), and a reply that hits the cut
  stops with ``model_context_window_exceeded``. A prompt that alone fills the
  context is a 413 ``prompt is too long: N tokens > M maximum``, before any worker.
- ``temperature`` defaults to 1.0 (Anthropic's default); ``top_k`` is accepted
  and not applied. ``thinking`` (and ``output_config.effort``) go to thinking
  templates (``router.output.reasoning_parsers.controls``); the model's reasoning comes back
  as ``thinking`` blocks (``router.output.reasoning_parsers``).
- ``tool_choice``: ``auto`` (the default), ``any`` and ``tool`` render the
  tools and parse calls (decoding is not constrained, so ``any``/``tool`` are not
  enforced); ``none`` still renders the tools (the prompt, and so the cache, is
  the same as with ``auto``) but tool calls are not parsed: any call markup the
  model writes comes back as text. ``disable_parallel_tool_use`` keeps the first call.
- Session: ``router.api.common.identity.session_key`` (``x-session-id``, Claude Code's session
  header, ..., ``metadata.user_id``).
- A client that disconnects closes the generation, which aborts it on the worker.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from router.api.anthropic import encode as aa
from router.api.anthropic.normalize import to_chat
from router.api.anthropic.schema import CountTokensRequest, MessagesRequest
from router.api.common import request as hu
from router.api.common.identity import session_key
from router.core import Generation, RouterCore
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc

log = logging.getLogger(__name__)
DEFAULT_TEMPERATURE = 1.0


async def messages(core: RouterCore, request: Request) -> Response:
    key = await hu.admit_caller(core, request)  # 401 / 429 before reading the body
    req = await hu.parse_body(request, MessagesRequest, hu.body_limits(core))
    tok = core.tokenizer(req.model)
    prompt = to_chat(req, tok.system_in_place)
    ids = await hu.encode_prompt(tok, prompt)
    budget, bound = hu.output_budget(core, req.model, len(ids), req.max_tokens, cut_to_fit=True)
    params = hu.sampling(
        budget, DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        req.top_p, tuple(req.stop_sequences or ()), None,
    )
    rid = hu.request_id("msg")
    session = session_key(request.headers, user_id=req.metadata.user_id if req.metadata else None,
                          tenant=key.name if key else None)
    gen = await core.generate(req.model, ids, params, rid, hu.forwarded_headers(request),
                              session, api_key=key, has_tools=bool(req.tools))
    headers = {**hu.routing_headers(core, gen), "request-id": rid}
    reply = _Reply(gen, req, _parser(core, req, prompt.tools), bound)
    reply.reasoner = rp.for_request(core.primary(req.model), tok, ids)
    if req.stream:
        return hu.GenerationStream(reply.stream(), gen, headers)
    return JSONResponse(await reply.collect(), headers=headers)


async def count_tokens(core: RouterCore, request: Request) -> Response:
    await hu.admit_caller(core, request)  # rate-limited like any request (one per call)
    req = await hu.parse_body(request, CountTokensRequest, hu.body_limits(core))
    tok = core.tokenizer(req.model)
    ids = await hu.encode_prompt(tok, to_chat(req, tok.system_in_place))
    return JSONResponse({"input_tokens": len(ids)})


def _parser(core: RouterCore, req: MessagesRequest, tools: list[dict[str, Any]] | None
            ) -> tc.ToolParser | None:
    if not req.tools or (req.tool_choice and req.tool_choice.type == "none"):
        return None
    return tc.parser_for(core.primary(req.model), tools)


class _Reply:
    """One generation turned into an Anthropic message, whole or streamed."""

    def __init__(self, gen: Generation, req: MessagesRequest, parser: tc.ToolParser | None,
                 context_bound: bool) -> None:
        self.gen, self.req, self.parser, self.bound = gen, req, parser, context_bound
        single = bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use)
        self.blocks = aa.Blocks(single_tool=single)
        self.mid = aa.new_id("msg_")
        self.reasoner: rp.ReasoningParser | None = None

    def _end(self) -> tuple[str, str | None, dict[str, int]]:
        reason, seq = aa.stop_reason(self.gen.final, self.blocks.tool_calls > 0, self.bound)
        return reason, seq, aa.usage(self.gen.final, self.gen.prompt_tokens)

    async def collect(self) -> dict:
        try:
            async for ev in rp.events(self.gen.messages(), self.parser, self.reasoner):
                self.blocks.add(ev)
        except Exception as e:  # the replica failed mid-generation: retryable for the client
            log.warning("generation %s failed: %r", self.mid, e)
            raise ApiError(503, f"generation failed on replica {self.gen.replica}",
                           "replica_failed") from None
        finally:
            self.gen.close()
        self.blocks.finish()
        reason, seq, use = self._end()
        return aa.message(self.mid, self.req.model, self.blocks.content, reason, seq, use)

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            yield aa.message_start(self.mid, self.req.model, self.gen.prompt_tokens) + aa.ping()
            async for batch in rp.event_batches(self.gen.messages(), self.parser, self.reasoner):
                if data := b"".join(chunk for ev in batch for chunk in self.blocks.add(ev)):
                    yield data  # one write per worker message
            closing = self.blocks.finish()
            reason, seq, use = self._end()
            yield b"".join([*closing, aa.message_delta(reason, seq, use), aa.message_stop()])
        except Exception as e:  # a replica died mid-stream: an error event ends the stream
            log.warning("stream %s failed: %r", self.mid, e)
            yield aa.error_event("api_error", f"generation failed on replica {self.gen.replica}")
        finally:
            self.gen.close()  # also on client disconnect: aborts the worker's generation
