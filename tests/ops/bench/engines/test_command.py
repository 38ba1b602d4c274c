"""``kvroute bench engines`` (``ops.bench.engines.command``) is a bench subcommand:
its options parse through the kvroute CLI and its table has one row per engine. The
benchmark itself deploys engines on Ray; it is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

from deploy.cli.main import build_parser
from ops.bench.engines import command as bench_engines
from ops.bench.engines.measure import table


def test_bench_engines_is_a_kvroute_subcommand() -> None:
    args = build_parser().parse_args(
        ["bench", "engines", "--engine", "sim", "--replicas", "3", "--out", "e.json"])
    assert args.func is bench_engines.run
    args = bench_engines.with_defaults(args)
    assert (args.engine, args.replicas, args.out, args.prompt_words) == (["sim"], 3, "e.json", 600)


def test_quantize_takes_the_short_workload_unless_told() -> None:
    argv = ["bench", "engines", "--engine", "mlx", "--quantize", "16", "4"]
    args = bench_engines.with_defaults(build_parser().parse_args(argv))
    assert (args.quantize, args.prompt_words, args.max_tokens) == ([16, 4], 60, 16)
    args = bench_engines.with_defaults(build_parser().parse_args([*argv, "--max-tokens", "8"]))
    assert args.max_tokens == 8


def test_other_bench_modes_still_parse() -> None:
    from ops.bench.compare import command

    args = build_parser().parse_args(["bench", "compare", "--replicas", "2"])
    assert args.func is command.run and args.replicas == 2


def test_table_has_one_row_per_engine() -> None:
    row = {"startup_s": 9.0, "ttft_cold_s": 0.5, "ttft_warm_s": 0.05, "cold_over_warm": 10.0,
           "tokens_per_s": 123.4}
    lines = table({"sim": row, "mlx": row}).splitlines()
    assert lines[0].split()[:2] == ["engine", "startup"]
    assert [line.split()[0] for line in lines[1:]] == ["sim", "mlx"]
    assert lines[1].split()[-2:] == ["10.0", "123.4"]
