"""Pre-warm (router.routing.prewarm) as one module: which prefixes are hot, which replicas are new,
the traffic hold, faults, and the claim two router replicas race for on a real Redis.
The sender is a test double here; tests/e2e/test_prewarm.py sends through Serve."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from deploy.config.router import PrewarmConfig
from router.routing.prewarm import HotPrefixes, Prewarmer
from router.routing.views import ReplicaInfo
from tests.stacks import redis_url
from workers.protocol import WorkRequest

BS = 4


def ids(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def hashes(tokens: Sequence[int]) -> list[int]:
    """Chained stand-ins: block k's hash names the whole prefix up to it."""
    return [hash(tuple(tokens[:(k + 1) * BS])) for k in range(len(tokens) // BS)]


def view(*names: str) -> list[ReplicaInfo]:
    return [ReplicaInfo(n, 8, {}) for n in names]


SYSTEM = ids(1, 16)  # 4 blocks every session starts with


def turn(session: int) -> list[int]:
    return SYSTEM + ids(100 + session, 20)


def observe_sessions(table: HotPrefixes | Prewarmer, n: int) -> None:
    """``n`` sessions' first turns: the system prompt is on 3 replicas, nothing else."""
    for s in range(n):
        t = turn(s)
        table.observe("m", None, t, hashes(t), {"r1": 4, "r2": 4, "r3": 4})


def test_the_shared_prefix_is_hot_and_a_session_history_is_not() -> None:
    table = HotPrefixes(64, BS)
    observe_sessions(table, 3)
    history = turn(7)
    for k in range(3):  # a session's later turns reuse its own, growing history on r1
        held = len(history) // BS
        history = history + ids(200 + k, 8)
        table.observe("m", None, history, hashes(history), {"r1": held, "r2": 4})
    plan = table.plan("m", PrewarmConfig(min_uses=2))
    assert [list(p.ids) for p in plan] == [SYSTEM]
    assert table.plan("other", PrewarmConfig()) == []
    assert table.plan("m", PrewarmConfig(min_uses=10)) == []


def test_a_plan_sends_a_longer_prefix_once_instead_of_its_parts() -> None:
    table = HotPrefixes(64, BS)
    long = SYSTEM + ids(2, 16)
    for _ in range(3):  # 8 blocks on 2 replicas; its first 4 (SYSTEM) on 3
        table.observe("m", None, long, hashes(long), {"r1": 8, "r2": 8, "r3": 4})
    plan = table.plan("m", PrewarmConfig(min_uses=1))
    assert [list(p.ids) for p in plan] == [long]  # it warms SYSTEM too
    assert [list(p.ids) for p in table.plan("m", PrewarmConfig(min_uses=1, max_tokens=20))] \
        == [SYSTEM]  # the token bound: the most-held part only
    assert [list(p.ids) for p in table.plan("m", PrewarmConfig(min_uses=1, max_prefixes=1))] \
        == [SYSTEM]  # the count bound


def test_the_table_is_bounded() -> None:
    table = HotPrefixes(5, BS)
    for s in range(50):
        t = ids(s, 8)
        table.observe("m", None, t, hashes(t), {"r1": 2})
    assert len(table) == 5


class Sender:
    def __init__(self, fail: bool = False, hang: bool = False) -> None:
        self.sent: list[tuple[str, WorkRequest]] = []
        self.fail, self.hang = fail, hang
        self.held_while_sending: list[bool] = []
        self.prewarmer: Prewarmer | None = None

    async def __call__(self, model: str, replica: str, work: WorkRequest,
                       hashes: Sequence[int]) -> bool:
        assert self.prewarmer is not None
        self.held_while_sending.append((model, replica) in self.prewarmer.warming())
        self.sent.append((replica, work))
        if self.hang:
            await asyncio.sleep(60)
        if self.fail:
            raise RuntimeError("replica died")
        return True


def prewarmer(sender: Sender, url: str | None = None, **cfg: Any) -> Prewarmer:
    p = Prewarmer(PrewarmConfig(**{"min_uses": 2, **cfg}), BS, sender, url,
                  namespace="pwtest")
    sender.prewarmer = p
    return p


async def settle(p: Prewarmer) -> None:
    for _ in range(100):
        if not p.warming():
            return
        await asyncio.sleep(0.01)


async def test_a_new_replica_is_warmed_and_held_meanwhile() -> None:
    sender = Sender()
    p = prewarmer(sender)
    observe_sessions(p, 3)
    assert p.admit("m", view("r1", "r2")) == view("r1", "r2")  # baseline: not new
    assert not sender.sent
    got = p.admit("m", view("r1", "r2", "r3"))
    assert [i.replica for i in got] == ["r1", "r2"]  # r3 is held while warming
    await settle(p)
    assert [(r, w.token_ids, w.sampling.max_tokens) for r, w in sender.sent] == \
        [("r3", SYSTEM, 1)]
    assert sender.held_while_sending == [True]
    assert [i.replica for i in p.admit("m", view("r1", "r2", "r3"))] == ["r1", "r2", "r3"]
    assert p.counts["warmed"] == 1


async def test_a_replaced_replica_is_warmed_but_never_leaves_no_replica() -> None:
    sender = Sender(hang=True)
    p = prewarmer(sender)
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    assert [i.replica for i in p.admit("m", view("r2"))] == ["r2"]  # r1 gone, r2 new
    assert p.warming() == {("m", "r2")}
    await p.close()


async def test_nothing_hot_means_no_warm_up_and_no_hold() -> None:
    sender = Sender()
    p = prewarmer(sender)
    p.admit("m", view("r1"))
    assert [i.replica for i in p.admit("m", view("r1", "r2"))] == ["r1", "r2"]
    await asyncio.sleep(0.05)
    assert not sender.sent


@pytest.mark.parametrize("fault", ["fail", "hang"])
async def test_a_failed_warm_up_ends_the_hold_and_raises_nothing(fault: str) -> None:
    sender = Sender(**{fault: True})
    p = prewarmer(sender, timeout_s=0.2, hold_s=30)
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    p.admit("m", view("r1", "r2"))
    assert p.warming() == {("m", "r2")}
    await asyncio.sleep(0.5)
    assert p.warming() == set()
    assert [i.replica for i in p.admit("m", view("r1", "r2"))] == ["r1", "r2"]
    assert p.counts["failed"] == 1


async def test_the_hold_is_bounded_by_hold_s() -> None:
    sender = Sender(hang=True)
    p = prewarmer(sender, timeout_s=30, hold_s=0.05)
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    assert [i.replica for i in p.admit("m", view("r1", "r2"))] == ["r1"]
    await asyncio.sleep(0.1)
    assert [i.replica for i in p.admit("m", view("r1", "r2"))] == ["r1", "r2"]
    await p.close()


async def test_disabled_neither_records_nor_warms() -> None:
    sender = Sender()
    p = prewarmer(sender, enabled=False)
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    p.admit("m", view("r1", "r2"))
    await asyncio.sleep(0.05)
    assert len(p.table) == 0 and not sender.sent


async def test_one_router_replica_warms_a_new_replica(stack_redis: Any) -> None:
    url = redis_url(stack_redis)
    redis.Redis.from_url(url).flushall()
    senders = [Sender(), Sender()]
    routers = [prewarmer(s, url) for s in senders]
    for p in routers:
        observe_sessions(p, 3)
        p.admit("m", view("r1"))
    for p in routers:
        p.admit("m", view("r1", "r2"))
    for p in routers:
        await settle(p)
    assert sorted(len(s.sent) for s in senders) == [0, 1]
    assert sorted(p.counts["lost_claim"] for p in routers) == [0, 1]
    for p in routers:
        await p.close()


async def test_redis_down_means_no_warm_up(stack_redis: Any) -> None:
    sender = Sender()
    p = prewarmer(sender, "redis://127.0.0.1:1/0")  # nothing listens on port 1
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    p.admit("m", view("r1", "r2"))
    await settle(p)
    assert not sender.sent and p.warming() == set()
    await p.close()


REQUEST = contextvars.ContextVar("request", default="none")


async def test_a_warm_up_runs_in_no_requests_context() -> None:
    """The request that first sees a new replica starts its warm-up; the warm-up's logs,
    spans and Serve request id must not name that request (they once did, and a stranded
    request looked as if it had sent the warm-ups)."""
    seen: list[str] = []

    class Recording(Sender):
        async def __call__(self, model: str, replica: str, work: WorkRequest,
                           hashes: Sequence[int]) -> bool:
            seen.append(REQUEST.get())
            return await super().__call__(model, replica, work, hashes)

    p = prewarmer(Recording())
    observe_sessions(p, 3)
    p.admit("m", view("r1"))
    REQUEST.set("req-1")
    p.admit("m", view("r1", "r2"))
    await settle(p)
    assert seen == ["none"]

