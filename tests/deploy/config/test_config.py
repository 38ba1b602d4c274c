from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import router.routing.pipeline  # noqa: F401  # the plugin registry checks pipelines once loaded
from deploy.config import KvrouteConfig, ModelConfig, load_config

BASE = {"models": [{"name": "m", "model_path": "/x"}]}


def test_defaults_bind_loopback_and_use_memory_index() -> None:
    cfg = KvrouteConfig.model_validate(BASE)
    assert cfg.server.host == "127.0.0.1"
    assert cfg.index.redis_url is None


@pytest.mark.parametrize("bad", [
    {**BASE, "surprise": 1},
    {"models": [{"name": "m", "model_path": "/x", "engnie": "mlx"}]},
    {"models": [{"name": "m", "model_path": "/x", "engine": "tgi"}]},
    {"models": [{"name": "a b", "model_path": "/x"}]},
    {"models": [{"name": "m", "model_path": "/x"}, {"name": "m", "model_path": "/y"}]},
    {**BASE, "router": {"policy": "no-such-policy"}},
    {**BASE, "router": {"pipeline": {"scorers": [{"name": "no-such-scorer"}]}}},
    {**BASE, "router": {"pipeline": {"scorers": [{"name": "prefix-cache-scorer", "weight": -2}]}}},
    {**BASE, "router": {"pipeline": {"picker": {"name": "prefix-cache-scorer"}}}},
    {**BASE, "router": {"pipeline": {"scorers": [{"name": "prefix-cache-scorer",
                                                   "params": {"unknown": 1}}]}}},
    {"models": [{"name": "m", "model_path": "/x",
                 "autoscaling": {"min_replicas": 3, "max_replicas": 2}}]},
    {"models": []},
    {**BASE, "router": {"worker_transport": "http"}},
    {**BASE, "server": {"ingress": "direct", "port": 0}},  # each replica would pick its own
    {**BASE, "server": {"ingress": "direct", "port": 8123},  # no listener to wake one
     "router": {"autoscaling": {"min_replicas": 0, "max_replicas": 2}}},
    {**BASE, "server": {"ingress": "haproxy"}},
])
def test_invalid_configs_fail_fast(bad: dict) -> None:
    with pytest.raises(ValidationError):
        KvrouteConfig.model_validate(bad)


def test_direct_ingress_with_a_fixed_port_validates() -> None:
    cfg = KvrouteConfig.model_validate({**BASE, "server": {"ingress": "direct", "port": 8123}})
    assert cfg.server.ingress == "direct" and KvrouteConfig.model_validate(BASE).server.ingress \
        == "auto"


def test_direct_ingress_takes_router_autoscaling() -> None:
    cfg = KvrouteConfig.model_validate({**BASE, "server": {"ingress": "direct", "port": 8123},
                                        "router": {"autoscaling": {"max_replicas": 2}}})
    assert cfg.router.autoscaling is not None and cfg.router.autoscaling.max_replicas == 2


def test_local_yaml_validates() -> None:
    cfg = load_config(Path(__file__).parents[3] / "deploy" / "local.yaml")
    assert cfg.models[0].engine == "mlx"


@pytest.mark.parametrize(("engine", "kwargs", "error"), [
    ("mlx", {"cache_byte": 1 << 30}, "cache_byte"),  # a typo: before, silently the default
    ("mlx", {"max_batch": 0}, "max_batch"),
    ("sim", {"tpot": 0.01}, "tpot"),
    ("vllm", {"enable_prefix_caching": False}, "enable_prefix_caching"),
])
def test_engine_kwargs_are_checked_per_engine_at_load(engine: str, kwargs: dict[str, Any],
                                                      error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        ModelConfig(name="m", engine=engine, model_path="/x", engine_kwargs=kwargs)
    ok = {"mlx": {"cache_bytes": 1 << 30}, "sim": {"tpot_s": 0.01, "script_path": "/s.json"},
          "vllm": {"gpu_memory_utilization": 0.5}}[engine]
    ModelConfig(name="m", engine=engine, model_path="/x", engine_kwargs=ok)


def test_vllm_kv_events_only_with_the_sim_engine() -> None:
    base = {"name": "m", "model_path": "/x"}
    cfg = ModelConfig.model_validate({**base, "engine": "sim", "vllm_kv_events": {}})
    assert cfg.vllm_kv_events is not None and cfg.vllm_kv_events.block_size == 16
    with pytest.raises(ValidationError, match="only available with the sim engine"):
        ModelConfig.model_validate({**base, "engine": "mlx", "vllm_kv_events": {}})
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({**base, "engine": "sim", "vllm_kv_events": {"bs": 16}})
