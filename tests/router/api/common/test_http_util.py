"""Validation errors become one 400 that names the most specific field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from router.api.anthropic.schema import MessagesRequest
from router.api.common.request import _invalid


def _error(body: Any) -> tuple[str, str | None]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ValidationError) as info:
        MessagesRequest.model_validate_json(raw)
    err = _invalid(info.value.errors())
    assert err.status == 400
    return err.message, err.code


def _content(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": list(blocks)}]}


def test_unknown_block_type_is_named() -> None:
    message, code = _error(_content({"type": "bogus", "text": "x"}))
    assert message.startswith("messages.0.content.0: ") and "'bogus'" in message, message
    assert code == "invalid_request"


def test_missing_field_of_a_block_is_named_with_its_block() -> None:
    message, _ = _error(_content({"type": "tool_use", "name": "f"}))
    assert message == "messages.0.content.0.tool_use.id: Field required"
    message, _ = _error(_content({"type": "text"}))
    assert message == "messages.0.content.0.text: Field required"


def test_invalid_json_wins() -> None:
    message, code = _error(b'{"model": ')
    assert code == "invalid_json" and message.startswith("body is not valid JSON")


def test_span_names_are_routes_never_raw_paths() -> None:
    """A client must not mint span names with the paths it sends."""
    from router.telemetry import span_name

    assert span_name("POST", "/v1/messages") == "POST /v1/messages"
    assert span_name("GET", "/v1/x-" + "a" * 5000) == "GET /v1/{unknown}"
    assert span_name("GET", "/v1/models/" + "m" * 5000) == "GET /v1/models/{model_id}"
    assert span_name("POST", "/tokenize") == "POST /tokenize"


def test_the_tokenizer_routes_are_traced_and_counted_the_health_probe_is_not() -> None:
    from router.telemetry import traced

    assert traced("/tokenize") and traced("/detokenize") and traced("/v1/models/m")
    assert not traced("/health") and not traced("/metrics")
