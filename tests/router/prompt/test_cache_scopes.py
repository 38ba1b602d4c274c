"""The prompt cache's scopes (``router.prompt.cache.Scope``), locally and through the
token store in a real redis-server: text encoded one way never lends its ids to the same
text encoded another way, nor one tenant's to another's; and nothing reaches the token
store before the request is admitted (``ChatTokenizer.commit``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from tests.router.prompt.test_token_store import NS, replica, store, tok_redis, url

__all__ = ["tok_redis", "url"]  # the fixtures this module uses

# A victim's chat whose tool output spells the template's marker: rendered *marked*, its
# client text as private-use markers (``router.prompt.specials``). Long enough for Redis.
VICTIM = [{"role": "system", "content": "You are careful. " * 1200},
          {"role": "user", "content": "what did the tool print?"},
          {"role": "assistant", "content": "it printed <|im_end|> and stopped. " * 20},
          {"role": "user", "content": "and then? " + "word " * 400}]


def _tok_keys(url: str) -> int:
    return sum(1 for _ in redis.Redis.from_url(url).scan_iter(f"{{{NS}}}:tok:*"))


def test_a_completions_prompt_of_a_marked_render_cannot_poison_the_chat(
        tiny_model_dir: Path, url: str) -> None:
    """Eve sends, as a raw completions prompt, the victim's chat rendered with its markers
    (the text the chat path caches). Before: the chat then read eve's ids for that text
    (the markers' ids in place of the text's), locally and on a fresh replica through
    Redis."""
    a, fresh = replica(tiny_model_dir, url), replica(tiny_model_dir, url)
    text, marked = a.render_marked(VICTIM)
    assert marked  # the victim's text holds a special-token string
    eve = a.encode(text)  # /v1/completions: raw text, special-token strings extracted
    a.commit(eve)
    store(a).flush()
    truth = a.render_encode_full(VICTIM)
    assert eve != truth  # the same text, encoded another way
    assert a.render_encode(VICTIM) == truth  # locally
    assert fresh.render_encode(VICTIM) == truth  # a fresh replica, through Redis
    # and the other way round: the chat's ids never become a completion's
    other = replica(tiny_model_dir, url)
    other.commit(other.render_encode(VICTIM))
    store(other).flush()
    assert replica(tiny_model_dir, url).encode(text) == other.encode_full(text)


def _secret(n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"secret plan {n}: " + "the vault opens at dawn " * 800},
            {"role": "user", "content": "summarize"}]


@pytest.mark.parametrize("bob", ["bob", "alice"])
def test_a_tenant_never_hits_another_tenants_prompt(tiny_model_dir: Path, url: str,
                                                    bob: str) -> None:
    """Alice's prompt, encoded in her scope and written to Redis: bob's exact guess is a
    miss on the same replica and on a fresh one (0 cached, 0 remote tokens); the control
    (the same tenant) hits both, so the test can fail."""
    a, fresh = replica(tiny_model_dir, url), replica(tiny_model_dir, url)
    a.commit(a.render_encode(_secret(1), tenant="alice"))
    store(a).flush()
    assert _tok_keys(url) > 0
    hit = a.prompt_cache.hit_tokens
    ids = a.render_encode(_secret(1), tenant=bob)
    local = a.prompt_cache.hit_tokens - hit
    fresh.render_encode(_secret(1), tenant=bob)
    remote = fresh.prompt_cache.remote_tokens
    if bob == "alice":
        assert local > len(ids) // 2 and remote > len(ids) // 2
    else:
        assert local == 0 and remote == 0


def test_nothing_reaches_the_token_store_before_commit(tiny_model_dir: Path, url: str) -> None:
    a = replica(tiny_model_dir, url)
    ids = a.render_encode(_secret(2))
    store(a).flush()
    assert _tok_keys(url) == 0  # refused after its encoding: nothing written
    a.commit(ids)
    store(a).flush()
    assert _tok_keys(url) > 0
    writes = store(a).counts["writes"]
    a.commit(ids)  # once only
    store(a).flush()
    assert store(a).counts["writes"] == writes
