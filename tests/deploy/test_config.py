from pathlib import Path

import pytest
from pydantic import ValidationError

from deploy.config import KvrouteConfig, load_config

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
])
def test_invalid_configs_fail_fast(bad: dict) -> None:
    with pytest.raises(ValidationError):
        KvrouteConfig.model_validate(bad)


def test_local_yaml_validates() -> None:
    cfg = load_config(Path(__file__).parents[2] / "deploy" / "local.yaml")
    assert cfg.models[0].engine == "mlx"
