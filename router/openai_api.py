"""OpenAI response shapes: chat/completion objects and SSE chunks."""

from __future__ import annotations

import json
import time
from typing import Any


def usage_block(final: dict[str, Any] | None) -> dict[str, Any]:
    u = (final or {}).get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(u.get("cached_tokens", 0))},
    }


def finish_reason(final: dict[str, Any] | None) -> str:
    reason = (final or {}).get("finish_reason", "stop")
    return "length" if reason == "length" else "stop"


def chat_completion(rid: str, model: str, text: str, final: dict[str, Any] | None) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{
            "index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason(final), "logprobs": None,
        }],
        "usage": usage_block(final),
    }


def text_completion(rid: str, model: str, text: str, final: dict[str, Any] | None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{
            "index": 0, "text": text, "finish_reason": finish_reason(final), "logprobs": None,
        }],
        "usage": usage_block(final),
    }


def chat_chunk(rid: str, model: str, delta: dict[str, Any], reason: str | None) -> dict:
    return {
        "id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
    }


def text_chunk(rid: str, model: str, text: str, reason: str | None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
    }


def usage_chunk(rid: str, model: str, obj: str, final: dict[str, Any] | None) -> dict:
    return {
        "id": rid, "object": obj, "created": int(time.time()), "model": model,
        "choices": [], "usage": usage_block(final),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


def stream_error(message: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "api_error", "param": None, "code": "stream_failed"}
    }
