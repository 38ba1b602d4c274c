"""``kvroute keys new`` prints a key that works with the digest and env line it prints;
``python -m router.auth`` stays an alias of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cli.main import main
from router.auth.keys import Authenticator, hash_key, parse_env_keys


def _check(out: str, name: str, rpm: int | None, tpm: int | None) -> None:
    key = out.split("\n")[1].strip()
    env = out.rsplit("KVROUTE_API_KEYS=", 1)[1].strip()
    (parsed,) = parse_env_keys(env)
    assert (parsed.name, parsed.requests_per_min, parsed.tokens_per_min) == (name, rpm, tpm)
    assert Authenticator([parsed]).authenticate({"x-api-key": key}) == parsed
    assert f"key_sha256: {hash_key(key)}" in out


def test_keys_new_prints_a_working_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "ci", "--rpm", "60", "--tpm", "5000"]) == 0
    _check(capsys.readouterr().out, "ci", 60, 5000)


def test_keys_new_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new"]) == 0
    out = capsys.readouterr().out
    _check(out, "default", None, None)
    assert "requests_per_min" not in out


@pytest.mark.parametrize("argv", [["keys", "new", "bad name!"], ["keys", "new", "--rpm", "0"],
                                  ["keys"]])
def test_keys_new_refuses_bad_input(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code != 0


def test_python_m_router_auth_is_an_alias() -> None:
    done = subprocess.run([sys.executable, "-m", "router.auth", "ops", "--tpm", "7"],
                          capture_output=True, text=True, timeout=60, check=True,
                          cwd=Path(__file__).parents[3])
    _check(done.stdout, "ops", None, 7)
