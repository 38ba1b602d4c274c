"""Worker-side spans: one per generation, with prefill and decode children."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace

from deploy.tracing import extract, tracer
from workers.protocol import Usage

TRACER = tracer("kvroute.worker")


class GenerationSpans:
    """worker.generate with prefill and decode children, ended explicitly.

    Spans are never attached to the context: the async generator may be closed
    from another task, where detaching a token would fail.
    """

    def __init__(self, carrier: dict[str, str] | None, attrs: dict[str, Any]) -> None:
        self.root = TRACER.start_span("worker.generate", context=extract(carrier),
                                      attributes=attrs)
        self._ctx = trace.set_span_in_context(self.root)
        self.phase = TRACER.start_span("prefill", context=self._ctx)
        self.started = time.monotonic()
        self.first_at: float | None = None

    def first_token(self) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
            self.phase.end()
            self.phase = TRACER.start_span("decode", context=self._ctx)

    def finish(self, usage: Usage | None, error: bool) -> None:
        self.first_token()
        self.phase.end()
        if usage:
            ttft = (self.first_at or self.started) - self.started
            self.root.set_attribute("kvroute.ttft_s", ttft)
            self.root.set_attribute("kvroute.cached_tokens", usage.cached_tokens)
            self.root.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if usage.completion_tokens > 1:
                tpot = (time.monotonic() - (self.first_at or self.started)) / (
                    usage.completion_tokens - 1)
                self.root.set_attribute("kvroute.tpot_s", tpot)
        if error:
            self.root.set_status(trace.Status(trace.StatusCode.ERROR))
        self.root.end()
