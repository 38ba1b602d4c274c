"""The router deployment bounds the proxy's queue and
every Serve config bounds a request end to end. Built offline with Serve's own
``build_app`` (no Ray); the manifests are read as shipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.config import KvrouteConfig, ServerConfig
from deploy.serve.builder import ROUTER_DEPLOYMENT, app_builder
from deploy.serve.runtime import http_options

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
ARGS = {"models": [{"name": "m", "engine": "sim", "model_path": "x"}]}


def test_router_deployment_has_a_bounded_queue() -> None:
    from ray.serve._private.build_app import build_app

    built = build_app(app_builder({**ARGS, "router": {"max_queued_requests": 77}}),
                      name="kvroute")
    router = next(d for d in built.deployments if d.name == ROUTER_DEPLOYMENT)
    assert router.max_queued_requests == 77  # Serve's default (-1) queues without bound
    default = build_app(app_builder(ARGS), name="kvroute")
    router = next(d for d in default.deployments if d.name == ROUTER_DEPLOYMENT)
    assert 0 < router.max_queued_requests <= 1024


def test_kvroute_up_sets_serves_request_timeout() -> None:
    cfg = KvrouteConfig.model_validate({**ARGS, "server": {"request_timeout_s": 90}})
    assert http_options(cfg)["request_timeout_s"] == 90
    assert ServerConfig().request_timeout_s is not None


@pytest.mark.parametrize("path", ["local.yaml", "cluster.yaml", "kuberay/rayservice.yaml"])
def test_serve_configs_bound_requests_end_to_end(path: str) -> None:
    doc = next(d for d in yaml.safe_load_all((DEPLOY / path).read_text())
               if d and ("http_options" in d or d.get("kind") == "RayService"))
    serve_config = doc if "http_options" in doc else yaml.safe_load(
        doc["spec"]["serveConfigV2"])
    timeout = serve_config["http_options"].get("request_timeout_s")
    assert timeout is not None and timeout >= 600, serve_config["http_options"]
