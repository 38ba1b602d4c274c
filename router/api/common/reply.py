"""One generation turned into a reply, whole (``collect``) or streamed (``stream``): the
part every API shares, the error handling and the close.

- Whole: every event goes to ``output``; a replica that fails mid-generation is a 503
  ``replica_failed`` (retryable for the client); then ``done`` and ``body``.
- Streamed: ``start``, then one write per worker message (its events' bytes from
  ``output``), then ``finish``; a replica that dies mid-stream ends the stream with the
  API's own error event (``failed``).
- Either way the generation is closed (also when the client left: that aborts the
  worker's generation), before ``done`` (the Responses store) runs.

An API's reply overrides ``start``, ``finish``, ``failed`` and ``body`` (and ``done``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from router.api.common.output import Output
from router.errors import ApiError
from router.output.events import event_batches, events
from router.output.reasoning_parsers import ReasoningParser
from router.output.tool_calls import ToolParser
from workers.protocol import Final, WorkerMessage

log = logging.getLogger(__name__)


class Stream(Protocol):
    """What a reply reads of its generation: ``router.dispatch.generation.Generation``, or
    the replicas' own endpoint's engine stream (``router.app.replica_endpoint``)."""

    replica: str
    final: Final | None

    def messages(self) -> AsyncIterator[WorkerMessage]: ...

    def close(self) -> None: ...


class Reply:
    error = False  # the stream ended with the API's error event

    def __init__(self, gen: Stream, output: Output, parser: ToolParser | None,
                 reasoner: ReasoningParser | None, label: str) -> None:
        self.gen, self.output, self.parser, self.reasoner = gen, output, parser, reasoner
        self.label = label  # the id the logs name

    async def collect(self) -> dict[str, Any]:
        add = self.output.add
        try:
            async for ev in events(self.gen.messages(), self.parser, self.reasoner):
                add(ev)
        except Exception as e:  # the replica failed mid-generation: retryable for the client
            log.warning("generation %s failed: %r", self.label, e)
            raise ApiError(503, f"generation failed on replica {self.gen.replica}",
                           "replica_failed") from None
        finally:
            self.gen.close()  # also when the client went away: aborts the worker's generation
        await self.settle()
        await self.done()
        return self.body()

    async def stream(self) -> AsyncIterator[bytes]:
        add = self.output.add
        try:
            if head := self.start():
                yield head
            async for batch in event_batches(self.gen.messages(), self.parser, self.reasoner):
                # one write per worker message; mostly one event (a token's text): no join
                data = add(batch[0]) if len(batch) == 1 else b"".join([add(ev) for ev in batch])
                if data:
                    yield data
            await self.settle()
            closing = self.finish()
        except Exception as e:  # a replica died mid-stream: the API's error event ends it
            log.warning("stream %s failed: %r", self.label, e)
            self.error = True
            yield self.failed(f"generation failed on replica {self.gen.replica}")
            return
        finally:
            self.gen.close()  # also on client disconnect: aborts the worker's generation
        await self.done()  # before the closing event: a client may continue at once
        yield closing

    def start(self) -> bytes:
        """What a stream sends before the first event."""
        return b""

    def finish(self) -> bytes:
        """What a stream sends after the last event."""
        raise NotImplementedError

    def failed(self, message: str) -> bytes:
        """The stream's error event."""
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        """The whole reply, after every event."""
        raise NotImplementedError

    async def settle(self) -> None:
        """After the last event, before ``finish`` / ``body``: what the reply's end needs
        from elsewhere (Anthropic's safety verdicts on its tool calls)."""

    async def done(self) -> None:
        """After the generation closed, before the reply's end goes out."""

