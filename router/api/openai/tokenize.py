"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes, on the router's own
tokenizer and prompt cache, and ``GET /version``.

``/tokenize`` takes a ``prompt`` (the ids ``/v1/completions`` would send for it) or chat
``messages`` with optional ``tools`` (the ids ``/v1/chat/completions`` would send: the same
normalisation, template and generation prompt), and answers ``{count, max_model_len,
tokens, token_strs}``. ``add_special_tokens`` is accepted and not applied: the ids are
always those the router sends. ``add_generation_prompt: false`` and
``continue_final_message`` are refused (the router always renders the generation prompt).
``/detokenize`` turns ``tokens`` back into ``{prompt}``. ``model`` may be left out when one
model is served. Both are admitted like any request (key, requests/min) and charge their
tokens to the key's tokens/min, as counting costs the tokenizer what serving does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.api.common import limits as lim
from router.api.common import request as rq
from router.api.common.wire import VERSION
from router.api.openai.routes import CHAT
from router.api.openai.schema import ChatCompletionRequest, ChatMessage, ToolDef
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.errors import ApiError
from router.prompt.setup import off_loop
from router.prompt.tokenizer import ChatTokenizer
from router.routing.target import Target


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TokenizeRequest(_Lenient):
    model: str | None = Field(None, min_length=1)
    prompt: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=lim.MAX_MESSAGES)
    tools: list[ToolDef] | None = Field(None, max_length=lim.MAX_TOOLS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None  # accepted; the ids are the router's own
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt or messages")
        if self.messages is not None and (not self.add_generation_prompt
                                          or self.continue_final_message):
            raise ValueError("the router always renders the generation prompt: "
                             "add_generation_prompt false and continue_final_message are "
                             "not supported")
        return self


class DetokenizeRequest(_Lenient):
    model: str | None = Field(None, min_length=1)
    tokens: list[Annotated[int, Field(ge=0)]] = Field(max_length=lim.MAX_TEXT_CHARS)


async def _admitted(core: RouterCore, request: Request, schema: type[Any]
                    ) -> tuple[ApiKeyConfig | None, Any, Target]:
    key = await core.admit(request.headers)
    req = await rq.parse_body(request, schema, rq.body_limits(core, key, request))
    names = [m.name for m in core.targets.config.models]
    if req.model is None and len(names) != 1:
        raise ApiError(400, "model is required when several models are served",
                       "invalid_request", "model")
    return key, req, core.target(req.model or names[0], key)


async def _charge(core: RouterCore, key: ApiKeyConfig | None, tokens: int) -> None:
    if key is not None:
        await core.limiter.admit(key, tokens, request=False)  # type: ignore[attr-defined]


async def tokenize(core: RouterCore, request: Request) -> dict[str, Any]:
    key, req, target = await _admitted(core, request, TokenizeRequest)
    tok = target.tokenizer
    if req.prompt is not None:
        ids = await tok.aencode(req.prompt, target.tenant)
    else:
        chat = ChatCompletionRequest.model_construct(model=target.name, messages=req.messages,
                                                     tools=req.tools)
        ids = await rq.encode_prompt(target, CHAT.normalize(chat, target, None))
    await _charge(core, key, len(ids))
    strs = await off_loop(tok.cache_config, _pieces, tok, ids) if req.return_token_strs \
        else None
    return {"count": len(ids), "max_model_len": target.window, "tokens": ids,
            "token_strs": strs}


async def detokenize(core: RouterCore, request: Request) -> dict[str, Any]:
    key, req, target = await _admitted(core, request, DetokenizeRequest)
    tok = target.tokenizer
    if any(t >= tok.vocab_size for t in req.tokens):
        raise ApiError(400, f"token ids must lie in [0, {tok.vocab_size})",
                       "invalid_token_ids", "tokens")
    await _charge(core, key, len(req.tokens))
    return {"prompt": await off_loop(tok.cache_config, tok.decode, req.tokens)}


def _pieces(tok: ChatTokenizer, ids: list[int]) -> list[str]:
    return [tok.decode([i]) for i in ids]


def version() -> dict[str, str]:
    """kvroute's version (vLLM's ``/version`` shape)."""
    return {"version": VERSION}
