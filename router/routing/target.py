"""A request's model, resolved once: what every later step of the request reads.

A client names a model, a group (an alias over several models) or ``auto``; ``Targets``
turns that name into a ``Target`` once per request, and the template, the parsers, the
output budget and routing all read it (before, each of them resolved the name again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deploy.config import KvrouteConfig, ModelConfig
from router.errors import ApiError
from router.prompt.tokenizer import ChatTokenizer
from router.routing.selection import fingerprint


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's model name stands for."""

    name: str  # as the client sent it (a model, a group, 'auto' or an alias)
    weights: Mapping[str, float]  # member model -> preference; a model alone: {model: 1.0}
    model: ModelConfig  # the first member: its tokenizer family and its parsers
    tokenizer: ChatTokenizer  # shared by every member (checked when the config loads)
    window: int  # the largest member's context window
    default_max_tokens: int  # the smallest member's default output limit
    bytes_per_token: int = 32  # server.body_bytes_per_token: the most text one token holds
    tenant: str | None = None  # the key whose prompt cache it reads (tenant isolation on)

    @property
    def max_prompt_chars(self) -> int:
        """The most characters of text a prompt can hold and still fit the window."""
        return self.window * self.bytes_per_token

    @property
    def label(self) -> str:
        """A configured model, never the client's string (aliases match patterns): what
        metric labels name, so they stay bounded by the config."""
        return self.name if self.name in self.weights else self.model.name


class Targets:
    """Model names -> targets, over the config's models and their tokenizers."""

    def __init__(self, config: KvrouteConfig, tokenizers: Mapping[str, ChatTokenizer]) -> None:
        self.config, self.tokenizers = config, tokenizers
        self.models: dict[str, ModelConfig] = {m.name: m for m in config.models}
        self.max_window = max(m.context_window for m in config.models)

    def resolve(self, name: str, tenant: str | None = None) -> Target:
        """The target of a model, group or 'auto'; 404 if unknown. ``tenant``: the prompt
        cache and token store it reads and writes are that tenant's alone."""
        weights = self.config.resolve(name)
        if weights is None:
            raise ApiError(404, f"model {name!r} does not exist", "model_not_found", "model")
        if name == "auto" and len(weights) > 1:  # only models that share one tokenization
            first = fingerprint(self.tokenizers[next(iter(weights))])
            weights = {m: w for m, w in weights.items()
                       if fingerprint(self.tokenizers[m]) == first}
        members = [self.models[m] for m in weights]
        return Target(name, weights, members[0], self.tokenizers[members[0].name],
                      max(m.context_window for m in members),
                      min(m.default_max_tokens for m in members),
                      self.config.server.body_bytes_per_token, tenant)

    def windows(self) -> dict[str, int]:
        """Each model's and group's context window; a group's is its smallest member's,
        since any member may serve it."""
        out = {name: m.context_window for name, m in self.models.items()}
        return out | {g.name: min(out[m.model] for m in g.models) for g in self.config.groups}
