"""``kvroute bench router --stall N``: rounds alternate the ingresses, each round's ratio is
its own loaded p99 over its own unloaded p99, and the median is per ingress."""

from __future__ import annotations

from deploy.cli.main import build_parser
from ops.bench.router import stall_rounds


def test_rounds_alternate_and_the_median_is_per_ingress() -> None:
    loaded = {("proxy", 0): 0.030, ("direct", 0): 0.044, ("proxy", 1): 0.036,
              ("direct", 1): 0.033, ("proxy", 2): 0.090, ("direct", 2): 0.030}
    calls: list[tuple[str, int]] = []

    def fake(ingress: str, round_: int) -> dict[str, float]:
        calls.append((ingress, round_))
        return {"unloaded_p99_s": 0.020, "unloaded_max_s": 0.021,
                "cold_long_prompt_p99_s": loaded[ingress, round_],
                "cold_long_prompt_max_s": loaded[ingress, round_] + 0.001}

    got = stall_rounds.stall_rounds(fake, 3, ["proxy", "direct"], show=False)
    assert calls == [("proxy", 0), ("direct", 0), ("proxy", 1), ("direct", 1),
                     ("proxy", 2), ("direct", 2)]
    rounds = got["stall_rounds"]["rounds"]
    assert [round(r["ratio"], 2) for r in rounds] == [1.5, 2.2, 1.8, 1.65, 4.5, 1.5]
    assert {k: round(v, 2) for k, v in got["stall_rounds"]["median_ratio"].items()} == {
        "proxy": 1.8, "direct": 1.65}
    text = stall_rounds.markdown(got)
    assert "| 3 | proxy | 20.0 | 90.0 | 91.0 | 4.50 |" in text
    assert "median ratio, direct: 1.65x" in text


def test_the_router_bench_takes_the_stall_flags() -> None:
    args = build_parser().parse_args(["bench", "router", "--stall", "4", "--stall-ingress",
                                      "proxy,direct", "--stall-length", "64000"])
    assert (args.stall, args.stall_ingress, args.stall_length) == (4, "proxy,direct", 64000)
    assert build_parser().parse_args(["bench", "router"]).stall is None
