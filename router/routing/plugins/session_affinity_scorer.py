"""session-affinity-scorer: keep a session (``x-session-id`` or Anthropic
``metadata.user_id``) on the replica that served it last, with a load guard.

The prefix index already sends a growing conversation back to its replica; the
session adds a preference for turns whose prefix changed (a compacted history, a
sub-agent with its own system prompt under the same user) so they still land
where the rest of the session's KV lives. The guard: the sticky replica scores
only while its estimated TTFT ((queued + uncached prefill) / rate) stays within
``max_ttft_ratio`` of the best candidate's; past that, stickiness yields to load.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.routing.context import Candidate, RequestContext
from router.routing.estimates import ttft_s
from router.routing.plugins.base import register


class SessionAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_ttft_ratio: float = Field(
        2.0, ge=1.0, description="Sticky only while its est. TTFT <= this x the best one."
    )


def _est_ttft(ctx: RequestContext, c: Candidate) -> float:
    return ttft_s(c.queued_prefill_tokens, ctx.uncached(c), c.prefill_tok_s)


@register("session-affinity-scorer", "scorer")
class SessionAffinityScorer:
    Params = SessionAffinityParams

    def __init__(self, params: SessionAffinityParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        if ctx.sticky is None:
            return [0.0] * len(ctx.candidates)
        best = min((_est_ttft(ctx, c) for c in ctx.candidates), default=0.0)
        limit = best * self.params.max_ttft_ratio
        return [
            1.0 if (c.model, c.replica) == ctx.sticky and _est_ttft(ctx, c) <= limit else 0.0
            for c in ctx.candidates
        ]
