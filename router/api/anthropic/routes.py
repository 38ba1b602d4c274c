"""The Anthropic Messages endpoints: POST /v1/messages and /v1/messages/count_tokens.

One request runs the shared flow (``router.api.common.flow``) with ``MessagesSpec``: parse
(``router.api.anthropic.schema``) → normalise into the chat template's input
(``router.api.anthropic.normalize``) → render and tokenize once → check the context →
``RouterCore.generate`` → parse tool calls from the output (``router.output.tool_calls``) →
reply as a message or as SSE (``MessageReply`` over ``router.api.anthropic.encode.Blocks``).

Choices (see docs/api.md):

- ``max_tokens`` is required, as in Anthropic's API. It is an upper bound: when
  prompt + ``max_tokens`` overflow the model's context it is cut down to fit
  (Claude Code asks for 32000 on every turn), and a reply that hits the cut
  stops with ``model_context_window_exceeded``. A prompt that alone fills the
  context is a 400 ``prompt is too long: N tokens > M maximum``, before any worker.
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

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from router.api.anthropic import encode as aa
from router.api.anthropic.normalize import to_chat
from router.api.anthropic.schema import CountTokensRequest, MessagesRequest
from router.api.common import request as rq
from router.api.common.flow import SessionHint, Spec, Turn, prepare, serve
from router.api.common.reply import Reply
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt
from router.routing.target import Target
from workers.protocol import SamplingParams

DEFAULT_TEMPERATURE = 1.0


class MessagesSpec(Spec[MessagesRequest, None]):
    """/v1/messages over the shared flow (``router.api.common.flow``)."""

    schema = MessagesRequest
    id_prefix = "msg"

    def too_long(self, overflow: rq.Overflow) -> ApiError:
        at_least = "at least " if overflow.at_least else ""  # counted from its text
        return ApiError(400, f"prompt is too long: {at_least}{overflow.tokens} tokens > "
                        f"{overflow.window - 1} maximum", "context_length_exceeded", "messages")

    def normalize(self, req: CountTokensRequest, target: Target, kept: None) -> ChatPrompt:
        return to_chat(req, target.tokenizer.system_in_place, target.max_prompt_chars)

    def output_limit(self, req: MessagesRequest) -> int | None:
        return req.max_tokens

    def sampling(self, req: MessagesRequest, max_tokens: int) -> SamplingParams:
        temperature = DEFAULT_TEMPERATURE if req.temperature is None else req.temperature
        return rq.sampling(max_tokens, temperature, req.top_p, tuple(req.stop_sequences or ()),
                           None)

    def session_hint(self, req: MessagesRequest) -> SessionHint:
        return SessionHint(user_id=req.metadata.user_id if req.metadata else None)

    def has_tools(self, req: MessagesRequest) -> bool:
        return bool(req.tools)

    def streams(self, req: MessagesRequest) -> bool:
        return req.stream

    def reply(self, turn: Turn[MessagesRequest, None]) -> Reply:
        p = turn.p
        parser = None  # tool_choice none: the tools are rendered, calls come back as text
        if p.req.tools and not (p.req.tool_choice and p.req.tool_choice.type == "none"):
            parser = tc.parser_for(p.target.model, p.prompt.tools if p.prompt else None)
        return MessageReply(turn.gen, p.req, parser, self.reasoner(p), turn.bound)

    def headers(self, turn: Turn[MessagesRequest, None]) -> dict[str, str]:
        return {"request-id": turn.rid}


class CountSpec(MessagesSpec):
    schema = CountTokensRequest  # type: ignore[assignment]


MESSAGES, COUNT = MessagesSpec(), CountSpec()


async def messages(core: RouterCore, request: Request) -> Response:
    return await serve(core, request, MESSAGES)


async def count_tokens(core: RouterCore, request: Request) -> Response:
    """The prompt's length as ``/v1/messages`` would send it: bounded and checked against
    the window as ``/v1/messages`` is, and charged like any request (one request at
    admission, then its prompt's tokens: counting costs the tokenizer what serving does)."""
    prepared = await prepare(core, request, COUNT)
    rq.output_budget(prepared.target, len(prepared.ids), None, COUNT.too_long)
    if prepared.key is not None:
        await core.limiter.admit(prepared.key, len(prepared.ids), request=False)
    return JSONResponse({"input_tokens": len(prepared.ids)})


class MessageReply(Reply):
    """One generation turned into an Anthropic message, whole or streamed."""

    def __init__(self, gen: Generation, req: MessagesRequest, parser: tc.ToolParser | None,
                 reasoner: rp.ReasoningParser | None, context_bound: bool) -> None:
        single = bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use)
        self.blocks = aa.Blocks(single_tool=single)
        self.mid = aa.new_id("msg_")
        super().__init__(gen, self.blocks, parser, reasoner, self.mid)
        self.model, self.bound = req.model, context_bound

    def _end(self) -> tuple[str, str | None, dict[str, int]]:
        reason, seq = aa.stop_reason(self.gen.final, self.blocks.tool_calls > 0, self.bound)
        return reason, seq, aa.usage(self.gen.final, self.gen.prompt_tokens)

    def start(self) -> bytes:
        return aa.message_start(self.mid, self.model, self.gen.prompt_tokens) + aa.ping()

    def finish(self) -> bytes:
        closing = self.blocks.finish()
        reason, seq, use = self._end()
        return closing + aa.message_delta(reason, seq, use) + aa.message_stop()

    def failed(self, message: str) -> bytes:
        return aa.error_event("api_error", message)

    def body(self) -> dict[str, Any]:
        self.blocks.finish()
        reason, seq, use = self._end()
        return aa.message(self.mid, self.model, self.blocks.content, reason, seq, use)
