"""Bounds on what one request may hold, checked while its body is parsed.

The body limit (``server.max_body_bytes``) and the bound against the context window
(``router.api.common.request.BodyLimits``) cap the bytes; these cap the counts and string sizes the
schemas accept, so no field of a body under those limits can make parsing, normalising or
templating do far more work than the text a model could take. Each is far above what real
agents send (Claude Code 2.1 sends 8-13 tools and tens to hundreds of messages in a long
session; Codex 0.169 a few tens of items and 10 tools; ``tests/router/fixtures``) and
above the providers' own documented limits where they have one.
"""

from __future__ import annotations

from router.errors import ApiError

MAX_MESSAGES = 10_000  # messages / input items per request
MAX_TOOLS = 1024  # tool definitions per request
MAX_BLOCKS = 4096  # content blocks / parts in one message or tool result
MAX_TEXT_CHARS = 4 << 20  # one text field (4 Mi characters: beyond any context window)
MAX_DESCRIPTION_CHARS = 100_000  # one tool description
MAX_ID_CHARS = 256  # tool call ids and other client-chosen ids


class Expansion:
    """What one request may still grow to while it is expanded (``tool_reference``
    blocks, namespaces, ``additional_tools``, a stored conversation), checked as each part
    is added, before anything is rendered: the limits a plain request of the same size
    meets (its characters, tools and messages), so no expansion costs more than a body
    that spelled it out would."""

    __slots__ = ("chars", "tools")

    def __init__(self, chars: int, tools: int = MAX_TOOLS) -> None:
        self.chars, self.tools = chars, tools

    def add_chars(self, n: int, where: str) -> None:
        self.chars -= n
        if self.chars < 0:
            raise ApiError(413, f"{where}: the request expands past the most text a prompt "
                           "may hold", "request_too_large", where)

    def add_tools(self, n: int, where: str) -> None:
        self.tools -= n
        if self.tools < 0:
            raise ApiError(400, f"{where}: more than {MAX_TOOLS} tools in all (namespaces and "
                           "additional_tools count each tool they hold)", "too_many_tools",
                           where)


def check_messages(n: int, where: str) -> None:
    if n > MAX_MESSAGES:
        raise ApiError(400, f"{where}: more than {MAX_MESSAGES} messages in all (a stored "
                       "conversation counts with the new input)", "too_many_messages", where)
