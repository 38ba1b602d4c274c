"""``kvroute bench micro index-cost``: it measures the calls it names on the index it
builds (four replicas holding 1/1 .. 1/4 of the prompt)."""

from __future__ import annotations

import asyncio

import pytest

from cache_service import MemoryPrefixIndex
from ops.bench.__main__ import main as bench_main
from ops.bench.micro import index_cost


def test_the_index_it_measures_holds_the_runs_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, int]] = []
    lookup = MemoryPrefixIndex.lookup

    async def spy(self: MemoryPrefixIndex, hashes_by_model: dict[str, list[int]]) -> object:
        out = await lookup(self, hashes_by_model)
        seen.append(dict(out["m"]))
        return out

    monkeypatch.setattr(MemoryPrefixIndex, "lookup", spy)
    lookup_ms, write_ms = asyncio.run(index_cost.measure(120))
    assert seen[0] == {"r0": 120, "r1": 60, "r2": 40, "r3": 30}
    assert lookup_ms > 0 and write_ms > 0


def test_it_prints_a_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["micro", "index-cost", "50", "80"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split("|")[1].strip() for r in rows[2:]] == ["50", "80"]
