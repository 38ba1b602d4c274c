"""Agent identity → the session key that sticks a conversation to its replica.

Agent CLIs already say which conversation a request belongs to; kvroute takes the
first of these that is present (the order is documented in docs/api.md):

1. ``x-session-id``: kvroute's own header, for any client;
2. the CLIs' own session headers: Claude Code's ``x-claude-code-session-id``,
   Codex's ``session-id`` (older versions: ``session_id``);
3. the body's ``prompt_cache_key`` (OpenAI chat and Responses; Codex sets it to its
   conversation id);
4. OpenCode's ``x-session-affinity``;
5. Anthropic ``metadata.user_id``: Claude Code puts a JSON object with a
   ``session_id`` there (older versions: ``user_…_account_…_session_<uuid>``);
   anything else is taken whole.

Sub-agents: a request that names a sub-agent gets the key ``<session>#agent:<name>``,
so a sub-agent's first turn has no sticky replica and is routed by its prefix (the
parent's system prompt and tools, not its history), then sticks to its own replica;
the parent's key is never moved by it. Codex names every agent in the JSON header
``x-codex-turn-metadata`` (``agent_name``: ``/root`` for the main agent, a path below
it for sub-agents); Claude Code sub-agents are named by ``x-claude-code-agent-id``
where it is sent (``claude -p`` main-agent requests carry none).

Keys are scoped by API key name when keys are configured (one tenant cannot steer
another's session), and an id over ``MAX_SESSION_CHARS`` is a 400: the index keeps
keys (as digests in Redis) and a client must not make them unbounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from router.errors import ApiError

MAX_SESSION_CHARS = 256
SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session-id", "session_id")
AFFINITY_HEADERS = ("x-session-affinity",)
AGENT_HEADERS = ("x-claude-code-agent-id",)
CODEX_METADATA_HEADER, CODEX_ROOT_AGENT = "x-codex-turn-metadata", "/root"
_LEGACY_USER_ID = re.compile(r"_session_([0-9a-fA-F-]{36})$")


def session_key(
    headers: Mapping[str, str], *, prompt_cache_key: str | None = None,
    user_id: str | None = None, tenant: str | None = None,
) -> str | None:
    """The request's session key, or None (routing by prefix alone)."""
    found = _first(headers, SESSION_HEADERS) or prompt_cache_key \
        or _first(headers, AFFINITY_HEADERS) or _from_user_id(user_id)
    if not found:
        return None
    if len(found) > MAX_SESSION_CHARS:
        raise ApiError(400, f"session id over {MAX_SESSION_CHARS} characters",
                       "invalid_session_id", "session")
    if agent := _agent(headers):
        found = f"{found}#agent:{agent[:MAX_SESSION_CHARS]}"
    return f"{tenant}/{found}" if tenant else found


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if value := headers.get(name, "").strip():
            return value
    return None


def _agent(headers: Mapping[str, str]) -> str | None:
    """The sub-agent a request comes from; None for a main agent."""
    if agent := _first(headers, AGENT_HEADERS):
        return agent
    meta = headers.get(CODEX_METADATA_HEADER, "")
    if not meta.startswith("{"):
        return None
    try:
        name = json.loads(meta).get("agent_name")
    except (json.JSONDecodeError, AttributeError):
        return None
    return name if isinstance(name, str) and name not in ("", CODEX_ROOT_AGENT) else None


def _from_user_id(user_id: str | None) -> str | None:
    if not user_id:
        return None
    if user_id.startswith("{"):
        try:
            data = json.loads(user_id)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("session_id"), str):
            return data["session_id"] or None
    if m := _LEGACY_USER_ID.search(user_id):
        return m.group(1)
    return user_id
