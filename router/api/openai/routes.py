"""The OpenAI endpoints: /v1/chat/completions and /v1/completions (/v1/models:
``router.api.openai.models``).

Each request runs the shared flow (``router.api.common.flow``) with ``ChatSpec`` or
``CompletionSpec``, and replies through ``ChatReply`` over ``encode.ChatOutput``.

Chat requests are normalised like Anthropic ones where it matters for the cache
(``router.api.anthropic.normalize.strip_volatile`` on the leading system message), rendered
with the model's chat template (tools included) and tokenized once. With tools
(and ``tool_choice`` other than ``"none"``) the output is parsed for tool calls
in the model family's format (``router.output.tool_calls``); ``tool_choice`` values
``"required"`` and a named function are enforced: the call is decoded under a grammar of
the tools' schemas in that format (``router.api.common.structured``), and a name not among
``tools`` is a 400. ``parallel_tool_calls: false`` keeps the first call. ``response_format``
and vLLM's ``structured_outputs`` / ``guided_*`` constrain decoding the same way
(``router.api.openai.structured``). A thinking model's reasoning is parsed first
(``router.output.reasoning_parsers``) and returned as ``reasoning_content``; the tool-call
parser reads the answer after it; ``reasoning_effort`` goes to the template. A client
that disconnects aborts the generation.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from router.api.common import fanout
from router.api.common import request as rq
from router.api.common import sampling as sp
from router.api.common import structured as st
from router.api.common.flow import Prepared, SessionHint, Spec, Turn, serve
from router.api.common.reply import Reply
from router.api.common.wire import with_prefix
from router.api.openai import choices as ch
from router.api.openai import encode as oa
from router.api.openai import logprobs as lpx
from router.api.openai.schema import (
    COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    SamplingFields,
)
from router.api.openai.structured import output_constraint
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt, place_system
from router.routing.target import Target
from workers.protocol import Constraint, SamplingParams


class _Sampled(Spec[Any, None]):
    """What chat and completions share: OpenAI's sampling fields and session hint."""

    def output_limit(self, req: SamplingFields) -> int | None:
        return req.output_limit()

    def sampling(self, req: SamplingFields, max_tokens: int, target: Target) -> SamplingParams:
        return sp.params(target.tokenizer, max_tokens, req.temperature, req.top_p,
                         req.stop_list(), req.seed, controls=req)

    def session_hint(self, req: SamplingFields) -> SessionHint:
        return SessionHint(prompt_cache_key=req.prompt_cache_key)

    def constraint(self, p: Prepared[Any, None]) -> Constraint | None:
        return output_constraint(p.req)

    def streams(self, req: SamplingFields) -> bool:
        return req.stream

    async def serve(self, core: RouterCore, request: Request, key: ApiKeyConfig | None,
                    req: SamplingFields) -> Response:
        """``n`` copies of each prompt (a batched completion: each of its prompts) as
        one reply (``router.api.common.fanout``); one generation the common way."""
        ch.check_choices(req)
        reqs = ch.one_per_prompt(req) if isinstance(req, CompletionRequest) else [req]
        n = req.copies()
        if n == 1 and len(reqs) == 1:
            return await super().serve(core, request, key, reqs[0])
        return await fanout.serve_many(core, request, self, key, reqs, n, self._join)

    def _join(self, turns: list[Turn[Any, None]], replies: list[Reply]) -> ch.ChoicesJoiner:
        first = replies[0]
        assert isinstance(first, ChatReply)
        return ch.ChoicesJoiner(turns, first.out.enc, turns[0].p.req.copies(),
                                first.include_usage)

    def reply(self, turn: Turn[Any, None]) -> Reply:
        req, chat = turn.p.req, turn.p.prompt is not None
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        oid = with_prefix(f"{self.id_prefix}-", turn.rid)  # chatcmpl-… / cmpl-…
        fp = oa.system_fingerprint(turn.p.target.model.name,
                                   turn.p.target.tokenizer.vocab_fingerprint)
        asks, gen = self.asks(turn.p), turn.gen
        live = (lambda: (gen.prompt_tokens, len(gen.sent))) \
            if include_usage and opts.continuous_usage_stats else None
        enc = ch.ChoiceEncoder(oid, req.model, chat, fp, turn.index, live) \
            if req.stream else None
        notes = None
        if asks.any:
            gen = tap = lpx.LogprobTap(turn.gen)
            notes = lpx.Notes(tap, asks, chat)
        out = oa.ChatOutput(enc, getattr(req, "parallel_tool_calls", None) is False, notes)
        return ChatReply(gen, out, self.tool_parser(turn.p), self.reasoner(turn.p),
                         oid, req.model, chat, include_usage, fp, turn.index, turn.choices > 1)

    def tool_parser(self, p: Prepared[Any, None]) -> tc.ToolParser | None:
        return None

    def asks(self, p: Prepared[Any, None]) -> lpx.Asks:
        """What the request asks of logprobs and echo (``router.api.openai.logprobs``)."""
        return lpx.asks_of(p.req, p.ids, p.target.tokenizer.decode)


class ChatSpec(_Sampled):
    """/v1/chat/completions: tools parsed unless ``tool_choice`` is ``"none"``."""

    schema = ChatCompletionRequest
    id_prefix = "chatcmpl"

    def normalize(self, req: ChatCompletionRequest, target: Target, kept: None) -> ChatPrompt:
        messages = place_system(req.template_messages(), target.tokenizer.system_in_place)
        return ChatPrompt(messages, req.template_tools(), options=req.template_options())

    def has_tools(self, req: ChatCompletionRequest) -> bool:
        return bool(req.tools)

    def constraint(self, p: Prepared[ChatCompletionRequest, None]) -> Constraint | None:
        req, forced = p.req, None
        choice = req.tool_choice
        if choice == "required" or isinstance(choice, NamedToolChoice):
            name = choice.function.name if isinstance(choice, NamedToolChoice) else None
            forced = st.forced_tools(p.target, tc.schemas(req.template_tools()), name,
                                     req.parallel_tool_calls is not False, "tool_choice",
                                     p.ids)
        return st.one_of([("tool_choice", forced), ("response_format", output_constraint(req))])

    def sampling(self, req: ChatCompletionRequest, max_tokens: int, target: Target
                 ) -> SamplingParams:
        asks = lpx.chat_asks(req)
        return lpx.with_logprobs(super().sampling(req, max_tokens, target), asks.top, asks.prompt)

    def tool_parser(self, p: Prepared[ChatCompletionRequest, None]) -> tc.ToolParser | None:
        if not p.req.parses_tools() or p.prompt is None:
            return None
        return tc.parser_for(p.target.model, p.prompt.tools)


class CompletionSpec(_Sampled):
    """/v1/completions: a string prompt (tokenized as it is) or token ids; no template."""

    schema = CompletionRequest
    id_prefix = "cmpl"
    prompt_param = "prompt"

    def output_limit(self, req: CompletionRequest) -> int | None:
        """Unset: 16 tokens, as OpenAI's and vLLM's completions (chat: the model's
        ``default_max_tokens``)."""
        return req.output_limit() or COMPLETION_MAX_TOKENS

    async def encode(self, req: CompletionRequest, target: Target, kept: None
                     ) -> tuple[ChatPrompt | None, list[int]]:
        tok = target.tokenizer
        if isinstance(req.prompt, str):
            rq.check_text_fits(target, len(req.prompt), self.too_long)
            ids = await tok.aencode(req.prompt, target.tenant)
        else:
            ids = list(req.prompt)
            rq.output_budget(target, len(ids), None, self.too_long)  # 400 before the scan
            if any(t < 0 or t >= tok.vocab_size for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {tok.vocab_size})",
                               "invalid_token_ids", "prompt")
        if not ids:
            raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
        return None, ids

    def sampling(self, req: CompletionRequest, max_tokens: int, target: Target
                 ) -> SamplingParams:
        asks = lpx.completion_asks(req, "", "")
        return lpx.with_logprobs(super().sampling(req, max_tokens, target), asks.top, asks.prompt)


CHAT, COMPLETION = ChatSpec(), CompletionSpec()


async def chat_completions(core: RouterCore, request: Request) -> Response:
    return await serve(core, request, CHAT)


async def completions(core: RouterCore, request: Request) -> Response:
    return await serve(core, request, COMPLETION)


class ChatReply(Reply):
    """A chat completion (or a text completion, ``chat`` False), whole or as chunks."""

    def __init__(self, gen: Generation, out: oa.ChatOutput, parser: tc.ToolParser | None,
                 reasoner: rp.ReasoningParser | None, rid: str, model: str, chat: bool,
                 include_usage: bool, fingerprint: str | None = None, index: int = 0,
                 part: bool = False) -> None:
        super().__init__(gen, out, parser, reasoner, rid)
        self.out, self.model, self.chat, self.include_usage = out, model, chat, include_usage
        self.fingerprint = fingerprint
        self.index, self.part = index, part  # part: one choice of several (the end: ChoicesJoiner)

    def start(self) -> bytes:
        assert self.out.enc is not None
        return self.out.enc.delta({"role": "assistant", "content": ""}) if self.chat else b""

    def finish(self) -> bytes:
        enc, final, notes = self.out.enc, self.gen.final, self.out.notes
        assert enc is not None
        reason = oa.finish_reason(final, bool(self.out.calls))
        text, logprobs = notes.piece("") if notes is not None else ("", None)  # what is left
        end = enc.delta({} if self.chat else {"text": text}, reason, logprobs)
        if self.part:
            return end
        return end + enc.usage(final) + oa.DONE if self.include_usage else end + oa.DONE

    def failed(self, message: str) -> bytes:
        return oa.sse(oa.stream_error(message)) + (b"" if self.part else oa.DONE)

    def body(self) -> dict[str, Any]:
        text, final, notes = "".join(self.out.text), self.gen.final, self.out.notes
        text, logprobs = notes.whole(text) if notes is not None else (text, None)
        prompt = notes.prompt_logprobs() if notes is not None else None
        if self.chat:
            out = oa.chat_completion(self.label, self.model, text, final, self.out.calls,
                                     "".join(self.out.reasoning), self.fingerprint, logprobs,
                                     prompt)
        else:
            out = oa.text_completion(self.label, self.model, text, final, self.fingerprint,
                                     logprobs, prompt)
        out["choices"][0]["index"] = self.index
        return out
