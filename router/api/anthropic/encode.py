"""Anthropic Messages response shapes: the message object, usage, stop reasons, SSE events.

Streaming sends the standard sequence, as the Anthropic API does:

    message_start → ping → (content_block_start → content_block_delta* →
    content_block_stop)* → message_delta → message_stop

or, if generation fails mid-stream, an ``error`` event and the end of the stream.
Text streams as ``text_delta``s; a tool call is sent whole, when the parser has
seen all of it, as one ``input_json_delta`` of its full JSON input. Reasoning is a
``thinking`` block streamed as ``thinking_delta``s. Its ``signature`` is empty:
kvroute does not sign reasoning (nothing to verify it with), and takes thinking
blocks sent back with any signature.

Usage: ``input_tokens`` counts the prompt tokens *not* read from the engine's
cache and ``cache_read_input_tokens`` those that were (the engine's own count),
so their sum is the prompt length, as with Anthropic (Claude Code adds them up
to size its context). ``cache_creation_input_tokens`` is always 0: kvroute has no
separately billed cache writes. ``message_start`` can only carry what is known
before generation: the full prompt as ``input_tokens`` and 0 cached (the
router's prediction is in the ``x-kvroute-predicted-cached-tokens`` header, never
in the body). ``message_delta`` then carries the engine's actual counts, which
clients (the Anthropic SDKs, Claude Code) take as the final usage.
"""

from __future__ import annotations

from typing import Any

from router.api.common.output import REASONING, TEXT, Output
from router.api.common.wire import base62_id, quote, sse_event, template
from router.output.tool_calls import ToolCall
from workers.protocol import Final, Usage

sse = sse_event  # every Anthropic event is named
new_id = base62_id  # ``msg_…`` / ``toolu_…``: 24 base62 characters
_BLOCK = {TEXT: "text", REASONING: "thinking"}  # the block type of each kind of piece


def usage(final: Final | None, prompt_tokens: int) -> dict[str, int]:
    u = final.usage if final is not None else Usage(prompt_tokens, 0, 0)
    cached = min(u.cached_tokens, u.prompt_tokens)
    return {
        "input_tokens": u.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": u.completion_tokens,
    }


def stop_reason(
    final: Final | None, tool_use: bool, context_bound: bool
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish reason.

    ``length`` is ``max_tokens``, or ``model_context_window_exceeded`` when the
    output limit was cut down to fit the context; a matched stop string (reported
    by the worker as ``stop_sequence``) is ``stop_sequence``; otherwise a parsed
    tool call makes it ``tool_use``, else ``end_turn``.
    """
    if final is not None and final.finish_reason == "length":
        return ("model_context_window_exceeded" if context_bound else "max_tokens"), None
    if final is not None and final.stop_sequence:
        return "stop_sequence", final.stop_sequence
    return ("tool_use" if tool_use else "end_turn"), None


def message(
    mid: str, model: str, content: list[dict[str, Any]], reason: str | None,
    seq: str | None, use: dict[str, int], safeguard_results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    body = {
        "id": mid, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": seq, "usage": use,
    }
    if safeguard_results is not None:  # asked for (router.api.anthropic.safeguards)
        body["safeguard_results"] = safeguard_results
    return body


def message_start(mid: str, model: str, prompt_tokens: int) -> bytes:
    use = {"input_tokens": prompt_tokens, "cache_creation_input_tokens": 0,
           "cache_read_input_tokens": 0, "output_tokens": 0}
    return sse("message_start", {"type": "message_start",
                                 "message": message(mid, model, [], None, None, use)})


def ping() -> bytes:
    return sse("ping", {"type": "ping"})


def message_delta(reason: str, seq: str | None, use: dict[str, int],
                  safeguard_results: list[dict[str, Any]] | None = None) -> bytes:
    """The end of a message; ``safeguard_results`` (when the request asked for them) in the
    delta, where Claude Code reads them."""
    delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": seq}
    if safeguard_results is not None:
        delta["safeguard_results"] = safeguard_results
    return sse("message_delta", {"type": "message_delta", "delta": delta, "usage": use})


def message_stop() -> bytes:
    return sse("message_stop", {"type": "message_stop"})


def error_event(kind: str, text: str) -> bytes:
    return sse("error", {"type": "error", "error": {"type": kind, "message": text}})


def block_delta(index: int, kind: str, text: str) -> bytes:
    """A text or thinking block's ``content_block_delta`` event (``kind``: text, thinking)."""
    return sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                       "delta": {"type": f"{kind}_delta", kind: text}})


def block_delta_template(index: int, kind: str) -> tuple[bytes, bytes]:
    """``block_delta(index, kind, text)`` around the JSON of ``text``, built once per
    block: the bytes of every delta are ``head + json.dumps(text).encode() + tail``."""
    mark = "\x00"  # json.dumps escapes it, and the rest of the event holds none
    parts = template(block_delta(index, kind, mark), mark)
    assert parts is not None
    return parts[0], parts[1]


class Blocks(Output):
    """Content blocks built from parser events; ``add`` also returns their SSE events.

    The non-streaming path reads ``content``; the streaming path sends what
    ``add`` and ``finish`` return. ``single_tool``: ``disable_parallel_tool_use``.
    """

    def __init__(self, single_tool: bool = False) -> None:
        super().__init__(single_tool)
        self.content: list[dict[str, Any]] = []
        self._delta = (b"", b"")  # the open block's delta template (block_delta_template)

    @property
    def tool_calls(self) -> int:
        return len(self.calls)

    def begin(self, kind: str) -> bytes:
        block = {"type": _BLOCK[kind], _BLOCK[kind]: ""}
        if kind == REASONING:
            block["signature"] = ""  # see the module docstring
        start = self._start(block)
        self._delta = block_delta_template(len(self.content) - 1, _BLOCK[kind])
        return start

    def delta(self, kind: str, text: str) -> bytes:
        self.content[-1][_BLOCK[kind]] += text
        return self._delta[0] + quote(text).encode() + self._delta[1]

    def close(self, kind: str) -> bytes:
        return self._stop()

    def finish(self) -> bytes:
        """Close the open block; an empty reply still gets one (empty) text block."""
        if not self.content:
            return self._start({"type": "text", "text": ""}) + self._stop()
        return self.end_piece()

    def call(self, call: ToolCall, index: int) -> bytes:
        block = {"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": {}}
        start = self._start(block)
        block["input"] = call.arguments
        delta = {"type": "input_json_delta", "partial_json": call.arguments_json()}
        return start + sse("content_block_delta", {"type": "content_block_delta",
                                                   "index": len(self.content) - 1,
                                                   "delta": delta}) + self._stop()

    def _start(self, block: dict[str, Any]) -> bytes:
        self.content.append(block)
        return sse("content_block_start", {"type": "content_block_start",
                                           "index": len(self.content) - 1,
                                           "content_block": dict(block)})

    def _stop(self) -> bytes:
        return sse("content_block_stop", {"type": "content_block_stop",
                                          "index": len(self.content) - 1})
