"""Shared fixtures: the tiny model, a loopback Ray, free ports."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback only


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ops.models.tiny_model import ensure_model

    cache = Path(os.environ.get("KVROUTE_CACHE_DIR", tmp_path_factory.mktemp("kvroute-cache")))
    return ensure_model(cache)


@pytest.fixture(scope="session")
def serve_port() -> int:
    """The stacks' port: their router replicas listen on it (``server.ingress`` auto, so
    direct). Serve's proxy, kept from the first ``serve.start`` for the whole session, is on
    another free port (``tests.stacks.proxy_port``)."""
    return free_port()


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    from deploy.serve import runtime

    runtime.init_ray("127.0.0.1", num_cpus=8)
    yield
    runtime.shutdown()


def _stack_name(item: pytest.Item | None) -> str | None:
    mark = None if item is None else item.get_closest_marker("stack")
    return None if mark is None else str(mark.args[0])


@pytest.hookimpl(trylast=True)  # after -m's deselection: only the selected tests count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that never start the session Ray run first (``kvroute up`` starts a Ray of
    its own, better alone). Then the stack modules, those marked ``stack(name)`` moved up
    behind the first module of that name, so the pool (``tests.stacks.deployed``) starts
    their shared app once; a module's name is its first selected test's (a parameter may
    carry its own, as the vLLM cases of test_engines and test_engine_surface do). Otherwise
    the collected order stays."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups: dict[str, list[str]] = {}  # a group's name (its stack, or its path) -> its modules
    for path, group in modules.items():
        groups.setdefault(_stack_name(group[0]) or path, []).append(path)

    def uses_ray(paths: list[str]) -> bool:
        return any("ray_local" in getattr(item, "fixturenames", ())
                   for path in paths for item in modules[path])

    ordered = sorted(groups.values(), key=uses_ray)  # stable: False first
    items[:] = [item for paths in ordered for path in paths for item in modules[path]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test, its pooled app goes unless the next module shares it."""
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.module is not item.module:
            name = _stack_name(item)
            if name is None or name != _stack_name(nextitem):
                stacks = sys.modules.get("tests.stacks")  # imported by every stack module
                if stacks is not None:
                    stacks.release()


# A password-protected Redis for index.redis_url_env: its URL must be in
# the environment before Ray starts, as it would be in every pod, since Serve replicas read
# it from their own environment (never from Serve's config).
SECURE_REDIS_PASSWORD = "kvroute-test-secret-7f3a"
SECURE_REDIS_PORT = free_port()
os.environ["KVROUTE_TEST_REDIS_URL"] = (
    f"redis://:{SECURE_REDIS_PASSWORD}@127.0.0.1:{SECURE_REDIS_PORT}/0")

from pytest_redis import factories  # noqa: E402

# A real redis-server on loopback and a random port, for the end-to-end stacks.
stack_redis = factories.redis_proc(host="127.0.0.1", port=None)


# The full default run (1,150 tests: Ray, mlx, ZMQ, tokenizers' Rust threads in one
# process) once segfaulted in interpreter teardown, after its summary, and turned a
# finished run into make's failure. Nothing is checked after the summary, so the process
# leaves with pytest's own exit status instead of tearing its extensions down.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _EXIT_STATUS and os.environ.get("KVROUTE_TEST_TEARDOWN") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
