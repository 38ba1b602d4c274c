"""The OpenAI Responses endpoint: POST /v1/responses (what Codex speaks).

One request, on the same core as chat: parse (``router.api.responses.schema``) → the
stored conversation of ``previous_response_id``, if any (404 when unknown or
expired) → normalise into the chat template's input
(``router.api.responses.normalize``) → render and tokenize once → ``RouterCore.generate``
→ parse tool calls → reply as a response object or as SSE events
(``router.api.responses.encode``) → with ``store`` (OpenAI's default), keep the
conversation for ``previous_response_id`` (``router.api.responses.store``).

``store: false`` (what Codex sends, with the whole conversation every turn) keeps
nothing. ``max_output_tokens`` is checked against the context window like chat's
``max_tokens`` (413 when it cannot fit). ``reasoning.effort`` goes to thinking
templates and the model's reasoning comes back as ``reasoning`` items
(``router.output.reasoning_parsers``); ``reasoning.summary``, ``text.verbosity``, ``include``
and ``service_tier`` are accepted and have no effect. A client that disconnects
closes the generation, which aborts it on the worker.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from router.api.common import request as hu
from router.api.common.identity import session_key
from router.api.responses.encode import Output, new_id, status, usage
from router.api.responses.normalize import Conversation, to_chat
from router.api.responses.schema import ResponsesRequest
from router.api.responses.store import ResponseStore, StoredResponse
from router.core import Generation, RouterCore
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc

log = logging.getLogger(__name__)


async def create(core: RouterCore, store: ResponseStore, request: Request) -> Response:
    key = await hu.admit_caller(core, request)  # 401 / 429 before reading the body
    req = await hu.parse_body(request, ResponsesRequest, hu.body_limits(core))
    history = await _history(store, req)
    tok = core.tokenizer(req.model)
    prompt, conversation, catalog = to_chat(req, history, tok.system_in_place)
    ids = await hu.encode_prompt(tok, prompt)
    budget, _ = hu.output_budget(core, req.model, len(ids), req.max_output_tokens)
    params = hu.sampling(budget, req.temperature, req.top_p, (), None)
    session = session_key(request.headers, prompt_cache_key=req.prompt_cache_key,
                          tenant=key.name if key else None)
    gen = await core.generate(req.model, ids, params, hu.request_id("resp"),
                              hu.forwarded_headers(request), session, api_key=key,
                              has_tools=bool(req.tools))
    parser = None
    if catalog.refs and req.tool_choice != "none":
        parser = tc.parser_for(core.primary(req.model), prompt.tools)
    out = Output(req, new_id("resp"), catalog, single_call=req.parallel_tool_calls is False)
    reply = _Reply(gen, out, parser, store if req.store else None, conversation)
    reply.reasoner = rp.for_request(core.primary(req.model), tok, ids)
    headers = hu.routing_headers(core, gen)
    if req.stream:
        return hu.GenerationStream(reply.stream(), gen, headers)
    return JSONResponse(await reply.collect(), headers=headers)


async def _history(store: ResponseStore, req: ResponsesRequest) -> Conversation:
    if req.previous_response_id is None:
        return Conversation()
    stored = await store.get(req.previous_response_id)
    if stored is None:
        raise ApiError(404, f"previous response {req.previous_response_id!r} not found (unknown "
                       "or expired, or created with store: false)", "response_not_found",
                       "previous_response_id")
    return Conversation(stored.messages, stored.listed_tools, stored.loaded_tools)


class _Reply:
    """One generation turned into a response, whole or streamed, then stored."""

    def __init__(self, gen: Generation, out: Output, parser: tc.ToolParser | None,
                 store: ResponseStore | None, conversation: Conversation) -> None:
        self.gen, self.out, self.parser = gen, out, parser
        self.store, self.conversation = store, conversation
        self.reasoner: rp.ReasoningParser | None = None

    async def collect(self) -> dict:
        try:
            async for ev in rp.events(self.gen.messages(), self.parser, self.reasoner):
                self.out.add(ev)
        except Exception as e:  # the replica failed mid-generation: retryable for the client
            log.warning("response %s failed: %r", self.out.id, e)
            raise ApiError(503, f"generation failed on replica {self.gen.replica}",
                           "replica_failed") from None
        finally:
            self.gen.close()  # also when the client went away: aborts the worker's generation
        await self._keep()
        final = self.gen.final
        return self.out.response(status(final), usage(final, self.gen.prompt_tokens))

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            yield b"".join(self.out.start())
            async for batch in rp.event_batches(self.gen.messages(), self.parser, self.reasoner):
                if data := b"".join(event for ev in batch for event in self.out.add(ev)):
                    yield data  # one write per worker message
            closing = self.out.finish(self.gen.final, self.gen.prompt_tokens)
        except Exception as e:  # a replica died mid-stream: response.failed ends the stream
            log.warning("stream %s failed: %r", self.out.id, e)
            yield self.out.failed(f"generation failed on replica {self.gen.replica}")
            return
        finally:
            self.gen.close()  # also on client disconnect: aborts the worker's generation
        await self._keep()  # before the closing event: a client may continue at once
        yield b"".join(closing)

    async def _keep(self) -> None:
        if self.store is None:
            return
        conv, tail = self.conversation, self.out.conversation_tail()
        messages = [*conv.messages, *([tail] if tail else [])]
        await self.store.put(self.out.id, StoredResponse(self.out.req.model, messages,
                                                         conv.listed, conv.loaded))
