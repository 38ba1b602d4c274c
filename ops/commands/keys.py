"""``kvroute keys new [NAME] [--rpm N] [--tpm N]``: a new API key and the lines that configure it.

    kvroute keys new alice --rpm 60 --tpm 200000

Prints a random key (give it to the client; it is stored nowhere), its SHA-256 digest as a
YAML ``auth.api_keys`` entry, and the same key as a ``KVROUTE_API_KEYS`` entry (docs/auth.md).
``python -m router.auth`` is an alias kept for existing scripts.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from deploy.config.auth import NAME_PATTERN
from router.auth.keys import generate_key


def _new_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default="default", help="key name (not secret)")
    p.add_argument("--rpm", type=int, default=None, help="requests per minute")
    p.add_argument("--tpm", type=int, default=None, help="tokens per minute")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``kvroute keys`` with its one action, ``new``."""
    p = subparsers.add_parser("keys", help="API keys: `keys new NAME` prints a new one",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="keys_action", required=True, metavar="{new}")
    new = actions.add_parser("new", help="print a new key, its digest and config lines",
                             description=render.__doc__)
    _new_args(new)
    new.set_defaults(func=cmd_new)


def render(name: str, rpm: int | None, tpm: int | None, key: str, digest: str) -> str:
    """Print a new key, its digest, and the YAML / env lines that configure it."""
    limits = "".join(f"\n    {f}: {v}" for f, v in
                     (("requests_per_min", rpm), ("tokens_per_min", tpm)) if v)
    env = ":".join([name, digest, str(rpm or ""), str(tpm or "")]).rstrip(":")
    return (f"key (give it to the client; it is not stored anywhere):\n  {key}\n\n"
            f"config (YAML):\nauth:\n  api_keys:\n  - name: {name}\n"
            f"    key_sha256: {digest}{limits}\n\n"
            f"or env:\n  KVROUTE_API_KEYS={env}\n")


def cmd_new(args: argparse.Namespace) -> int:
    if not re.match(NAME_PATTERN, args.name):
        raise SystemExit(f"kvroute keys new: name must match {NAME_PATTERN}")
    for flag in ("rpm", "tpm"):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise SystemExit(f"kvroute keys new: --{flag} must be a positive integer")
    key, digest = generate_key()
    sys.stdout.write(render(args.name, args.rpm, args.tpm, key, digest))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m router.auth ARGS`` (and ``python -m ops.commands.keys ARGS``) = ``kvroute keys
    new``."""
    p = argparse.ArgumentParser(prog="kvroute keys new", description=render.__doc__)
    _new_args(p)
    return cmd_new(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
