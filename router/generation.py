"""A started generation: the chosen replica and its message stream, resumable.

If the replica dies mid-stream (process killed, node lost), the stream is not lost:
the prompt plus the tokens already sent become a new prompt, routed like any request
(minus the dead replica) with the output budget reduced by what was sent, and its
messages continue the same stream. The client sees one uninterrupted response; usage
is reported against the original prompt. Only tokens whose text was released count as
sent (a worker holds back text that may start a stop string), so nothing is duplicated
or skipped. Resuming keeps the model: another model would change the distribution the
first tokens were sampled from. NVIDIA Dynamo calls this request migration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray.serve.handle import DeploymentResponseGenerator

from router import telemetry
from router.auth import ApiKeyConfig
from router.load import Ticket
from router.selection import RouteRequest

if TYPE_CHECKING:
    from router.core import RouterCore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Generation:
    """A started generation: the chosen replica and its message stream."""

    model: str
    replica: str
    router: str
    predicted_cached_tokens: int
    prompt_tokens: int
    first: dict[str, Any]
    _rest: DeploymentResponseGenerator
    _core: RouterCore
    _ticket: Ticket
    _info: telemetry.RequestInfo
    final: dict[str, Any] | None = None
    _closed: bool = field(default=False)
    api_key: ApiKeyConfig | None = None  # set when rate-limited: close() refunds unused tokens
    max_tokens: int = 0
    request: RouteRequest | None = None  # what to resume from (None: not resumable)
    sent: list[int] = field(default_factory=list)  # token ids whose text went out
    carried: int = 0  # tokens sent before the current replica took over
    resumes: int = 0

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        try:
            msg: dict[str, Any] | None = self.first
            while msg is not None:
                if "finish_reason" in msg and self.carried:
                    msg = self._whole_usage(msg)
                self._observe(msg)
                if "finish_reason" in msg:
                    self.final = msg
                    await self._core.on_final(self.model, msg)
                else:
                    self.sent.extend(msg.get("ids", ()))
                yield msg
                msg = None if self.final else await self._next()
        except Exception:
            self._info.failed = True
            raise
        finally:
            self.close()

    async def _next(self) -> dict[str, Any] | None:
        try:
            return await anext(self._rest, None)
        except Exception as e:  # the replica failed mid-stream
            if self.request is None or self.resumes >= self._core.config.router.max_resumes:
                raise
            self.resumes += 1
            log.warning("stream %s cut on replica %s (%r); resuming after %d tokens",
                        self.request.request_id, self.replica, e, len(self.sent))
            return await self._core.resume(self, e)

    def adopt(self, other: Generation) -> dict[str, Any]:
        """Continue with ``other``'s stream (a resume); returns its first message."""
        self._core.loads.end(self._ticket)
        self.replica, self._rest, self._ticket = other.replica, other._rest, other._ticket
        self.carried = len(self.sent)
        other._closed = True  # its ticket and stream are this generation's now
        return other.first

    def _whole_usage(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The resumed replica counted the sent tokens as prompt: count them as output."""
        usage = dict(msg.get("usage") or {})
        usage["prompt_tokens"] = self.prompt_tokens
        usage["completion_tokens"] = self.carried + int(usage.get("completion_tokens", 0))
        usage["cached_tokens"] = min(int(usage.get("cached_tokens", 0)), self.prompt_tokens)
        return {**msg, "usage": usage}

    def _observe(self, msg: dict[str, Any]) -> None:
        if "text" in msg or "finish_reason" in msg:
            self._core.loads.first_token(self._ticket)
            self._core.on_first_token()
            if self._info.first_token_at is None:
                self._info.first_token_at = time.monotonic()
        if "finish_reason" in msg:
            telemetry.record_usage(self._info, msg, self.predicted_cached_tokens)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.loads.end(self._ticket)
            if self.final is None:
                self._rest.cancel()  # client went away: abort on the worker
            elif self.api_key is not None:  # give back the max_tokens it did not use
                used = int((self.final.get("usage") or {}).get("completion_tokens", 0))
                self._core.refund(self.api_key, self.max_tokens - used)
