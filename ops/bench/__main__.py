"""``python -m ops.bench ARGS`` runs ``kvroute bench ARGS``."""

from __future__ import annotations

import argparse
import sys

from ops.bench.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvroute")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
