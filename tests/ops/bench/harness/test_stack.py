"""The benchmarks' stack launcher (``ops.bench.harness.stack``), on a recording stand-in for
``deploy.serve.runtime``: Ray starts, the config deploys, the URL is handed over once healthy,
and the app is deleted and Ray shut down after, also when the bench or the health wait fails."""

from __future__ import annotations

from typing import Any

import pytest
from ray import serve

from deploy.serve import runtime
from ops.bench.harness import stack


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(runtime, "init_ray", lambda host, num_cpus=None: seen.append(
        f"init {host} {num_cpus}"))
    monkeypatch.setattr(runtime, "deploy", lambda cfg: seen.append(f"deploy {cfg}") or "URL")
    monkeypatch.setattr(runtime, "wait_healthy", lambda url, timeout_s: seen.append(
        f"healthy {url} {timeout_s:g}"))
    monkeypatch.setattr(runtime, "shutdown", lambda: seen.append("shutdown"))
    monkeypatch.setattr(serve, "delete", lambda app: seen.append(f"delete {app}"))
    return seen


def test_a_stacks_life_in_order(calls: list[str]) -> None:
    with stack.stack("cfg", num_cpus=3) as url:  # type: ignore[arg-type]
        calls.append(f"bench {url}")
    assert calls == ["init 127.0.0.1 3", "deploy cfg", "healthy URL 300", "bench URL",
                     "delete kvroute", "shutdown"]


def test_cleanup_when_the_bench_fails(calls: list[str]) -> None:
    with pytest.raises(RuntimeError), stack.stack("cfg"):  # type: ignore[arg-type]
        raise RuntimeError("the bench failed")
    assert calls[-2:] == ["delete kvroute", "shutdown"]


def test_cleanup_when_the_stack_never_gets_healthy(calls: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def never(url: str, timeout_s: float) -> None:
        raise TimeoutError(url)

    monkeypatch.setattr(runtime, "wait_healthy", never)
    entered: list[Any] = []
    with pytest.raises(TimeoutError), stack.stack("cfg"):  # type: ignore[arg-type]
        entered.append(1)
    assert entered == [] and calls[-2:] == ["delete kvroute", "shutdown"]


def test_several_deploys_on_one_ray(calls: list[str]) -> None:
    with stack.local_ray(num_cpus=6):
        for cfg in ("a", "b"):
            with stack.deployed(cfg, timeout_s=5) as url:  # type: ignore[arg-type]
                calls.append(f"bench {url}")
    assert calls == ["init 127.0.0.1 6", "deploy a", "healthy URL 5", "bench URL",
                     "delete kvroute", "deploy b", "healthy URL 5", "bench URL",
                     "delete kvroute", "shutdown"]


def test_a_failed_start_is_retried(calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []

    def flaky(host: str, num_cpus: int | None = None) -> None:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("raylet missed its registration window")

    monkeypatch.setattr(runtime, "init_ray", flaky)
    stack.start_ray(4, tries=3, retry_wait_s=0)
    assert len(tries) == 3
    tries.clear()
    with pytest.raises(RuntimeError):
        stack.start_ray(4, tries=2, retry_wait_s=0)
