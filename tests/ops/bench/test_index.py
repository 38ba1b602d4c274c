"""``ops.bench.index`` (``kvroute bench index``): a quick run against a real redis-server.

Checks the report's shape and that the bench leaves the server as it found it; no timing
assertions (the numbers depend on the machine).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pytest_redis import factories
from pytest_redis.executor import RedisExecutor

from ops.bench import index as bench_index
from ops.bench.index import add_arguments, run

bench_redis = factories.redis_proc(host="127.0.0.1", port=None)

REPORT_KEYS = {
    "lookup_p50_s",
    "lookup_p99_s",
    "ping_p50_s",
    "ping_p99_s",
    "bytes_per_block",
    "replicas",
    "blocks",
    "prompt_tokens",
    "goal_p50_ok",
    "goal_p99_ok",
    "goal_ok",
    "classes",
    "mismatches",
    "namespace",
}


@pytest.fixture
def url(bench_redis: RedisExecutor) -> str:
    return f"redis://{bench_redis.host}:{bench_redis.port}/0"


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(url)
    conn.set("user:key", "keep")  # someone else's data: must survive the bench
    yield conn
    conn.close()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def quick_args(url: str, out: Path) -> argparse.Namespace:
    return parse(
        *("--redis-url", url, "--replicas", "4", "--blocks", "300"),
        *("--prompt-tokens", "2048", "--lookups", "60", "--out", str(out)),
    )


def test_defaults() -> None:
    args = parse("--redis-url", "redis://127.0.0.1:1/0")
    assert (args.replicas, args.blocks, args.prompt_tokens) == (16, 100_000, 32_768)
    assert (args.block_size, args.lookups, args.out) == (64, 2000, None)
    with pytest.raises(SystemExit):
        parse("--replicas", "4")  # --redis-url is required


def test_quick_run_writes_report_and_cleans_up(
    url: str, client: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    assert run(quick_args(url, out)) in (0, 1)  # 1 = goal missed on this machine
    report = json.loads(out.read_text())
    assert REPORT_KEYS <= set(report)
    assert (report["replicas"], report["blocks"], report["prompt_tokens"]) == (4, 300, 2048)
    assert report["entries"] >= 300
    assert report["mismatches"] == 0  # every stored prompt matched the depths written
    assert report["bytes_per_block"] > 0
    assert 0 < report["ping_p50_s"] <= report["ping_p99_s"]
    assert 0 < report["lookup_p50_s"] <= report["lookup_p99_s"]
    assert report["goal_ok"] == (report["goal_p50_ok"] and report["goal_p99_ok"])
    assert {"miss", "typical", "heavy", "all"} == set(report["classes"])
    assert sum(c["count"] for c in report["classes"].values() if c["weight"]) == 60
    assert not list(client.scan_iter(match="{" + report["namespace"] + "}*"))
    assert client.get("user:key") == b"keep"
    table = capsys.readouterr().out
    assert "PING" in table and "lookup (mix)" in table and "goal p99" in table


def test_keys_removed_when_the_bench_fails(
    url: str, client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    async def broken(index: bench_index.RedisPrefixIndex, plan: object) -> None:
        seen.append(index.prefix)
        assert await index.client.exists(index.key("p", bench_index.MODEL))  # filled
        raise RuntimeError("boom")

    monkeypatch.setattr(bench_index, "time_lookups", broken)
    with pytest.raises(RuntimeError, match="boom"):
        run(quick_args(url, tmp_path / "never.json"))
    assert seen and not list(client.scan_iter(match=seen[0] + "*"))
    assert client.get("user:key") == b"keep"
    assert not (tmp_path / "never.json").exists()
