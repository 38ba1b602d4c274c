"""The timing oracle under ``index.tenant_isolation``: bob's ``count_tokens`` on a right
guess of alice's system prompt reads the same as on a wrong one, because his lookups
never reach her part of the prompt cache (``router.prompt.cache.Scope``).

The real ingress app in process (the scripted core of the API tests, a 32,768-token
model, keys alice and bob). Each round alice counts a new secret prompt (~14k tokens),
then bob counts a right and a wrong guess (one word changed) in random order. Asserted:
the isolation itself (bob's right guesses hit 0 cached tokens; with isolation off, the
control, they hit alice's). Printed, not asserted (a timing assertion would flake): both
timing distributions and a Mann-Whitney U test of them."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from tests.router.auth.test_auth_routes import LimitedCore, ingress_client

ALICE, BOB = "sk-kvr-alice-timing", "sk-kvr-bob-timing"
ROUNDS = 12


@pytest.fixture(params=[True, False], ids=["isolated", "shared"])
def served(request: pytest.FixtureRequest, tiny_model_dir: Path
           ) -> Iterator[tuple[LimitedCore, TestClient]]:
    core = LimitedCore(tiny_model_dir, context_window=32768)
    core.auth = Authenticator([ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE)),
                               ApiKeyConfig(name="bob", key_sha256=hash_key(BOB))])
    core.isolation = request.param
    for client in ingress_client(core):
        yield core, client


def _count(client: TestClient, key: str, system: str) -> float:
    started = time.perf_counter()
    r = client.post("/v1/messages/count_tokens", headers={"x-api-key": key}, json={
        "model": "tiny", "system": system, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text[:300]
    return time.perf_counter() - started


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p of the Mann-Whitney U test, normal approximation (no ties expected)."""
    ranked = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    rank_a = sum(i + 1 for i, (_, g) in enumerate(ranked) if g == 0)
    n, m = len(a), len(b)
    u = rank_a - n * (n + 1) / 2
    z = (u - n * m / 2) / math.sqrt(n * m * (n + m + 1) / 12)
    return math.erfc(abs(z) / math.sqrt(2))


def test_a_right_guess_reads_like_a_wrong_one(served: tuple[LimitedCore, TestClient]) -> None:
    core, client = served
    cache = core.tok.prompt_cache
    rng = random.Random(7)
    right, wrong = [], []
    hits = {"right": 0, "wrong": 0}  # bob's cached tokens per kind of guess
    for r in range(ROUNDS):
        secret = f"round {r}: the vault code is {rng.randrange(10**6)}. " + \
            " ".join(f"rule{rng.randrange(10**4)}" for _ in range(6000))
        guess = secret.replace("the vault", "a vault")
        _count(client, ALICE, secret)
        for which in rng.sample(["right", "wrong"], 2):
            before = cache.hit_tokens
            took = _count(client, BOB, secret if which == "right" else guess)
            (right if which == "right" else wrong).append(took)
            hits[which] += cache.hit_tokens - before
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"\nisolation {core.isolation}: right guesses {med(right) * 1e3:.1f} ms median "
          f"({', '.join(f'{x * 1e3:.0f}' for x in sorted(right))}), wrong guesses "
          f"{med(wrong) * 1e3:.1f} ms ({', '.join(f'{x * 1e3:.0f}' for x in sorted(wrong))}); "
          f"Mann-Whitney p = {mann_whitney_p(right, wrong):.3f}; bob's cached tokens: {hits}")
    # Either guess hits only bob's own earlier requests (the template's first marker);
    # before, every right guess read alice's whole cached prompt.
    if core.isolation:
        assert max(hits.values()) < ROUNDS * 8  # a few tokens a probe, either guess
    else:
        assert hits["right"] > ROUNDS * 5000 > hits["wrong"]  # the control: shared
