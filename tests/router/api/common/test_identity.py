"""Agent identity → session keys: the documented order, sub-agents, tenants, bounds."""

from __future__ import annotations

import json

import pytest

from router.api.common.identity import MAX_SESSION_CHARS, session_key
from router.errors import ApiError

CC_USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": "cc-sess"})


@pytest.mark.parametrize(("headers", "kw", "key"), [
    ({}, {}, None),
    ({"x-session-id": "ours"}, {"prompt_cache_key": "pck", "user_id": CC_USER_ID}, "ours"),
    ({"x-claude-code-session-id": "cc", "x-session-affinity": "oc"}, {"user_id": "u"}, "cc"),
    ({"session-id": "codex", "x-session-affinity": "oc"}, {"prompt_cache_key": "pck"}, "codex"),
    ({"session_id": "codex-old"}, {}, "codex-old"),
    ({"x-session-affinity": "oc"}, {"prompt_cache_key": "pck"}, "pck"),
    ({"x-session-affinity": "oc"}, {"user_id": "u"}, "oc"),
    ({}, {"user_id": CC_USER_ID}, "cc-sess"),
    ({}, {"user_id": "user_ab12_account__session_0b7e6f1c-2d3e-4f5a-8b9c-0d1e2f3a4b5c"},
     "0b7e6f1c-2d3e-4f5a-8b9c-0d1e2f3a4b5c"),
    ({}, {"user_id": "alice"}, "alice"),
    ({"x-session-id": "  "}, {"user_id": "{not json"}, "{not json"),
])
def test_documented_order(headers: dict[str, str], kw: dict[str, str], key: str | None) -> None:
    assert session_key(headers, **kw) == key


def test_sub_agents_get_their_own_key_and_roots_keep_theirs() -> None:
    assert session_key({"x-claude-code-session-id": "s", "x-claude-code-agent-id": "a1"}) \
        == "s#agent:a1"
    meta = {"session_id": "s", "agent_name": "/root"}
    root = {"session-id": "s", "x-codex-turn-metadata": json.dumps(meta)}
    assert session_key(root) == "s"
    sub = {**root, "x-codex-turn-metadata": json.dumps({**meta, "agent_name": "/root/w1"})}
    assert session_key(sub) == "s#agent:/root/w1"
    assert session_key({**root, "x-codex-turn-metadata": "{garbage"}) == "s"


def test_keys_are_scoped_by_tenant_and_bounded() -> None:
    assert session_key({"x-session-id": "s"}, tenant="alice") == "alice/s"
    assert session_key({"x-session-id": "x" * MAX_SESSION_CHARS}) is not None
    with pytest.raises(ApiError) as err:
        session_key({}, user_id="x" * (MAX_SESSION_CHARS + 1))
    assert err.value.status == 400
