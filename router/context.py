"""The one object every routing plugin receives.

A new signal is a new field here, never a new parameter on every plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Candidate:
    """One (model, replica) pair that could serve the request."""

    model: str
    replica: str
    matched_tokens: int = 0  # leading prompt tokens the index says this replica holds
    ongoing: int = 0
    queued_prefill_tokens: int = 0
    kv_usage: float = 0.0
    routed: int = 0  # requests this router has sent it (a spreading tie-break)
    prefill_tok_s: float = 4000.0
    max_ongoing: int = 1 << 30


@dataclass(slots=True)
class RequestContext:
    request_id: str
    prompt_tokens: dict[str, int]  # per model: its tokenizer's prompt length
    hashes: dict[str, list[int]]  # per model: block hashes of the prompt
    block_size: int
    candidates: list[Candidate]
    headers: Mapping[str, str] = field(default_factory=dict)
    session_id: str | None = None

    def uncached(self, c: Candidate) -> int:
        return max(0, self.prompt_tokens.get(c.model, 0) - c.matched_tokens)
