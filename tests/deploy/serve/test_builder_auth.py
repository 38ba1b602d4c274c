"""API keys are resolved once, in the app builder, and reach every router
replica as digests in its deployment args; ``auth.required`` refuses an open non-loopback
bind. Built offline with Serve's own ``build_app`` (no Ray)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from deploy.serve.builder import ROUTER_DEPLOYMENT, app_builder
from router.auth.keys import hash_key


def _args(host: str, **auth: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "engine": "sim", "model_path": "x"}],
            "server": {"host": host, "port": 8000}, "auth": auth}


def _router_config(args: dict[str, Any]) -> dict[str, Any]:
    from ray.serve._private.build_app import build_app

    built = build_app(app_builder(args), name="kvroute")
    router = next(d for d in built.deployments if d.name == ROUTER_DEPLOYMENT)
    config = router.init_args[0]
    assert isinstance(config, dict)
    return config


def test_router_replicas_get_env_keys_as_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = f"sk-kvr-{uuid.uuid4().hex}"
    monkeypatch.setenv("KVROUTE_API_KEYS", f"carol={plain}::5000")
    auth = _router_config(_args("0.0.0.0"))["auth"]
    assert auth["api_keys_env"] == ""  # no replica reads its own environment
    assert [(k["name"], k["key_sha256"], k["tokens_per_min"]) for k in auth["api_keys"]] == [
        ("carol", hash_key(plain), 5000)]
    assert plain not in repr(auth)


def test_required_refuses_an_open_non_loopback_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVROUTE_API_KEYS", raising=False)
    for host in ("0.0.0.0", "10.1.2.3", "::", "router.example"):
        with pytest.raises(ValueError, match="auth.required"):
            app_builder(_args(host))
    for host in ("127.0.0.1", "localhost", "::1"):
        assert _router_config(_args(host))["auth"]["api_keys"] == []
    assert _router_config(_args("0.0.0.0", required=False))["auth"]["api_keys"] == []
