"""Sentinel URLs (``cache_service.redis_conn``): what they name, and what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cache_service.redis_conn import parse_sentinel
from deploy.config import IndexConfig


def test_a_sentinel_url_names_the_sentinels_the_primary_and_the_db() -> None:
    t = parse_sentinel("redis+sentinel://:p%40ss@127.0.0.1:26379,[::1]:26380/kvroute/2")
    assert t.sentinels == (("127.0.0.1", 26379), ("::1", 26380))
    assert (t.master, t.db, t.password) == ("kvroute", 2, "p@ss")
    assert parse_sentinel("redis+sentinel://h:1/m").db == 0


@pytest.mark.parametrize("url", ["redis+sentinel://h:1", "redis+sentinel://h/m",
                                 "redis+sentinel:///m", "redis+sentinel://h:1/m/x",
                                 "redis://h:1/0"])
def test_a_malformed_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_sentinel(url)


def test_the_index_configs_sentinel_section_becomes_the_url_every_store_opens() -> None:
    cfg = IndexConfig.model_validate({"redis_sentinel": {
        "sentinels": ["127.0.0.1:26379", "[::1]:26380"], "master": "kvroute", "db": 1}})
    assert cfg.redis_url is None  # until each process resolves it
    url = cfg.resolved().redis_url
    assert url == "redis+sentinel://127.0.0.1:26379,[::1]:26380/kvroute/1"
    t = parse_sentinel(url)
    assert (t.sentinels, t.master, t.db) == ((("127.0.0.1", 26379), ("::1", 26380)), "kvroute", 1)


@pytest.mark.parametrize("section", [
    {"redis_sentinel": {"sentinels": ["nohost"], "master": "m"}},
    {"redis_sentinel": {"sentinels": [], "master": "m"}},
    {"redis_sentinel": {"sentinels": ["h:1"], "master": "m"}, "redis_url": "redis://h:1/0"},
])
def test_a_bad_sentinel_section_is_a_config_error(section: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        IndexConfig.model_validate(section)
