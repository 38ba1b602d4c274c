"""OpenAI response shapes: chat/completion objects, tool calls and SSE chunks.

Parsed tool calls (``router.output.tool_calls``) become ``message.tool_calls`` with ids
``call_…`` and arguments as a JSON string, and the finish reason ``tool_calls``
(unless the output limit cut the reply: ``length``). Streamed, each call is one
delta carrying its id, name and full arguments, sent when the call is complete.
Reasoning (``router.output.reasoning_parsers``) is ``message.reasoning_content`` and, streamed,
``reasoning_content`` deltas, as vLLM and DeepSeek return it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from router.api.common.output import TEXT, Output
from router.api.common.wire import VERSION, hex_id, quote, sse, template
from router.api.openai.logprobs import Notes
from router.output.tool_calls import ToolCall
from workers.protocol import Final, Usage

__all__ = ["DONE", "ChatOutput", "ChunkEncoder", "chat_completion", "finish_reason", "quote",
           "sse", "stream_error", "text_completion", "tool_call", "usage_block"]


def usage_block(final: Final | None) -> dict[str, Any]:
    u = final.usage if final is not None else Usage(0, 0, 0)
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def finish_reason(final: Final | None, tool_calls: bool = False) -> str:
    if final is not None and final.finish_reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


def tool_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """One OpenAI tool call; with ``index`` for a streamed delta."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update({"id": hex_id("call_", 24), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json()}})
    return out


def system_fingerprint(model: str, vocab_fingerprint: str) -> str:
    """OpenAI's ``system_fingerprint``: the router's version and the model's tokenizer,
    which together decide what a request's prompt becomes."""
    digest = hashlib.sha256(f"{VERSION}:{model}:{vocab_fingerprint}".encode()).hexdigest()
    return f"fp_{digest[:12]}"


def chat_completion(
    rid: str, model: str, text: str, final: Final | None,
    calls: list[ToolCall] | None = None, reasoning: str = "", fingerprint: str | None = None,
    logprobs: dict[str, Any] | None = None, prompt_logprobs: list[Any] | None = None,
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:  # as vLLM and DeepSeek return it
        message["reasoning_content"] = reasoning
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [tool_call(c) for c in calls]
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": fingerprint, "choices": [{
            "index": 0, "message": message,
            "finish_reason": finish_reason(final, bool(calls)), "logprobs": logprobs,
        }],
        "usage": usage_block(final),
    } | ({} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs})  # vLLM's


def text_completion(rid: str, model: str, text: str, final: Final | None,
                    fingerprint: str | None = None, logprobs: dict[str, Any] | None = None,
                    prompt_logprobs: list[Any] | None = None) -> dict:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason(final),
              "logprobs": logprobs}
    if prompt_logprobs is not None:  # vLLM's
        choice["prompt_logprobs"] = prompt_logprobs
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "system_fingerprint": fingerprint, "choices": [choice],
        "usage": usage_block(final),
    }


def chat_chunk(rid: str, model: str, delta: dict[str, Any], reason: str | None,
               created: int | None = None, fingerprint: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return {
        "id": rid, "object": "chat.completion.chunk",
        "created": int(time.time()) if created is None else created,
        "model": model, "system_fingerprint": fingerprint, "choices": [choice],
    }


def text_chunk(rid: str, model: str, text: str, reason: str | None,
               created: int | None = None, fingerprint: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict:
    return {
        "id": rid, "object": "text_completion",
        "created": int(time.time()) if created is None else created, "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}],
    }


def usage_chunk(rid: str, model: str, obj: str, final: Final | None,
                created: int | None = None, fingerprint: str | None = None) -> dict:
    return {
        "id": rid, "object": obj, "created": int(time.time()) if created is None else created,
        "model": model, "system_fingerprint": fingerprint, "choices": [],
        "usage": usage_block(final),
    }


class ChunkEncoder:
    """One stream's SSE chunks (chat ``chat.completion.chunk``s, or ``text_completion``s).

    All chunks of a stream carry the ``created`` of its start (as OpenAI's do). A text
    delta, the bulk of a stream, is the JSON of its text between two byte strings built
    once: byte for byte ``sse(chat_chunk(...))`` / ``sse(text_chunk(...))`` at that
    ``created`` (tests/router/api/test_stream_encoding.py), without a dict and a ``json.dumps``
    of it per delta."""

    def __init__(self, rid: str, model: str, chat: bool, fingerprint: str | None = None
                 ) -> None:
        self.rid, self.model, self.chat, self.fp = rid, model, chat, fingerprint
        self.created = int(time.time())
        mark = "\x00"  # the text's place in a sample chunk (ids and names hold no NUL)
        sample = (chat_chunk(rid, model, {"content": mark}, None, self.created, fingerprint)
                  if chat else text_chunk(rid, model, mark, None, self.created, fingerprint))
        self._parts = template(sse(sample), mark)
        self._head, self._tail = self._parts or (b"", b"")

    def text(self, text: str) -> bytes:
        """A content delta (chat) or a text chunk (completions)."""
        if self._parts is None:  # a NUL in the id or model name: no template
            return self.delta({"content": text} if self.chat else {"text": text})
        return self._head + quote(text).encode() + self._tail

    def delta(self, delta: dict[str, Any], reason: str | None = None,
              logprobs: dict[str, Any] | None = None) -> bytes:
        """Any other chunk: a chat delta (tool calls, the role, the end) or a text end;
        either with ``logprobs`` (``router.api.openai.logprobs``)."""
        if self.chat:
            return sse(chat_chunk(self.rid, self.model, delta, reason, self.created, self.fp,
                                  logprobs))
        return sse(text_chunk(self.rid, self.model, delta.get("text", ""), reason,
                              self.created, self.fp, logprobs))

    def usage(self, final: Final | None) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse(usage_chunk(self.rid, self.model, obj, final, self.created, self.fp))


def stream_error(message: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "api_error", "param": None, "code": "stream_failed"}
    }


DONE = sse("[DONE]")


class ChatOutput(Output):
    """Chat (and completions) output: the text, reasoning and calls kept for the whole
    reply and, given an encoder, each event's chunk (``ChunkEncoder``; None: a reply that is
    not streamed sends nothing per event)."""

    def __init__(self, enc: ChunkEncoder | None, single_call: bool = False,
                 notes: Notes | None = None) -> None:
        super().__init__(single_call)
        self.enc = enc
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.notes = notes  # logprobs and the echoed prompt (``router.api.openai.logprobs``)

    def delta(self, kind: str, text: str) -> bytes:
        if kind == TEXT:  # the bulk of a stream
            self.text.append(text)
            if self.enc is None:
                return b""
            if self.notes is not None:
                shown, logprobs = self.notes.piece(text)
                field = "content" if self.enc.chat else "text"
                return self.enc.delta({field: shown}, None, logprobs)
            return self.enc.text(text)
        self.reasoning.append(text)  # as vLLM and DeepSeek stream it
        if self.enc is None:
            return b""
        logprobs = self.notes.piece("")[1] if self.notes is not None else None
        return self.enc.delta({"reasoning_content": text}, None, logprobs)

    def call(self, call: ToolCall, index: int) -> bytes:
        if self.enc is None:
            return b""
        return self.enc.delta({"tool_calls": [tool_call(call, index)]})
