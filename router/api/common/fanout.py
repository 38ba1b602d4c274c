"""Several generations for one request: OpenAI's ``n`` and batched completion prompts.

A request with ``n`` copies of each of P prompts becomes P × n generations, each a
choice of the one reply, indexed ``prompt_index * n + i`` (as vLLM and OpenAI index them):

- each prompt is routed on its own prefix, once: copy 0 goes through the whole routing
  pipeline, like any request;
- its other copies start when copy 0's first message is in (its prompt is prefilled and
  in the replica's prefix cache), pinned to that replica (``routing.selection.pinned``:
  the rest of the ranking stays behind it for a retry), so they prefill the prompt's last
  token or block instead of all of it: one prefill per prompt;
- each copy samples on its own: with a ``seed``, copy i gets ``seed + i`` (vLLM's rule for
  its child requests), so seeded copies differ and repeat.

Why in the router and not in the engine: vLLM's own ``n`` is the same thing inside its
engine (a ``ParentRequest`` forks n child requests, which share the prompt through its
prefix cache); doing it here gives the same on every engine (mlx, vllm, sim) with one
code path, no change to the router↔worker records or the binary wire, and each copy keeps
everything a single stream has (resume on another replica, stop strings, cancellation).
What it costs: n streams from the replica instead of one.

Replies: every choice has its own ``Reply`` (``spec.reply`` with the turn's ``index``);
whole, their bodies are joined; streamed, their chunks interleave as they come, and the
API's ``Joiner`` writes the end (one usage for all and the stream's last event).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from router.api.common import request as rq
from router.api.common.flow import Prepared, Spec, Turn, prepared, worker_sampling
from router.api.common.identity import session_key
from router.api.common.reply import Reply
from router.auth.keys import ApiKeyConfig
from router.core import RouterCore
from router.dispatch.generation import Generation
from workers.protocol import SamplingParams

R = TypeVar("R", bound=BaseModel)


class Joiner(Protocol):
    """An API's reply over several choices."""

    def body(self, bodies: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole reply from each choice's own body, in index order."""
        ...

    def end(self) -> bytes:
        """What a stream sends after every choice's last event."""
        ...

    def broken(self) -> bytes:
        """What a stream sends after a choice failed (its error event went out)."""
        ...


Join = Callable[[list[Turn[Any, Any]], list[Reply]], Joiner]


class Generations:
    """The started generations of one request; ``close`` ends every one."""

    def __init__(self, size: int) -> None:
        self.gens: list[Generation | None] = [None] * size

    def close(self) -> None:
        for gen in self.gens:
            if gen is not None:
                gen.close()


def seeded(sampling: SamplingParams, copy: int) -> SamplingParams:
    """Copy ``copy``'s sampling: its own seed, ``seed + copy``, as vLLM seeds its children."""
    if copy == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + copy)


async def serve_many(core: RouterCore, request: Request, spec: Spec[R, Any],
                     key: ApiKeyConfig | None, reqs: list[R], n: int, join: Join) -> Response:
    """Steps 3-9 (``router.api.common.flow``) for ``reqs`` (one per prompt), ``n`` copies
    each: routed, started, and replied as one response."""
    ps = [await prepared(core, spec, key, r) for r in reqs]  # every prompt checked first
    budgets = [rq.output_budget(p.target, len(p.ids), spec.output_limit(p.req), spec.too_long)
               for p in ps]
    rid = rq.request_id(spec.id_prefix)
    hint = spec.session_hint(reqs[0])
    session = session_key(request.headers, prompt_cache_key=hint.prompt_cache_key,
                          user_id=hint.user_id, tenant=key.name if key else None)
    started = Generations(len(ps) * n)
    start = _Starter(core, spec, rq.forwarded_headers(request), session, rid, n, started)
    try:
        await _gather([start.prompt(j, p, budget) for j, (p, (budget, _)) in
                       enumerate(zip(ps, budgets, strict=True))])
        turns = [Turn(ps[k // n], rid, budgets[k // n][1], gen, budgets[k // n][0], k,
                      len(started.gens), core) for k, gen in enumerate(_all(started))]
        replies = [spec.reply(turn) for turn in turns]
        joiner = join(turns, replies)
        cut = [b for b, bound in budgets if bound]
        headers = {**rq.routing_headers(core, turns[0].gen),
                   **rq.budget_headers(bool(cut), min(cut, default=0)),
                   **spec.headers(turns[0])}
    except BaseException:  # no reply will close them
        started.close()
        raise
    if spec.streams(reqs[0]):
        return rq.GenerationStream(merged(replies, joiner), started, headers)
    try:
        bodies = await _gather([r.collect() for r in replies])
    finally:
        started.close()
    return JSONResponse(joiner.body(bodies), headers=headers)


def _all(started: Generations) -> list[Generation]:
    gens = [g for g in started.gens if g is not None]
    assert len(gens) == len(started.gens)
    return gens


@dataclasses.dataclass(slots=True)
class _Starter:
    core: RouterCore
    spec: Spec[Any, Any]
    headers: dict[str, str]
    session: str | None
    rid: str
    n: int
    started: Generations

    async def prompt(self, j: int, p: Prepared[Any, Any], budget: int) -> None:
        """Prompt ``j``'s copies: copy 0 routed, then the others pinned to its replica."""
        sampling = worker_sampling(self.spec, p, budget)
        first = await self._one(j * self.n, p, sampling, self.session, None)
        # admitted: the shared token store may learn its prompt, on its key's share
        p.target.tokenizer.commit(p.ids, p.key.name if p.key else None)
        pin = (first.model, first.replica)
        await _gather([self._one(j * self.n + i, p, seeded(sampling, i), None, pin)
                       for i in range(1, self.n)])

    async def _one(self, k: int, p: Prepared[Any, Any], sampling: SamplingParams,
                   session: str | None, pin: tuple[str, str] | None) -> Generation:
        rid = self.rid if k == 0 else f"{self.rid}-{k}"  # each worker request its own id
        gen = await self.core.generate(p.target, p.ids, sampling, rid, self.headers, session,
                                       api_key=p.key, has_tools=self.spec.has_tools(p.req),
                                       pin=pin)
        self.started.gens[k] = gen
        return gen


T = TypeVar("T")


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    """All of ``coros``, or the first failure with the others cancelled."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def merged(replies: list[Reply], joiner: Joiner) -> AsyncIterator[bytes]:
    """The choices' streams interleaved as their writes come; a choice that fails ends
    the whole stream after its error event."""
    out: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

    async def pump(k: int, reply: Reply) -> None:
        try:
            async for data in reply.stream():
                out.put_nowait((k, data))
        finally:
            out.put_nowait((k, None))

    tasks = [asyncio.create_task(pump(k, r)) for k, r in enumerate(replies)]
    try:
        live = len(tasks)
        while live:
            k, data = await out.get()
            if data is not None:
                yield data
                continue
            live -= 1
            if getattr(replies[k], "error", False):
                yield joiner.broken()
                return
        yield joiner.end()
    finally:
        for t in tasks:
            t.cancel()
