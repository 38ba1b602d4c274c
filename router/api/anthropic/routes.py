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
- ``temperature``, ``top_p`` and ``top_k`` are honoured; unset, they are the model's
  (its ``generation_config.json``, else 1.0 and off), as vLLM serves them. ``thinking``
  (and ``output_config.effort``) go to thinking templates
  (``router.output.reasoning_parsers.controls``); the model's reasoning comes back as
  ``thinking`` blocks (``router.output.reasoning_parsers``).
- ``tool_choice``: ``auto`` (the default), ``any`` and ``tool`` render the
  tools and parse calls; ``any`` and ``tool`` are enforced, the call decoded under a
  grammar of the tools' schemas in the model's own markup (``router.api.common.structured``;
  a ``name`` not among the tools is a 400); ``none`` still renders the tools (the
  prompt, and so the cache, is the same as with ``auto``) but tool calls are not parsed:
  any call markup the model writes comes back as text. ``disable_parallel_tool_use``
  keeps the first call.
- Session: ``router.api.common.identity.session_key`` (``x-session-id``, Claude Code's session
  header, ..., ``metadata.user_id``).
- A client that disconnects closes the generation, which aborts it on the worker.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from router.api.anthropic import encode as aa
from router.api.anthropic import safeguards as sg
from router.api.anthropic.normalize import to_chat
from router.api.anthropic.schema import CountTokensRequest, MessagesRequest
from router.api.common import request as rq
from router.api.common import sampling as sp
from router.api.common import structured as st
from router.api.common.flow import Prepared, SessionHint, Spec, Turn, prepare, serve
from router.api.common.reply import Reply
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt
from router.routing.target import Target
from workers.protocol import Constraint, SamplingParams


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

    def sampling(self, req: MessagesRequest, max_tokens: int, target: Target) -> SamplingParams:
        return sp.params(target.tokenizer, max_tokens, req.temperature, req.top_p,
                         tuple(req.stop_sequences or ()), top_k=req.top_k)

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
        reply = MessageReply(turn.gen, p.req, parser, self.reasoner(p), turn.bound)
        if sg.requested(p.req) and turn.core is not None:
            reply.checks = Checks(turn.core, p.req, p.target.label, p.key)
        return reply

    def headers(self, turn: Turn[MessagesRequest, None]) -> dict[str, str]:
        return {"request-id": turn.rid}

    def constraint(self, p: Prepared[MessagesRequest, None]) -> Constraint | None:
        req, choice, forced = p.req, p.req.tool_choice, None
        if choice is not None and choice.type in ("any", "tool"):
            if choice.type == "tool" and not choice.name:
                raise ApiError(400, "tool_choice.name: a tool choice of type tool needs a "
                               "name", "invalid_request_error", "tool_choice.name")
            forced = st.forced_tools(p.target, tc.schemas(p.prompt.tools if p.prompt else None),
                                     choice.name if choice.type == "tool" else None,
                                     not choice.disable_parallel_tool_use, "tool_choice",
                                     p.ids)
        fmt = req.output_config.format if req.output_config else None
        return st.one_of([("tool_choice", forced), ("output_config.format",
                                                     st.json_schema(fmt["schema"]) if fmt
                                                     else None)])


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


class Checks:
    """The safety verdicts a request asked for on its reply's tool calls
    (``router.api.anthropic.safeguards``), settled before the reply's end."""

    def __init__(self, core: RouterCore, req: MessagesRequest, model: str,
                 key: ApiKeyConfig | None = None) -> None:
        self.core, self.req, self.model, self.key = core, req, model, key
        self.results: list[dict[str, Any]] | None = None

    async def settle(self, content: list[dict[str, Any]]) -> None:
        cfg = self.core.config.safeguards
        calls = {b["id"]: {"tool": b["name"], "input": b["input"]} for b in content
                 if b["type"] == "tool_use"}
        if cfg.mode == "model" and calls:
            status = await sg.judge(self.core, cfg, self.req, calls, self.model, self.key)
        else:  # no call: nothing to judge ("available", no verdicts)
            status = sg.fixed(cfg.mode, list(calls))
        self.results = sg.results(status)


class MessageReply(Reply):
    """One generation turned into an Anthropic message, whole or streamed."""

    def __init__(self, gen: Generation, req: MessagesRequest, parser: tc.ToolParser | None,
                 reasoner: rp.ReasoningParser | None, context_bound: bool) -> None:
        single = bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use)
        self.blocks = aa.Blocks(single_tool=single)
        self.mid = aa.new_id("msg_")
        super().__init__(gen, self.blocks, parser, reasoner, self.mid)
        self.model, self.bound = req.model, context_bound
        self.checks: Checks | None = None

    async def settle(self) -> None:
        if self.checks is not None:
            await self.checks.settle(self.blocks.content)

    @property
    def _verdicts(self) -> list[dict[str, Any]] | None:
        return self.checks.results if self.checks is not None else None

    def _end(self) -> tuple[str, str | None, dict[str, int]]:
        reason, seq = aa.stop_reason(self.gen.final, self.blocks.tool_calls > 0, self.bound)
        return reason, seq, aa.usage(self.gen.final, self.gen.prompt_tokens)

    def start(self) -> bytes:
        return aa.message_start(self.mid, self.model, self.gen.prompt_tokens) + aa.ping()

    def finish(self) -> bytes:
        closing = self.blocks.finish()
        reason, seq, use = self._end()
        return closing + aa.message_delta(reason, seq, use, self._verdicts) + aa.message_stop()

    def failed(self, message: str) -> bytes:
        return aa.error_event("api_error", message)

    def body(self) -> dict[str, Any]:
        self.blocks.finish()
        reason, seq, use = self._end()
        return aa.message(self.mid, self.model, self.blocks.content, reason, seq, use,
                          self._verdicts)
