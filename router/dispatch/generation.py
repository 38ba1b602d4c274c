"""A started generation: the chosen replica and its message stream, resumable.

If the replica dies mid-stream (process killed, node lost), the stream is not lost:
the prompt plus the tokens already sent become a new prompt, routed like any request
(minus the dead replica) with the output budget reduced by what was sent, and its
messages continue the same stream. The client sees one uninterrupted response; usage
is reported against the original prompt. Only tokens whose text was released count as
sent (a worker holds back text that may start a stop string), so nothing is duplicated
or skipped. Resuming keeps the model: another model would change the distribution the
first tokens were sampled from. NVIDIA Dynamo calls this request migration.

A generation reports to its owner (``StreamOwner``: ``RouterCore`` in production, a
fake in unit tests) and never imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from router import telemetry
from router.auth.keys import ApiKeyConfig
from router.dispatch.dispatch import Started
from router.routing.load import LoadTracker
from router.routing.selection import RouteRequest
from workers.protocol import Chunk, Final, Usage, WorkerMessage

log = logging.getLogger(__name__)


class StreamOwner(Protocol):
    """What a generation reports to and resumes through."""

    loads: LoadTracker
    max_resumes: int

    def on_first_token(self) -> None: ...

    def on_final(self, model: str, final: Final) -> None: ...

    def refund(self, key: ApiKeyConfig, tokens: int) -> None: ...

    async def resume(self, gen: Generation, err: Exception) -> WorkerMessage: ...


@dataclass(slots=True)
class Generation:
    """A started generation: the chosen replica and its message stream."""

    model: str
    replica: str
    router: str
    predicted_cached_tokens: int
    prompt_tokens: int
    first: WorkerMessage
    _run: Started
    _owner: StreamOwner
    _info: telemetry.RequestInfo
    final: Final | None = None
    _closed: bool = field(default=False)
    api_key: ApiKeyConfig | None = None  # set when rate-limited: close() refunds unused tokens
    max_tokens: int = 0
    request: RouteRequest | None = None  # what to resume from (None: not resumable)
    sent: list[int] = field(default_factory=list)  # token ids whose text went out
    carried: int = 0  # tokens sent before the current replica took over
    resumes: int = 0

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        try:
            msg: WorkerMessage | None = self.first
            while msg is not None:
                if isinstance(msg, Chunk):  # most messages: one test, no calls
                    if not self._run.ticket.prefilled:
                        self._observe(msg)
                    self.sent.extend(msg.token_ids)
                else:
                    if isinstance(msg, Final) and self.carried:
                        msg = self._whole_usage(msg)
                    self._observe(msg)
                    if isinstance(msg, Final):
                        self.final = msg
                        self._owner.on_final(self.model, msg)
                yield msg
                msg = None if self.final else await self._next()
        except Exception:
            self._info.failed = True
            raise
        finally:
            self.close()

    async def _next(self) -> WorkerMessage | None:
        try:
            return await anext(self._run.stream, None)
        except Exception as e:  # the replica failed mid-stream
            if self.request is None or self.resumes >= self._owner.max_resumes:
                raise
            self.resumes += 1
            log.warning("stream %s cut on replica %s (%r); resuming after %d tokens",
                        self.request.request_id, self.replica, e, len(self.sent))
            return await self._owner.resume(self, e)

    def adopt(self, other: Started) -> WorkerMessage:
        """Continue with ``other``'s stream (a resume); returns its first message."""
        self._owner.loads.end(self._run.ticket)
        self.replica, self._run = other.target.replica, other
        self.carried = len(self.sent)
        return other.first

    def _whole_usage(self, msg: Final) -> Final:
        """The resumed replica counted the sent tokens as prompt: count them as output."""
        u = msg.usage
        usage = Usage(self.prompt_tokens, self.carried + u.completion_tokens,
                      min(u.cached_tokens, self.prompt_tokens),
                      min(u.host_cached_tokens, u.cached_tokens, self.prompt_tokens))
        return dataclasses.replace(msg, usage=usage)

    def _observe(self, msg: WorkerMessage) -> None:
        # once per replica's stream (a resume brings a new ticket), not per chunk
        if not self._run.ticket.prefilled and isinstance(msg, Chunk | Final):
            self._owner.loads.first_token(self._run.ticket)
            self._owner.on_first_token()
            if self._info.first_token_at is None:
                self._info.first_token_at = time.monotonic()
        if isinstance(msg, Final):
            telemetry.record_usage(self._info, msg.usage, self.predicted_cached_tokens)

    def close(self) -> None:
        """End the load ticket; abort on the worker if unfinished (the client left), else
        give back the output tokens the key was charged for and did not use."""
        if self._closed:
            return
        self._closed = True
        self._owner.loads.end(self._run.ticket)
        if self.final is None:
            self._run.stream.cancel()
        if self.api_key is not None:
            used = len(self.sent) if self.final is None else self.final.usage.completion_tokens
            self._owner.refund(self.api_key, self.max_tokens - used)

