"""Tenant isolation of the prefix cache, end to end on
real Serve with a sim replica and API keys: the review's cross-tenant oracle. Alice's system
prompt holds a secret; bob, with his own key, guesses it. Without isolation the right guess
shows more predicted (and engine-measured) cached tokens than a wrong one; with
``index.tenant_isolation`` both are the same, and a tenant still reuses its own prefix."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig
from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-tenants"
ALICE, BOB = f"sk-kvr-iso-alice-{uuid.uuid4().hex}", f"sk-kvr-iso-bob-{uuid.uuid4().hex}"
BOILER = " ".join(f"clause {i} of the standing instructions applies." for i in range(40))
TAIL = " ".join(f"rule {i}: answer briefly and politely." for i in range(20))


def _system(secret: str) -> str:
    return f"{BOILER} The acquisition target is {secret}. {TAIL}"


@pytest.fixture(scope="module", params=[False, True], ids=["shared", "isolated"])
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path,
          serve_port: int) -> Iterator[tuple[str, bool]]:
    isolation: bool = request.param
    cfg = stack_config(
        serve_port, sim_model(MODEL, tiny_model_dir, tpot_s=0.001, prefill_tok_s=200000.0),
        # the header forced on in both: the test reads the router's prediction
        index=IndexConfig(tenant_isolation=isolation, predicted_cached_header=True),
        auth=AuthConfig(api_keys=[ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE)),
                                  ApiKeyConfig(name="bob", key_sha256=hash_key(BOB))]),
    )
    with deployed(cfg) as url:
        yield url, isolation


def _ask(url: str, key: str, secret: str, user: str) -> tuple[int, int]:
    """(predicted cached tokens, engine-measured cached tokens) of one request."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": _system(secret)}, {"role": "user", "content": user}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                   headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return int(r.headers["x-kvroute-predicted-cached-tokens"]), int(cached)


def test_the_cross_tenant_oracle(stack: tuple[str, bool]) -> None:
    url, isolation = stack
    run = uuid.uuid4().hex[:8]  # fresh prompts for each stack
    _ask(url, ALICE, f"ACME-ROBOTICS-{run}", "What is our plan?")  # the victim
    # bob's first guess warms his own prefix (the part before the secret)
    _ask(url, BOB, f"HOOLI-{run}", "hello")
    right = _ask(url, BOB, f"ACME-ROBOTICS-{run}", "hello")
    wrong = _ask(url, BOB, f"GLOBEX-CORP-{run}", "hello")
    print(f"\nisolation={isolation}: right guess (predicted, cached) {right}, wrong {wrong}")
    if isolation:
        assert right == wrong  # bob learns nothing of alice's prompt
        assert right[0] > 0 and right[1] > 0  # his own shared prefix is still reused
    else:
        assert right[0] > wrong[0] and right[1] > wrong[1]  # the review's leak


def test_a_tenant_reuses_its_own_prefix(stack: tuple[str, bool]) -> None:
    url, _ = stack
    secret = f"INITECH-{uuid.uuid4().hex[:8]}"
    first = _ask(url, ALICE, secret, "first question")
    again = _ask(url, ALICE, secret, "second question")
    assert again[0] > first[0] and again[1] > first[1]  # the whole system prompt, now
