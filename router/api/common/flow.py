"""One request flow for every API: ``serve(core, request, spec)``.

Every front end runs the same setup, in this order, once:

1. admit: the key (401) and its requests/min (429), before the body is read;
2. parse: the bounded body into the API's pydantic schema (400 / 413 / 408);
3. recall: what the API keeps between requests (the Responses store), if anything;
4. target: the model name resolved once (``RouterCore.target``; 404);
5. normalise and encode: the API's request → ``ChatPrompt`` → template + tokenize;
6. budget: the output limit against the context window (cut to fit; a prompt that alone
   fills it is a 400 ``context_length_exceeded``, also checked from its text before step 5);
7. sampling, the request id and the session key;
8. route: ``RouterCore.generate``;
9. reply: the API's ``Reply``, whole or streamed, with the routing headers.

An API is a ``Spec`` over it: its schema, its normaliser, its output limit and its
overflow error, its sampling defaults, its session hint, its tool-call and reasoning rules
and its reply. ``prepare`` is steps 1-5 alone (``/v1/messages/count_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic, NamedTuple, TypeVar, cast

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from router.api.common import request as rq
from router.api.common import structured as st
from router.api.common.identity import session_key
from router.api.common.reply import Reply
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.dispatch.generation import Generation
from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.prompt.template import ChatPrompt
from router.routing.target import Target
from workers.protocol import Constraint, SamplingParams

R = TypeVar("R", bound=BaseModel)
X = TypeVar("X")


class SessionHint(NamedTuple):
    """What the body says about the conversation (``router.api.common.identity``)."""

    prompt_cache_key: str | None = None
    user_id: str | None = None


@dataclass(slots=True)
class Prepared(Generic[R, X]):
    """A request after steps 1-5."""

    key: ApiKeyConfig | None
    req: R
    target: Target
    prompt: ChatPrompt | None  # None: a plain prompt, no chat (/v1/completions)
    ids: list[int]
    kept: X  # what ``Spec.recall`` and ``Spec.normalize`` keep for the reply


@dataclass(slots=True)
class Turn(Generic[R, X]):
    """A routed request: what its reply is built from."""

    p: Prepared[R, X]
    rid: str
    bound: bool  # the output limit was cut to fit the context
    gen: Generation
    budget: int = 0  # the output limit used (``bound``: the room the prompt left)
    index: int = 0  # the choice this generation is (``router.api.common.fanout``)
    choices: int = 1  # the choices of the reply
    core: RouterCore | None = None  # for a reply that makes side requests (safety verdicts)


class Spec(Generic[R, X]):
    """One API over the flow; the defaults are the OpenAI chat's."""

    schema: type[R]
    id_prefix: str = "req"
    prompt_param = "messages"  # the field a prompt over the window is blamed on

    async def recall(self, req: R, key: ApiKeyConfig | None) -> X:
        """What the API keeps between requests, for this one and its key (None: nothing
        kept)."""
        return cast(X, None)

    def normalize(self, req: R, target: Target, kept: X) -> ChatPrompt:
        raise NotImplementedError

    async def encode(self, req: R, target: Target, kept: X) -> tuple[ChatPrompt | None, list[int]]:
        prompt = self.normalize(req, target, kept)
        rq.check_text_fits(target, rq.text_chars(prompt), self.too_long)
        return prompt, await rq.encode_prompt(target, prompt)

    def too_long(self, overflow: rq.Overflow) -> ApiError:
        """The API's 400 for a prompt that alone fills the window (OpenAI's shape)."""
        return rq.too_long(overflow, self.prompt_param)

    def output_limit(self, req: R) -> int | None:
        raise NotImplementedError

    def sampling(self, req: R, max_tokens: int, target: Target) -> SamplingParams:
        """The worker's sampling (``router.api.common.sampling.params``: unset fields from
        ``target``'s model defaults)."""
        raise NotImplementedError

    def constraint(self, p: Prepared[R, X]) -> Constraint | None:
        """What decoding is held to (structured output, a forced tool call), or None; a
        bad one is the API's 400 (``router.api.common.structured``)."""
        return None

    def session_hint(self, req: R) -> SessionHint:
        return SessionHint()

    def has_tools(self, req: R) -> bool:
        return False

    def streams(self, req: R) -> bool:
        return False

    def reasoner(self, p: Prepared[R, X]) -> rp.ReasoningParser | None:
        """A thinking model's parser (None: its text passes through as the answer)."""
        if p.prompt is None:
            return None
        return rp.for_request(p.target.model, p.target.tokenizer, p.ids)

    def reply(self, turn: Turn[R, X]) -> Reply:
        raise NotImplementedError

    def headers(self, turn: Turn[R, X]) -> dict[str, str]:
        return {}

    async def serve(self, core: RouterCore, request: Request, key: ApiKeyConfig | None,
                    req: R) -> Response:
        """Steps 3-9 of a parsed request; an API with several generations per request
        (OpenAI's ``n`` and batched prompts: ``router.api.common.fanout``) overrides it."""
        return await serve_one(core, request, self, await prepared(core, self, key, req))


async def admitted(core: RouterCore, request: Request, spec: Spec[R, X]
                   ) -> tuple[ApiKeyConfig | None, R]:
    """Steps 1-2: the caller admitted and the body parsed."""
    key = await core.admit(request.headers)  # 401 / 429 before reading the body
    return key, await rq.parse_body(request, spec.schema, rq.body_limits(core, key, request))


async def prepared(core: RouterCore, spec: Spec[R, X], key: ApiKeyConfig | None, req: R
                   ) -> Prepared[R, X]:
    """Steps 3-5 of a parsed request: recalled, resolved, templated and tokenized."""
    kept = await spec.recall(req, key)
    target = core.target(req.model, key)  # type: ignore[attr-defined]  # every schema has it
    prompt, ids = await spec.encode(req, target, kept)
    return Prepared(key, req, target, prompt, ids, kept)


async def prepare(core: RouterCore, request: Request, spec: Spec[R, X]) -> Prepared[R, X]:
    """Steps 1-5: admitted, parsed, resolved, templated and tokenized."""
    return await prepared(core, spec, *await admitted(core, request, spec))


async def serve(core: RouterCore, request: Request, spec: Spec[R, X]) -> Response:
    """The whole flow: one request of ``spec``'s API, replied whole or streamed."""
    key, req = await admitted(core, request, spec)
    return await spec.serve(core, request, key, req)


def worker_sampling(spec: Spec[R, X], p: Prepared[R, X], budget: int) -> SamplingParams:
    """The spec's sampling for ``p`` with its output constraint (a 400 when the request's
    is one the target cannot decode)."""
    constraint = spec.constraint(p)
    if p.prompt is not None:  # a chat whose template opened a reasoning block
        constraint = st.after_reasoning(constraint, p.target, p.ids)
    sampling = spec.sampling(p.req, budget, p.target)
    return sampling if constraint is None else replace(sampling, constraint=constraint)


async def serve_one(core: RouterCore, request: Request, spec: Spec[R, X], p: Prepared[R, X]
                    ) -> Response:
    """Steps 6-9: one generation, replied whole or streamed."""
    req = p.req
    budget, bound = rq.output_budget(p.target, len(p.ids), spec.output_limit(req),
                                     spec.too_long)
    rid = rq.request_id(spec.id_prefix)
    hint = spec.session_hint(req)
    session = session_key(request.headers, prompt_cache_key=hint.prompt_cache_key,
                          user_id=hint.user_id, tenant=p.key.name if p.key else None)
    sampling = worker_sampling(spec, p, budget)  # a constraint's 400 before any routing
    gen = await core.generate(p.target, p.ids, sampling, rid,
                              rq.forwarded_headers(request), session, api_key=p.key,
                              has_tools=spec.has_tools(req))
    # admitted: the shared token store may learn its prompt, on its key's share
    p.target.tokenizer.commit(p.ids, p.key.name if p.key else None)
    turn = Turn(p, rid, bound, gen, budget, core=core)
    try:
        reply = spec.reply(turn)
        headers = {**rq.routing_headers(core, gen), **rq.budget_headers(turn.bound, budget),
                   **spec.headers(turn)}
    except BaseException:  # no reply will close it: end the worker's generation here
        gen.close()
        raise
    if spec.streams(req):
        return rq.GenerationStream(reply.stream(), gen, headers)
    return JSONResponse(await reply.collect(), headers=headers)
