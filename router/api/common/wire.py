"""Wire helpers every API's encoder uses: JSON string quoting, SSE framing, the streams'
pre-built byte templates and ids. Usage blocks and finish/stop mappings stay per API:
their shapes differ."""

from __future__ import annotations

import json
import secrets
import string
import uuid
from collections.abc import Callable
from importlib import metadata
from json.encoder import encode_basestring_ascii
from typing import Any

# ``json.dumps(text)`` for a str, without its Python layers: the function it calls.
quote: Callable[[str], str] = encode_basestring_ascii
_ALPHABET = string.ascii_letters + string.digits


def _version() -> str:
    try:
        return metadata.version("kvroute")
    except metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


VERSION = _version()  # kvroute's: /version, and OpenAI's system_fingerprint


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def sse(data: dict[str, Any] | str) -> bytes:
    """One ``data:`` frame (OpenAI's streams); a str goes as it is (``[DONE]``)."""
    body = data if isinstance(data, str) else compact(data)
    return f"data: {body}\n\n".encode()


def sse_event(event: str, data: dict[str, Any]) -> bytes:
    """One ``event:`` + ``data:`` frame (Anthropic's and the Responses streams)."""
    return f"event: {event}\ndata: {compact(data)}\n\n".encode()


def template(sample: bytes, *marks: str) -> tuple[bytes, ...] | None:
    """``sample`` (an event built with ``marks`` in place of its variable fields) cut at
    the JSON of each mark, in order: the event of other values is these parts joined with
    their JSON, built once per stream or block instead of a dict and a ``json.dumps`` per
    delta. None when a mark is not there exactly once (it was in an id or a name)."""
    parts: list[bytes] = []
    rest = sample
    for mark in marks:
        pieces = rest.split(json.dumps(mark).encode())
        if len(pieces) != 2:
            return None
        parts.append(pieces[0])
        rest = pieces[1]
    return (*parts, rest)


def base62_id(prefix: str, size: int = 24) -> str:
    """``msg_…`` / ``toolu_…`` ids in Anthropic's style."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(size))


def with_prefix(prefix: str, rid: str) -> str:
    """``rid`` (Serve's request id, as x-request-id names it) as an OpenAI object id:
    ``chatcmpl-…`` / ``cmpl-…``, as OpenAI's and vLLM's are."""
    return rid if rid.startswith(prefix) else prefix + rid


def hex_id(prefix: str, size: int = 32) -> str:
    """``call_…``, ``resp_…``, ``fc_…`` ids in OpenAI's style: random hex after the prefix."""
    return prefix + uuid.uuid4().hex[:size]
