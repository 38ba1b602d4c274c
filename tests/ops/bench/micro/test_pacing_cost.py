"""``kvroute bench micro pacing-cost``: the streams it reads carry every token, paced
streams in fewer chunks, and ``--impl`` measures the module it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.bench.__main__ import main as bench_main
from ops.bench.micro import pacing_cost
from workers.transport import stream_pacing


def test_paced_streams_carry_every_token_in_fewer_chunks() -> None:
    us, chunks = pacing_cost.measure(stream_pacing.paced, 0.0, tokens=20)
    assert us > 0 and chunks == 20
    _, paced = pacing_cost.measure(stream_pacing.paced, 0.02, tokens=20)
    assert paced < 15  # tokens 10 ms apart, a chunk per 20 ms


def test_impl_measures_the_module_it_names(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    unpaced = tmp_path / "unpaced.py"
    unpaced.write_text("def paced(items, interval_s):\n    return items\n")
    assert bench_main(["micro", "pacing-cost", "--impl", str(unpaced), "--rounds", "1",
                       "--tokens", "10"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 ")]
    assert [row.split("|")[4].strip() for row in rows] == ["10", "10"]  # never merged
