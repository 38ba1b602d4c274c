"""The tokenize pool: one per process, bounded, and the switch interval it sets."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator

import pytest

from router.prompt import setup as tokenize_setup
from router.prompt.setup import PromptCacheConfig, off_loop, with_env


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(tokenize_setup, "_POOL", None)
    old = sys.getswitchinterval()
    yield
    pool = tokenize_setup._POOL
    if pool is not None:
        pool.shutdown()
    sys.setswitchinterval(old)


def test_the_pool_runs_off_the_loop_and_sets_the_switch_interval(fresh_pool: None) -> None:
    config = PromptCacheConfig(threads=1, switch_interval_ms=2.0)
    loop_thread = threading.get_ident()
    where = asyncio.run(off_loop(config, threading.get_ident))
    assert where != loop_thread
    assert sys.getswitchinterval() == pytest.approx(0.002)
    assert tokenize_setup.tokenize_pool(config)._max_workers == 1


def test_without_offload_it_runs_inline_and_leaves_the_interval(fresh_pool: None) -> None:
    before = sys.getswitchinterval()
    config = PromptCacheConfig(offload=False, switch_interval_ms=3.0)
    assert asyncio.run(off_loop(config, threading.get_ident)) == threading.get_ident()
    assert sys.getswitchinterval() == before and tokenize_setup._POOL is None


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVROUTE_TOKENIZE_OFFLOAD", "0")
    monkeypatch.setenv("KVROUTE_TOKENIZE_THREADS", "3")
    got = with_env(PromptCacheConfig())
    assert (got.offload, got.threads, got.switch_interval_ms) == (False, 3, 1.0)
    monkeypatch.setenv("KVROUTE_SWITCH_INTERVAL_MS", "5")
    assert with_env(PromptCacheConfig()).switch_interval_ms == 5.0
