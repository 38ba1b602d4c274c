"""The OpenAI Responses endpoint: POST /v1/responses (what Codex speaks).

One request runs the shared flow (``router.api.common.flow``) with ``ResponsesSpec``:
parse (``router.api.responses.schema``) → the stored conversation of
``previous_response_id``, if any (the spec's ``recall``; 404 when unknown or expired) →
normalise into the chat template's input (``router.api.responses.normalize``) → render and
tokenize once → ``RouterCore.generate`` → parse tool calls → reply as a response object or
as SSE events (``ResponseReply`` over ``router.api.responses.encode.Output``) → with
``store`` (OpenAI's default), keep the conversation for ``previous_response_id``
(``ResponseReply.done``, ``router.api.responses.store``).

``store: false`` (what Codex sends, with the whole conversation every turn) keeps
nothing. ``max_output_tokens`` is cut to fit the context window like chat's
``max_tokens`` (``x-kvroute-max-tokens-cut``; a 400 when the input alone cannot fit).
``reasoning.effort`` goes to thinking templates and the model's reasoning comes back as
``reasoning`` items (``router.output.reasoning_parsers``); ``reasoning.summary``,
``text.verbosity`` and ``service_tier`` are accepted and have no effect; ``include:
["message.output_text.logprobs"]`` (with ``top_logprobs``) returns the output text's logprobs
(``router.api.openai.logprobs``), other ``include`` values have no effect. A
client that disconnects closes the generation, which aborts it on the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from router.api.common import request as rq
from router.api.common import sampling as sp
from router.api.common import structured as st
from router.api.common.flow import Prepared, SessionHint, Spec, Turn, serve
from router.api.common.reply import Reply
from router.api.common.sampling import stop_tuple
from router.api.openai.logprobs import LogprobTap, with_logprobs
from router.api.responses.encode import Output, new_id, status, usage
from router.api.responses.normalize import Conversation, to_chat, without_unrendered_reasoning
from router.api.responses.schema import NamedTool, ResponsesRequest
from router.api.responses.store import ResponseStore, StoredResponse
from router.api.responses.tools import ToolCatalog
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError, clip
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt
from router.routing.target import Target
from workers.protocol import Constraint, SamplingParams


@dataclass(slots=True)
class Kept:
    """What one request carries from the store to its reply: the stored conversation it
    continues, then (normalised) the conversation to store and the tools as offered."""

    history: Conversation
    owner: str | None = None  # the key's name: only it may continue what this stores
    conversation: Conversation = field(default_factory=Conversation)
    catalog: ToolCatalog = field(default_factory=ToolCatalog)


class ResponsesSpec(Spec[ResponsesRequest, Kept]):
    """/v1/responses over the shared flow, with the store as its recall and its keep."""

    schema = ResponsesRequest
    id_prefix = "resp"
    prompt_param = "input"

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def recall(self, req: ResponsesRequest, key: ApiKeyConfig | None) -> Kept:
        owner = key.name if key is not None else None
        return Kept(await _history(self.store, req, owner), owner)

    def normalize(self, req: ResponsesRequest, target: Target, kept: Kept) -> ChatPrompt:
        # a stored conversation may be as large as one body could carry (its reasoning
        # included, which the text check before rendering does not count)
        prompt, kept.conversation, kept.catalog = to_chat(
            req, kept.history, target.tokenizer.system_in_place,
            target.max_prompt_chars + rq.WINDOW_SLACK_BYTES)
        return prompt

    def output_limit(self, req: ResponsesRequest) -> int | None:
        return req.max_output_tokens

    def sampling(self, req: ResponsesRequest, max_tokens: int, target: Target) -> SamplingParams:
        return with_logprobs(sp.params(target.tokenizer, max_tokens, req.temperature, req.top_p,
                                       stop_tuple(req.stop), req.seed, controls=req),
                             req.output_logprobs(), None)

    def session_hint(self, req: ResponsesRequest) -> SessionHint:
        return SessionHint(prompt_cache_key=req.prompt_cache_key)

    def has_tools(self, req: ResponsesRequest) -> bool:
        return bool(req.tools)

    def constraint(self, p: Prepared[ResponsesRequest, Kept]) -> Constraint | None:
        """``text.format`` and a forced ``tool_choice`` (``router.api.common.structured``)."""
        req, forced = p.req, None
        if req.tool_choice == "required" or isinstance(req.tool_choice, NamedTool):
            name = req.tool_choice.name if isinstance(req.tool_choice, NamedTool) else None
            forced = st.forced_tools(p.target, tc.schemas(p.prompt.tools if p.prompt else None),
                                     name, req.parallel_tool_calls is not False, "tool_choice",
                                     p.ids)
        fmt = req.text.format if req.text else None
        return st.one_of([("tool_choice", forced), ("text.format", fmt.as_response_format()
                                                     .constraint() if fmt else None)])

    def streams(self, req: ResponsesRequest) -> bool:
        return req.stream

    def reply(self, turn: Turn[ResponsesRequest, Kept]) -> Reply:
        p, kept = turn.p, turn.p.kept
        parser = None
        if kept.catalog.refs and p.req.tool_choice != "none":
            parser = tc.parser_for(p.target.model, p.prompt.tools if p.prompt else None)
        gen = turn.gen
        if p.req.output_logprobs() is not None:
            gen = LogprobTap(turn.gen)  # type: ignore[assignment]
        out = Output(p.req, new_id("resp"), kept.catalog,
                     single_call=p.req.parallel_tool_calls is False,
                     logprobs=gen if isinstance(gen, LogprobTap) else None)
        return ResponseReply(gen, out, parser, self.reasoner(p),
                             self.store if p.req.store else None, kept.conversation,
                             kept.owner, p.target.tokenizer.past_reasoning)


async def create(core: RouterCore, store: ResponseStore, request: Request) -> Response:
    return await serve(core, request, ResponsesSpec(store))


async def _history(store: ResponseStore, req: ResponsesRequest, owner: str | None
                   ) -> Conversation:
    """The stored conversation ``req`` continues; another key's is not found, word for word
    as an unknown id is."""
    if req.previous_response_id is None:
        return Conversation()
    stored = await store.get(req.previous_response_id, owner)
    if stored is None:
        raise ApiError(404, f"previous response {clip(req.previous_response_id)!r} not found "
                       "(unknown or expired, or created with store: false)",
                       "response_not_found", "previous_response_id")
    return Conversation(stored.messages, stored.listed_tools, stored.loaded_tools,
                        stored.raw_bytes)


class ResponseReply(Reply):
    """One generation turned into a response, whole or streamed, then stored."""

    def __init__(self, gen: Generation, out: Output, parser: tc.ToolParser | None,
                 reasoner: rp.ReasoningParser | None, store: ResponseStore | None,
                 conversation: Conversation, owner: str | None = None,
                 past_reasoning: str = "all") -> None:
        super().__init__(gen, out, parser, reasoner, out.id)
        self.out, self.store, self.conversation = out, store, conversation
        self.owner, self.past_reasoning = owner, past_reasoning

    def start(self) -> bytes:
        return self.out.start()

    def finish(self) -> bytes:
        return self.out.finish(self.gen.final, self.gen.prompt_tokens)

    def failed(self, message: str) -> bytes:
        return self.out.failed(message)

    def body(self) -> dict[str, Any]:
        final = self.gen.final
        return self.out.response(status(final), usage(final, self.gen.prompt_tokens))

    async def done(self) -> None:
        """Keep the conversation for ``previous_response_id`` (``store``, OpenAI's default),
        less the past reasoning the template will never render (``past_reasoning``): what
        is stored is rendered, so tokenized and charged, by the turn that continues it."""
        if self.store is None:
            return
        conv, tail = self.conversation, self.out.conversation_tail()
        messages = without_unrendered_reasoning([*conv.messages, *([tail] if tail else [])],
                                                self.past_reasoning)
        await self.store.put(self.out.id, StoredResponse(self.out.req.model, messages,
                                                         conv.listed, conv.loaded, self.owner))
