"""``server.ingress: auto`` resolved where kvroute starts Serve itself
(``deploy.serve.runtime``)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.config import KvrouteConfig
from deploy.serve.runtime import http_options, resolve_ingress

BASE: dict[str, Any] = {"models": [{"name": "m", "model_path": "/x"}]}


def _cfg(server: dict[str, Any], **sections: Any) -> KvrouteConfig:
    return KvrouteConfig.model_validate({**BASE, "server": server, **sections})


def test_auto_is_the_default_and_is_direct_on_a_fixed_port_with_no_proxy_running() -> None:
    cfg = KvrouteConfig.model_validate(BASE)
    assert cfg.server.ingress == "auto"
    resolved = resolve_ingress(cfg, proxy_port=None)
    assert resolved.server.ingress == "direct" and resolved.server.port == cfg.server.port
    assert http_options(resolved)["port"] != cfg.server.port  # the proxy moves off it


@pytest.mark.parametrize(("server", "sections", "proxy_port"), [
    ({"port": 8123}, {}, 8123),  # a Serve started by someone else holds the port
    ({"port": 0}, {}, None),  # every replica would pick its own
    ({"port": 8123}, {"router": {"autoscaling": {"min_replicas": 0, "max_replicas": 2}}}, None),
])
def test_auto_stays_behind_the_proxy_where_direct_cannot_work(
        server: dict[str, Any], sections: dict[str, Any], proxy_port: int | None) -> None:
    resolved = resolve_ingress(_cfg(server, **sections), proxy_port)
    assert resolved.server.ingress == "proxy"
    assert http_options(resolved)["port"] == server["port"]


@pytest.mark.parametrize("ingress", ["proxy", "direct"])
def test_an_explicit_ingress_is_kept(ingress: str) -> None:
    cfg = _cfg({"port": 8123, "ingress": ingress})
    assert resolve_ingress(cfg, proxy_port=8123 if ingress == "direct" else None) is cfg


def test_resolving_keeps_every_other_field() -> None:
    cfg = _cfg({"port": 8123, "max_body_bytes": 4096}, router={"replicas": 3})
    resolved = resolve_ingress(cfg, proxy_port=None)
    assert resolved.model_dump(exclude={"server": {"ingress"}}) == cfg.model_dump(
        exclude={"server": {"ingress"}})
