"""Secrets out of Serve's config: the Redis URL, password included, reaches router and
worker replicas through an environment variable they read themselves
(``index.redis_url_env``), never through Serve's config. Real Ray Serve on loopback, one
sim replica, a password-protected redis-server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pytest_redis import factories

from deploy.config import IndexConfig
from deploy.serve.builder import app_builder
from tests.conftest import SECURE_REDIS_PASSWORD, SECURE_REDIS_PORT
from tests.stacks import deployed, sim_model, stack_config

MODEL = "sim-url-env"
VAR = "KVROUTE_TEST_REDIS_URL"
secure_redis = factories.redis_proc(host="127.0.0.1", port=SECURE_REDIS_PORT,
                                    password=SECURE_REDIS_PASSWORD)


def _args() -> dict[str, Any]:
    return {"models": [{"name": MODEL, "engine": "sim", "model_path": "x"}],
            "index": {"redis_url_env": VAR}}


def test_no_serve_arg_holds_the_url() -> None:
    from ray.serve._private.build_app import build_app

    built = build_app(app_builder(_args()), name="kvroute")
    for d in built.deployments:
        assert SECURE_REDIS_PASSWORD not in repr((d.init_args, d.init_kwargs)), d.name


def test_a_missing_variable_fails_the_replica_not_silently() -> None:
    with pytest.raises(ValueError, match="KVROUTE_TEST_MISSING"):
        IndexConfig(redis_url_env="KVROUTE_TEST_MISSING").resolved({})
    assert IndexConfig(redis_url_env=VAR).resolved().redis_url == os.environ[VAR]


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int,
          secure_redis: Any) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir)
    cfg = stack_config(serve_port, model, index=IndexConfig(redis_url_env=VAR))
    with deployed(cfg) as url:
        yield url


@pytest.mark.slow
def test_replicas_share_the_index_through_the_env_url(stack: str) -> None:
    prompt = "the same long system prompt " * 60
    body = {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": prompt}]}
    r = httpx.post(f"{stack}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    client = redis.Redis.from_url(os.environ[VAR])
    assert any(client.scan_iter("{kvroute}:*")), "the index never reached Redis"
