"""Model selection and sessions: what the routing core needs beyond one model.

A request may name a model, a group (an alias over several models with
preference weights) or ``auto`` (every model). The core then looks up the
prompt's blocks for every member model in ONE index call and scores all
(model, replica) pairs together, so a conversation stays on the model whose
cache is warm unless another model's preference outweighs re-prefilling there.
Group members must share a tokenizer and chat template: the prompt is tokenized
once and the same token ids go to whichever model wins.

Sessions (``x-session-id``, or Anthropic ``metadata.user_id``): the prefix index
remembers the last (model, replica) per session, shared by every router replica
(``PrefixIndex.session``); the session-affinity scorer turns it into a load-guarded
preference.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from deploy.config import KvrouteConfig
from router.prompt.tokenizer import ChatTokenizer
from router.routing.context import Candidate, RequestContext
from workers.protocol import SamplingParams

Pin = tuple[str, str] | None  # a (model, replica) pair to try first


@dataclass(frozen=True, slots=True)
class RouteRequest:
    name: str  # model, group or 'auto'
    token_ids: list[int]
    sampling: SamplingParams
    request_id: str
    headers: Mapping[str, str]
    session_id: str | None
    has_tools: bool = False
    tenant: str | None = None  # the cache salt (index.tenant_isolation): the key's name
    pin: Pin = None  # (model, replica) tried first: a copy of ``n``


def pinned(ranked: list[Candidate], pin: Pin) -> list[Candidate]:
    """``ranked`` with the ``pin`` pair first (the replica that prefilled the copies'
    prompt, ``router.api.common.fanout``); the rest stay behind it for a retry."""
    if pin is None:
        return ranked
    return sorted(ranked, key=lambda c: (c.model, c.replica) != pin)  # stable: rank kept


@functools.cache
def fingerprint(tok: ChatTokenizer) -> str:
    return hashlib.sha256((tok.template_source + tok.vocab_fingerprint).encode()).hexdigest()


def check_shared_tokenizers(config: KvrouteConfig, tokenizers: Mapping[str, ChatTokenizer]) -> None:
    """Groups whose members tokenize differently cannot share one tokenization."""
    for group in config.groups:
        members = [m.model for m in group.models]
        if len({fingerprint(tokenizers[m]) for m in members}) > 1:
            name = group.name
            raise ValueError(f"group {name!r}: members {members} do not share a tokenizer "
                             "and chat template")


def request_context(
    config: KvrouteConfig, req: RouteRequest, weights: Mapping[str, float],
    hashes: dict[str, list[int]], candidates: list[Candidate],
    sticky: tuple[str, str] | None, *, prompt_tokens: int, now: float,
) -> RequestContext:
    """Everything the pipeline sees of one request (``now``: the decision's monotonic
    time, virtual in ``kvroute sim``)."""
    models = {m.name: m for m in config.models if m.name in weights}
    return RequestContext(
        req.request_id, {m: prompt_tokens for m in weights}, hashes,
        config.index.block_size, candidates, req.headers, req.session_id, now=now,
        model_weights=dict(weights), max_tokens=req.sampling.max_tokens,
        context_windows={n: m.context_window for n, m in models.items()},
        has_tools=req.has_tools,
        tool_models=frozenset(n for n, m in models.items() if m.supports_tools),
        model_costs={n: m.cost_per_mtok for n, m in models.items()}, sticky=sticky,
    )
