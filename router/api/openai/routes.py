"""The OpenAI endpoints: /v1/chat/completions and /v1/completions (/v1/models:
``router.api.openai.models``).

Each request runs the shared flow (``router.api.common.flow``) with ``ChatSpec`` or
``CompletionSpec``, and replies through ``ChatReply`` over ``encode.ChatOutput``.

Chat requests are normalised like Anthropic ones where it matters for the cache
(``router.api.anthropic.normalize.strip_volatile`` on the leading system message), rendered
with the model's chat template (tools included) and tokenized once. With tools
(and ``tool_choice`` other than ``"none"``) the output is parsed for tool calls
in the model family's format (``router.output.tool_calls``); ``tool_choice`` values
``"required"`` and a named function are accepted but not enforced (decoding is
not constrained), and ``parallel_tool_calls: false`` keeps the first call.
``response_format`` adds an instruction to the system message (see
``router.api.openai.schema``; a strict schema is not enforced and its reply says so in a
header). A thinking model's reasoning is parsed first
(``router.output.reasoning_parsers``) and returned as ``reasoning_content``; the tool-call
parser reads the answer after it; ``reasoning_effort`` goes to the template. A client
that disconnects aborts the generation.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from router.api.common import request as rq
from router.api.common.flow import Prepared, SessionHint, Spec, Turn, serve
from router.api.common.reply import Reply
from router.api.common.wire import with_prefix
from router.api.openai import encode as oa
from router.api.openai.schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from router.prompt.template import ChatPrompt, place_system
from router.routing.target import Target
from workers.protocol import SamplingParams


class _Sampled(Spec[Any, None]):
    """What chat and completions share: OpenAI's sampling fields and session hint."""

    def output_limit(self, req: SamplingFields) -> int | None:
        return req.output_limit()

    def sampling(self, req: SamplingFields, max_tokens: int) -> SamplingParams:
        return rq.sampling(max_tokens, req.temperature, req.top_p, req.stop_list(), req.seed)

    def session_hint(self, req: SamplingFields) -> SessionHint:
        return SessionHint(prompt_cache_key=req.prompt_cache_key)

    def streams(self, req: SamplingFields) -> bool:
        return req.stream

    def reply(self, turn: Turn[Any, None]) -> Reply:
        req, chat = turn.p.req, turn.p.prompt is not None
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        oid = with_prefix(f"{self.id_prefix}-", turn.rid)  # chatcmpl-… / cmpl-…
        fp = oa.system_fingerprint(turn.p.target.model.name,
                                   turn.p.target.tokenizer.vocab_fingerprint)
        enc = oa.ChunkEncoder(oid, req.model, chat, fp) if req.stream else None
        out = oa.ChatOutput(enc, single_call=getattr(req, "parallel_tool_calls", None) is False)
        return ChatReply(turn.gen, out, self.tool_parser(turn.p), self.reasoner(turn.p),
                         oid, req.model, chat, include_usage, fp)

    def tool_parser(self, p: Prepared[Any, None]) -> tc.ToolParser | None:
        return None


class ChatSpec(_Sampled):
    """/v1/chat/completions: tools parsed unless ``tool_choice`` is ``"none"``."""

    schema = ChatCompletionRequest
    id_prefix = "chatcmpl"

    def normalize(self, req: ChatCompletionRequest, target: Target, kept: None) -> ChatPrompt:
        messages = place_system(req.template_messages(), target.tokenizer.system_in_place)
        return ChatPrompt(messages, req.template_tools(), options=req.template_options())

    def has_tools(self, req: ChatCompletionRequest) -> bool:
        return bool(req.tools)

    def headers(self, turn: Turn[ChatCompletionRequest, None]) -> dict[str, str]:
        fmt = turn.p.req.response_format
        return fmt.not_enforced() if fmt else {}

    def tool_parser(self, p: Prepared[ChatCompletionRequest, None]) -> tc.ToolParser | None:
        if not p.req.parses_tools() or p.prompt is None:
            return None
        return tc.parser_for(p.target.model, p.prompt.tools)


class CompletionSpec(_Sampled):
    """/v1/completions: a string prompt (tokenized as it is) or token ids; no template."""

    schema = CompletionRequest
    id_prefix = "cmpl"
    prompt_param = "prompt"

    async def encode(self, req: CompletionRequest, target: Target, kept: None
                     ) -> tuple[ChatPrompt | None, list[int]]:
        tok = target.tokenizer
        if isinstance(req.prompt, str):
            rq.check_text_fits(target, len(req.prompt), self.too_long)
            ids = await tok.aencode(req.prompt)
        else:
            ids = list(req.prompt)
            rq.output_budget(target, len(ids), None, self.too_long)  # 400 before the scan
            if any(t < 0 or t >= tok.vocab_size for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {tok.vocab_size})",
                               "invalid_token_ids", "prompt")
        if not ids:
            raise ApiError(400, "prompt is empty", "empty_prompt", "prompt")
        return None, ids


CHAT, COMPLETION = ChatSpec(), CompletionSpec()


async def chat_completions(core: RouterCore, request: Request) -> Response:
    return await serve(core, request, CHAT)


async def completions(core: RouterCore, request: Request) -> Response:
    return await serve(core, request, COMPLETION)


class ChatReply(Reply):
    """A chat completion (or a text completion, ``chat`` False), whole or as chunks."""

    def __init__(self, gen: Generation, out: oa.ChatOutput, parser: tc.ToolParser | None,
                 reasoner: rp.ReasoningParser | None, rid: str, model: str, chat: bool,
                 include_usage: bool, fingerprint: str | None = None) -> None:
        super().__init__(gen, out, parser, reasoner, rid)
        self.out, self.model, self.chat, self.include_usage = out, model, chat, include_usage
        self.fingerprint = fingerprint

    def start(self) -> bytes:
        assert self.out.enc is not None
        return self.out.enc.delta({"role": "assistant", "content": ""}) if self.chat else b""

    def finish(self) -> bytes:
        enc, final = self.out.enc, self.gen.final
        assert enc is not None
        reason = oa.finish_reason(final, bool(self.out.calls))
        end = enc.delta({} if self.chat else {"text": ""}, reason)
        return end + enc.usage(final) + oa.DONE if self.include_usage else end + oa.DONE

    def failed(self, message: str) -> bytes:
        return oa.sse(oa.stream_error(message)) + oa.DONE

    def body(self) -> dict[str, Any]:
        text, final = "".join(self.out.text), self.gen.final
        if self.chat:
            return oa.chat_completion(self.label, self.model, text, final, self.out.calls,
                                      "".join(self.out.reasoning), self.fingerprint)
        return oa.text_completion(self.label, self.model, text, final, self.fingerprint)
