"""Dispatch: send a ranked request to a model deployment and wait for its first message.

The best replica first; a replica that fails before its first message is retried on
the next in rank (up to ``router.max_retries`` times); when a whole model is
overloaded (Serve's queue full) or does not start in time, the next model of the
ranking takes over. Serve's own request router (``router.dispatch.request_router``) honours
the rank, so a full or dead replica is skipped there too; the replica that answered
is the one the load view and the generation record.

A client that leaves while the request waits for its first message (queued, or
prefilling) cancels it: the worker request is cancelled, and the load ticket ends.

With ``loopback`` (``router.stream_transport: loopback``) a replica on this router's node
answers with a ``Handoff``: the stream goes on over its loopback socket
(``router.dispatch.loopback_stream``); a replica that cannot be reached there counts as failed
before its first message (retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ray.serve.exceptions import BackPressureError

from deploy import tracing
from router import metrics, telemetry
from router.dispatch.loopback_call import CallRefused, LoopbackCall
from router.dispatch.loopback_stream import Loopback, LoopbackStream
from router.errors import ApiError
from router.routing.context import Candidate, RequestContext
from router.routing.decision import Decider
from router.routing.load import Ticket
from router.routing.views import RANK_KWARG
from workers.protocol import EngineError, Handoff, Rejected, WorkerMessage, WorkRequest

log = logging.getLogger(__name__)


class _NotTaken(Exception):
    """A loopback call the replica did not take (busy, stopping, unreachable): the
    request goes through Serve's handle, which queues or reroutes it."""


@dataclass(slots=True)
class Started:
    """A request a replica has taken: its first message and the rest of its stream."""

    model: str
    target: Candidate  # the replica that answered, with what the index said it holds
    first: WorkerMessage
    stream: Any  # Serve's DeploymentResponseGenerator (or a test's fake of it)
    ticket: Ticket


class Dispatcher:
    """``handles``: one streaming deployment handle per model. ``record_routed`` and
    ``remember`` are told of every target (the index's routed blocks; the replicas the
    router must purge once Serve drops them)."""

    def __init__(self, handles: Mapping[str, Any], decider: Decider, max_retries: int,
                 first_token_timeout_s: float,
                 record_routed: Callable[[str, str, list[int]], None],
                 remember: Callable[[str, str], None], loopback: Loopback | None = None,
                 assign_timeout_s: float = 30.0,
                 call_models: frozenset[str] = frozenset()) -> None:
        self.handles, self.decider, self.loads = handles, decider, decider.loads
        self.loopback = loopback
        # router.start_transport: loopback: these models' requests start over the
        # replica's loopback socket once a Handoff told its address (router.dispatch.loopback_call)
        self._call_models = call_models if loopback is not None else frozenset()
        self._addresses: dict[str, str] = {}  # replica -> loopback address (this node)
        self._node = loopback.node if loopback is not None else None
        self.max_retries, self.timeout_s = max_retries, first_token_timeout_s
        self.assign_timeout_s = assign_timeout_s
        self._record_routed, self._remember = record_routed, remember

    async def dispatch(self, ranked: list[Candidate], ctx: RequestContext, work: WorkRequest,
                       info: telemetry.RequestInfo) -> Started:
        failed: set[tuple[str, str]] = set()
        with telemetry.TRACER.start_as_current_span("dispatch") as span:
            work = dataclasses.replace(work, trace=tracing.inject(),  # worker spans join it
                                       loopback_node=self._node)
            for attempt in range(self.max_retries + 1):
                left = [c for c in ranked if (c.model, c.replica) not in failed] or ranked
                model = left[0].model  # the best pair's model, with its replicas in rank order
                order = [c for c in left if c.model == model]
                try:
                    started = await self._once(order, ctx, work)
                except ApiError as e:  # overloaded or stuck: fall back to the next model
                    if e.code not in ("overloaded", "timeout") or all(
                            c.model == model for c in left):
                        raise
                    failed |= {(model, c.replica) for c in order}
                    continue
                if started is not None:
                    span.set_attribute("kvroute.replica", started.target.replica)
                    span.set_attribute("kvroute.retry", attempt)
                    return started
                failed.add((model, order[0].replica))
                metrics.RETRIES.labels(model).inc()
        info.failed = True
        raise ApiError(503, f"no replica of {ranked[0].model!r} could take the request",
                       "no_replica")

    async def _once(self, order: list[Candidate], ctx: RequestContext,
                    work: WorkRequest) -> Started | None:
        """One attempt on ``order[0]``'s model; None when the replica failed (retry)."""
        target = order[0]
        model = target.model
        self._remember(model, target.replica)
        ticket = self.decider.begin(ctx, target)
        self._record_routed(model, target.replica, ctx.hashes[model])
        address = self._addresses.get(target.replica) if model in self._call_models else None
        if address is not None:
            with contextlib.suppress(_NotTaken):
                return await self._call(address, target, work, ticket)
        rank = {RANK_KWARG: [c.replica for c in order]}
        stream = self.handles[model].generate.remote(work, **rank)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        try:
            while (first := await self._first(stream, deadline)) is None:
                log.warning("request %s: Serve placed it on no replica of %s in %.0f s; "
                            "sending it again", work.request_id, model, self.assign_timeout_s)
                stream.cancel()
                metrics.RETRIES.labels(model).inc()
                stream = self.handles[model].generate.remote(work, **rank)
        except BackPressureError as e:  # every replica full and the queue at its bound
            self.loads.end(ticket)
            raise ApiError(503, f"{model!r} is overloaded; retry later", "overloaded",
                           retry_after_s=max(1.0, e.retry_after_s or 1.0)) from None
        except TimeoutError:
            stream.cancel()
            self.loads.end(ticket)
            raise ApiError(503, f"{model!r} did not start the request in time", "timeout",
                           retry_after_s=5.0) from None
        except Exception as e:  # the replica failed before its first message: retry
            log.warning("replica %s failed before first token: %r", target.replica, e)
            self.loads.end(ticket)
            return None
        except BaseException:  # the client left (cancelled): nothing may keep running
            stream.cancel()
            self.loads.end(ticket)
            raise
        if isinstance(first, Rejected):  # the engine refused the input: no replica would take it
            self.loads.end(ticket)
            raise ApiError(first.status, first.message, "engine_rejected")
        if isinstance(first, Handoff):
            if model in self._call_models:
                self._addresses[first.replica] = first.address
            stream = await self._take_over(first, stream, ticket)
            if stream is None:
                return None
            first = first.first
        if first.replica != target.replica:  # Serve's router moved it (target full or gone)
            self.loads.end(ticket)
            target = next((c for c in order if c.replica == first.replica),
                          Candidate(model, first.replica))
            ticket = self.decider.begin(ctx, target)
        return Started(model, target, first, stream, ticket)

    async def _call(self, address: str, target: Candidate, work: WorkRequest,
                    ticket: Ticket) -> Started | None:
        """The request as a loopback call: ``Started``, or None when the replica failed
        before its first message (retry); ``_NotTaken`` if it did not take it."""
        assert self.loopback is not None
        try:
            call = await LoopbackCall.open(target.replica, address, self.loopback.token, work)
        except Exception as e:  # unreachable, or reset at once: Serve still can take it
            raise self._not_taken(target, e) from None
        except BaseException:  # the client left while connecting
            self.loads.end(ticket)
            raise
        try:
            first = await asyncio.wait_for(call.first(), self.timeout_s)
        except CallRefused as e:  # not that replica any more (a restart, a redeploy)
            raise self._not_taken(target, e) from None
        except TimeoutError:
            call.cancel()
            self.loads.end(ticket)
            raise ApiError(503, f"{target.model!r} did not start the request in time",
                           "timeout", retry_after_s=5.0) from None
        except EngineError as e:
            log.warning("replica %s failed before first token: %r", target.replica, e)
            call.cancel()
            self.loads.end(ticket)
            return None
        except BaseException:  # the client left: closing the call cancels it
            call.cancel()
            self.loads.end(ticket)
            raise
        if first is None:
            raise _NotTaken
        if isinstance(first, Rejected):
            self.loads.end(ticket)
            raise ApiError(first.status, first.message, "engine_rejected")
        return Started(target.model, target, first, call, ticket)

    def _not_taken(self, target: Candidate, err: BaseException) -> _NotTaken:
        """Forget an address that answers no call; the request goes through Serve."""
        log.warning("replica %s: loopback call not taken: %r", target.replica, err)
        self._addresses.pop(target.replica, None)
        return _NotTaken()

    def forget(self, live: set[str]) -> None:
        """Drop the loopback addresses of replicas Serve no longer runs."""
        for replica in self._addresses.keys() - live:
            del self._addresses[replica]

    async def _first(self, stream: Any, deadline: float) -> WorkerMessage | None:
        """The stream's first message by ``deadline`` (else ``TimeoutError``), or None
        if Serve has not placed the request on a replica within
        ``assign_timeout_s``: a request Serve's handle queue stranded is only freed by
        sending it again (a placed one is never re-sent: it may be prefilling)."""
        placed = getattr(stream, "_replica_result_future", None)  # Serve's, private
        nxt = asyncio.ensure_future(anext(stream))
        try:
            left = deadline - asyncio.get_running_loop().time()
            if placed is not None and not placed.done() and left > self.assign_timeout_s:
                await asyncio.wait({nxt}, timeout=self.assign_timeout_s)
                if nxt.done():  # the common case: answered within the wait
                    return nxt.result()
                if not placed.done():
                    return None
            return await asyncio.wait_for(
                nxt, max(0.0, deadline - asyncio.get_running_loop().time()))
        finally:
            if not nxt.done():
                nxt.cancel()

    async def _take_over(self, handoff: Handoff, stream: Any, ticket: Ticket
                         ) -> LoopbackStream | None:
        """The replica's loopback stream; None (retry) if it cannot be reached."""
        assert self.loopback is not None
        try:
            return await LoopbackStream.open(handoff, stream, self.loopback.token)
        except (OSError, TimeoutError) as e:
            log.warning("replica %s: loopback stream unreachable: %r", handoff.replica, e)
            stream.cancel()
            self.loads.end(ticket)
            return None
        except BaseException:  # the client left while connecting
            stream.cancel()
            self.loads.end(ticket)
            raise
