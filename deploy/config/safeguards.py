"""The ``safeguards`` section: how kvroute answers a client's request for a safety verdict
on the tool calls of its reply (Claude Code's auto mode sends
``safeguards: [{type: "dangerous_tool_use", classifier_context: {...}}]`` and reads
``safeguard_results`` in ``message_delta``; ``router.api.anthropic.safeguards``).

Schema only: imports no other kvroute package but the schema's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deploy.config.schema import Strict

SafeguardMode = Literal["unavailable", "model", "allow", "deny"]


class SafeguardsConfig(Strict):
    """What ``safeguard_results`` says (docs/api.md, Claude Code's auto mode)."""

    mode: SafeguardMode = Field(
        "unavailable", description="`unavailable` (the default): kvroute says it runs no "
        "check (status `unavailable`, reason `disabled`); Claude Code then asks the user "
        "before each action its auto mode would check, with no fallback requests. `model`: "
        "kvroute asks `model` about each tool call of the reply (a side request with the "
        "classifier prompt of docs/api.md, bounded by `max_tokens` and `timeout_s`, traced) "
        "and returns its verdict; a check that fails or times out is that call's "
        "`unavailable` (the user is asked). `allow`: every tool call `not_flagged`, unread "
        "(risk: auto mode then runs whatever the model writes, destructive commands "
        "included). `deny`: every tool call `flagged` (risk: auto mode refuses every checked "
        "action, so an agent in auto mode can do nothing but read).",
    )
    model: str | None = Field(
        None, description="mode `model`: the model or group that judges (a name of this "
        "config; None: the model that wrote the reply). A strong instruction-following model "
        "is the point: a tiny or random one gives verdicts worth nothing.",
    )
    max_tokens: int = Field(
        48, ge=1, le=1024, description="mode `model`: output bound of one verdict."
    )
    timeout_s: float = Field(
        15.0, gt=0, le=300, description="mode `model`: bound on all the verdicts of one "
        "reply; what is not judged by then is `unavailable` (`timeout`).",
    )
    max_context_chars: int = Field(
        16384, ge=256, description="mode `model`: the most characters of the conversation "
        "(its end) and of the client's classifier context shown to the judge.",
    )

    @model_validator(mode="after")
    def _model_only(self) -> SafeguardsConfig:
        if self.model is not None and self.mode != "model":
            raise ValueError("safeguards.model is used only with safeguards.mode 'model'")
        return self
