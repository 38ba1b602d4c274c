"""The metrics hub is pushed to once a second by every router replica: its deployment has
Serve's access log off, so no push shows up as an access line; the other deployments keep
theirs. Built offline with Serve's own ``build_app`` (no Ray)."""

from __future__ import annotations

from typing import Any

from deploy.serve.builder import METRICS_DEPLOYMENT, ROUTER_DEPLOYMENT, app_builder


def _logging(name: str) -> Any:
    from ray.serve._private.build_app import build_app

    args = {"models": [{"name": "m", "engine": "sim", "model_path": "x"}]}
    built = build_app(app_builder(args), name="kvroute")
    (deployment,) = [d for d in built.deployments if d.name == name]
    return deployment.logging_config


def test_metrics_hub_has_no_access_log() -> None:
    assert _logging(METRICS_DEPLOYMENT)["enable_access_log"] is False


def test_router_and_workers_keep_their_access_log() -> None:
    for name in (ROUTER_DEPLOYMENT, "m"):
        config = _logging(name)
        assert config is None or config["enable_access_log"] is True
