"""The config's ``index`` section reaches the index in one place (``index_from_config``):
every TTL and the namespace, and ``timeout_s`` as Redis's socket timeout (before, the
router and the worker each copied the settings by hand and both dropped ``timeout_s``;
the worker also dropped ``session_ttl_s``)."""

from __future__ import annotations

import dataclasses

from cache_service import (
    MemoryPrefixIndex,
    ResilientIndex,
    index_from_config,
    settings_of,
)
from deploy.config import IndexConfig

CFG = IndexConfig(redis_url="redis://127.0.0.1:1/0", namespace="ns1", routed_ttl_s=7.0,
                  stored_ttl_s=8.0, liveness_ttl_s=9.0, session_ttl_s=11.0, timeout_s=0.3)


def test_every_index_field_maps_onto_the_settings() -> None:
    settings = settings_of(CFG)
    for f in dataclasses.fields(settings):
        if f.name in IndexConfig.model_fields:
            assert getattr(settings, f.name) == getattr(CFG, f.name), f.name
    assert settings.session_ttl_s == 11.0


def test_redis_gets_the_configured_timeout() -> None:
    index = index_from_config(CFG)
    assert isinstance(index, ResilientIndex)
    kwargs = index.primary.client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.3
    assert isinstance(index_from_config(IndexConfig()), MemoryPrefixIndex)
