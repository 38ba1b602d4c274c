"""API keys: hashing, env parsing, header parsing, 401s, and no secret in logs/errors."""

from __future__ import annotations

import hashlib
import logging

import pytest
from pydantic import ValidationError
from starlette.datastructures import Headers

from router.auth.keys import (
    ApiKeyConfig,
    AuthConfig,
    Authenticator,
    exposure_warning,
    generate_key,
    hash_key,
    load_keys,
    parse_env_keys,
    presented_keys,
    resolve_env,
)
from router.errors import ApiError

ALICE_KEY = "sk-kvr-alice-secret-0001"
BOB_KEY = "sk-kvr-bob-secret-0002"


def _auth(**kw: object) -> Authenticator:
    keys = [ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE_KEY), requests_per_min=5),
            ApiKeyConfig(name="bob", key_sha256=hash_key(BOB_KEY))]
    return Authenticator.from_config(AuthConfig(api_keys=keys, **kw), environ={})


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("abc") == hashlib.sha256(b"abc").hexdigest()
    key, digest = generate_key()
    assert key.startswith("sk-kvr-") and len(key) > 40 and digest == hash_key(key)
    assert not any(c in key for c in ":,= \t")  # usable in the env format as is
    assert generate_key()[0] != key


def test_key_config_validation_never_echoes_the_input() -> None:
    with pytest.raises(ValidationError) as e:
        ApiKeyConfig(name="alice", key_sha256=ALICE_KEY)  # the plain key pasted by mistake
    assert ALICE_KEY not in str(e.value)
    with pytest.raises(ValidationError):
        ApiKeyConfig(name="bad name", key_sha256="0" * 64)
    with pytest.raises(ValidationError):
        ApiKeyConfig(name="a", key_sha256="0" * 64, requests_per_min=0)
    with pytest.raises(ValidationError):
        ApiKeyConfig(name="a", key_sha256="0" * 64, extra=1)  # type: ignore[call-arg]
    cfg = ApiKeyConfig(name="a", key_sha256="AB" * 32)
    assert cfg.key_sha256 == "ab" * 32 and "ab" * 32 not in repr(cfg)


def test_secrets_stay_hidden_inside_an_outer_config() -> None:
    from pydantic import BaseModel, ConfigDict

    class Outer(BaseModel):  # like KvrouteConfig: the OUTERMOST model's setting decides
        model_config = ConfigDict(hide_input_in_errors=True)
        auth: AuthConfig

    with pytest.raises(ValidationError) as e:
        Outer.model_validate({"auth": {"api_keys": [{"name": "a", "key_sha256": ALICE_KEY}]}})
    assert ALICE_KEY not in str(e.value)


def test_duplicate_names_and_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="duplicate API key names"):
        AuthConfig(api_keys=[ApiKeyConfig(name="a", key_sha256="0" * 64),
                             ApiKeyConfig(name="a", key_sha256="1" * 64)])
    with pytest.raises(ValidationError, match="two names"):
        AuthConfig(api_keys=[ApiKeyConfig(name="a", key_sha256="0" * 64),
                             ApiKeyConfig(name="b", key_sha256="0" * 64)])


def test_env_format_hashed_and_plain() -> None:
    digest = "ab" * 32
    keys = parse_env_keys(f" alice:{digest}:60:5000 ,bob:{digest.upper()}::700\n"
                          f"carol={ALICE_KEY}:3 dave={BOB_KEY} ")
    assert [(k.name, k.requests_per_min, k.tokens_per_min) for k in keys] == [
        ("alice", 60, 5000), ("bob", None, 700), ("carol", 3, None), ("dave", None, None)]
    assert keys[1].key_sha256 == digest
    assert keys[2].key_sha256 == hash_key(ALICE_KEY) and keys[3].key_sha256 == hash_key(BOB_KEY)
    assert parse_env_keys("") == [] and parse_env_keys(" , ") == []


@pytest.mark.parametrize("entry", [
    f"alice:{ALICE_KEY}",          # a plain key in the hashed form
    "alice",                       # no key at all
    f"al ice={ALICE_KEY}",         # bad name (split on whitespace: 'al', 'ice=...')
    f"alice={ALICE_KEY}:x",        # bad limit
    f"alice={ALICE_KEY}:1:2:3",    # too many fields
    f"alice={ALICE_KEY}:0",        # limits are >= 1
    f"alice={ALICE_KEY}::1000000000",  # tokens/min <= 1e8 (exact Lua arithmetic)
    "alice=",                      # empty key
])
def test_env_errors_name_the_entry_but_never_the_secret(entry: str) -> None:
    with pytest.raises(ValueError, match="KVROUTE_API_KEYS entry") as e:
        parse_env_keys(entry)
    assert ALICE_KEY not in str(e.value) and hash_key(ALICE_KEY) not in str(e.value)


def test_load_keys_merges_env_and_applies_defaults() -> None:
    cfg = AuthConfig(api_keys=[ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE_KEY),
                                            tokens_per_min=9)],
                     api_keys_env="MY_KEYS", default_requests_per_min=7,
                     default_tokens_per_min=1000)
    keys = load_keys(cfg, {"MY_KEYS": f"bob={BOB_KEY}:2", "KVROUTE_API_KEYS": "x=y"})
    assert [(k.name, k.requests_per_min, k.tokens_per_min) for k in keys] == [
        ("alice", 7, 9), ("bob", 2, 1000)]
    with pytest.raises(ValueError, match="duplicate"):
        load_keys(cfg, {"MY_KEYS": "alice=other-key"})
    no_env = cfg.model_copy(update={"api_keys_env": ""})
    assert len(load_keys(no_env, {"": f"bob={BOB_KEY}"})) == 1


def test_resolve_env_moves_env_keys_into_the_config() -> None:
    cfg = AuthConfig(default_requests_per_min=3)
    resolved = resolve_env(cfg, {"KVROUTE_API_KEYS": f"bob={BOB_KEY}::50"})
    assert resolved.api_keys_env == "" and resolved.default_requests_per_min == 3
    assert [(k.name, k.key_sha256, k.tokens_per_min) for k in resolved.api_keys] == [
        ("bob", hash_key(BOB_KEY), 50)]
    dumped = str(resolved.model_dump())  # what a Serve deployment's args would carry
    assert BOB_KEY not in dumped
    key = Authenticator.from_config(resolved, environ={}).authenticate({"x-api-key": BOB_KEY})
    assert key is not None and key.requests_per_min == 3
    again = AuthConfig(api_keys=resolved.api_keys)
    with pytest.raises(ValidationError, match="duplicate"):
        resolve_env(again, {"KVROUTE_API_KEYS": f"bob={ALICE_KEY}"})


def test_open_when_no_keys() -> None:
    auth = Authenticator.from_config(AuthConfig(), environ={})
    assert not auth.enabled
    assert auth.authenticate({}) is None
    assert auth.authenticate({"authorization": "Bearer whatever"}) is None
    env_auth = Authenticator.from_config(AuthConfig(), environ={"KVROUTE_API_KEYS": "a=b"})
    assert env_auth.enabled and env_auth.names == ["a"]


@pytest.mark.parametrize("headers", [
    {"authorization": f"Bearer {ALICE_KEY}"},
    {"Authorization": f"bearer   {ALICE_KEY} "},
    {"x-api-key": ALICE_KEY},
    {"X-Api-Key": f" {ALICE_KEY}"},
    {"x-api-key": "wrong", "authorization": f"Bearer {ALICE_KEY}"},  # either may hold it
    {"x-api-key": ALICE_KEY, "authorization": "Basic dXNlcjpwYXNz"},
])
def test_accepted_headers(headers: dict[str, str]) -> None:
    auth = _auth()
    key = auth.authenticate(headers)
    assert key is not None and key.name == "alice" and key.requests_per_min == 5
    assert auth.authenticate(Headers(headers=headers)) == key  # Starlette's mapping too


def test_bob_gets_his_own_config() -> None:
    key = _auth(default_tokens_per_min=100).authenticate({"x-api-key": BOB_KEY})
    assert key is not None and key.name == "bob" and key.tokens_per_min == 100


@pytest.mark.parametrize(("headers", "code"), [
    ({}, "missing_api_key"),
    ({"authorization": "Bearer "}, "missing_api_key"),
    ({"authorization": f"Basic {ALICE_KEY}"}, "missing_api_key"),
    ({"authorization": ALICE_KEY}, "missing_api_key"),
    ({"x-api-key": ""}, "missing_api_key"),
    ({"authorization": "Bearer sk-kvr-nope"}, "invalid_api_key"),
    ({"x-api-key": ALICE_KEY + "x"}, "invalid_api_key"),
    ({"x-api-key": hash_key(ALICE_KEY)}, "invalid_api_key"),  # the digest is not the key
])
def test_401s(headers: dict[str, str], code: str) -> None:
    with pytest.raises(ApiError) as e:
        _auth().authenticate(headers)
    assert e.value.status == 401 and e.value.code == code
    assert ALICE_KEY not in e.value.message


def test_presented_keys_order() -> None:
    assert presented_keys({"x-api-key": "a", "authorization": "Bearer b"}) == ["a", "b"]
    assert presented_keys({"authorization": "Token b"}) == []


def test_exposure_warning() -> None:
    open_auth, keyed = Authenticator([]), _auth()
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert exposure_warning(host, open_auth) is None
    assert "no API keys" in (exposure_warning("0.0.0.0", open_auth) or "")
    assert exposure_warning("example.com", open_auth) is not None
    assert exposure_warning("0.0.0.0", keyed) is None


def test_nothing_secret_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    auth = Authenticator.from_config(AuthConfig(), environ={"KVROUTE_API_KEYS": f"c={ALICE_KEY}"})
    for headers in ({"x-api-key": ALICE_KEY}, {"x-api-key": BOB_KEY}, {}):
        try:
            auth.authenticate(headers)
        except ApiError:
            pass
    for secret in (ALICE_KEY, BOB_KEY, hash_key(ALICE_KEY)):
        assert secret not in caplog.text
