"""OpenAI Responses shapes: the response object, output items and the SSE event sequence.

Streamed, as OpenAI documents it, every event carrying a ``sequence_number``:

    response.created → response.in_progress →
    (reasoning: output_item.added → content_part.added → reasoning_text.delta* →
     reasoning_text.done → content_part.done → output_item.done
     | text: output_item.added → content_part.added → output_text.delta* →
     output_text.done → content_part.done → output_item.done
     | call: output_item.added → function_call_arguments.delta →
     function_call_arguments.done → output_item.done)* →
    response.completed | response.incomplete (output limit) | response.failed

A tool call is sent whole, when the parser has seen all of it (one arguments
delta), as the chat API does. A call comes back in the shape its tool was offered
in (``router.api.responses.tools``): ``function_call``, ``custom_tool_call`` with its
``input`` or ``tool_search_call``, with ``namespace`` when it has one. Usage:
``input_tokens`` is the whole prompt and ``input_tokens_details.cached_tokens`` the
engine's own count. Reasoning (``router.output.reasoning_parsers``) is a ``reasoning`` item
whose ``content`` is one ``reasoning_text`` (its ``summary`` is empty: kvroute does not
summarise; ``output_tokens_details.reasoning_tokens`` stays 0: not counted apart).
"""

from __future__ import annotations

import json
import time
from typing import Any

from router.api.common.output import REASONING, TEXT
from router.api.common.output import Output as Accumulator
from router.api.common.wire import hex_id, quote, sse_event, template
from router.api.openai.logprobs import LogprobTap, chat_entry
from router.api.responses.schema import ResponsesRequest
from router.api.responses.tools import CUSTOM_INPUT, TOOL_SEARCH, ToolCatalog, template_name
from router.output.reasoning_parsers.controls import with_past_reasoning
from router.output.tool_calls import ToolCall
from workers.protocol import Final, Usage

_DELTA = {"message": "output_text", "reasoning": "reasoning_text"}  # event name per item
_ITEM = {TEXT: "message", REASONING: "reasoning"}  # the item type of each kind of piece


def new_id(prefix: str) -> str:
    return hex_id(f"{prefix}_")


def usage(final: Final | None, prompt_tokens: int) -> dict[str, Any]:
    u = final.usage if final is not None else Usage(prompt_tokens, 0, 0)
    prompt, output = u.prompt_tokens, u.completion_tokens
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": min(u.cached_tokens, prompt)},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output}


def status(final: Final | None) -> str:
    """``incomplete`` when the output limit cut the reply, else ``completed``."""
    return "incomplete" if final is not None and final.finish_reason == "length" \
        else "completed"


def sse(data: dict[str, Any]) -> bytes:
    return sse_event(data["type"], data)


def text_delta(kind: str, seq: int | str, item_id: str, index: int, text: str) -> bytes:
    """The delta event of a message's (``kind`` message) or reasoning item's text."""
    extra = {} if kind == "reasoning" else {"logprobs": []}
    return sse({"type": f"response.{_DELTA[kind]}.delta", "sequence_number": seq,
                "item_id": item_id, "output_index": index, "content_index": 0, "delta": text,
                **extra})


def delta_template(kind: str, item_id: str, index: int) -> tuple[bytes, bytes, bytes]:
    """``text_delta`` around its sequence number and the JSON of its text, built once per
    item: ``head + str(seq) + mid + json.dumps(text) + tail`` are its bytes."""
    seq, text = "\x00", "\x01"  # json.dumps escapes both; ids and the rest hold neither
    parts = template(text_delta(kind, seq, item_id, index, text), seq, text)
    assert parts is not None
    head, mid, tail = parts
    return head, mid, tail


class Output(Accumulator):
    """Output items built from parser events; ``add`` also returns their SSE events.

    ``catalog`` says what each called name stands for (a function, a freeform tool, a
    tool search, in a namespace or not); ``single_call`` keeps the first call only
    (``parallel_tool_calls: false``).
    """

    def __init__(self, req: ResponsesRequest, rid: str, catalog: ToolCatalog,
                 single_call: bool, logprobs: LogprobTap | None = None) -> None:
        super().__init__(single_call)
        self.req, self.id, self.catalog = req, rid, catalog
        self.tap, self.top = logprobs, req.output_logprobs() or 0  # include's logprobs
        self.items: list[dict[str, Any]] = []
        self.created = int(time.time())
        self._seq = 0
        self._delta = (b"", b"", b"")  # the open item's delta event's template (delta_template)

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(data)

    def start(self) -> bytes:
        snapshot = self.response("in_progress", None)
        return (self.event("response.created", response=snapshot)
                + self.event("response.in_progress", response=snapshot))

    def delta(self, kind: str, text: str) -> bytes:
        part = self.items[-1]["content"][0]
        part["text"] += text
        if self.tap is not None:  # the tokens' logprobs go with the message's text only
            entries = [chat_entry(x, self.top) for x in self.tap.take()]
            if kind == TEXT:
                part["logprobs"].extend(entries)
                item = self.items[-1]
                return self.event("response.output_text.delta", item_id=item["id"],
                                  output_index=len(self.items) - 1, content_index=0,
                                  delta=text, logprobs=entries)
        head, mid, tail = self._delta
        seq, self._seq = self._seq, self._seq + 1
        return head + str(seq).encode() + mid + quote(text).encode() + tail

    def finish(self, final: Final | None, prompt_tokens: int) -> bytes:
        """Close the open item; the closing event with the whole response."""
        out = self.end_piece()
        done = status(final)
        return out + self.event(f"response.{done}", response=self.response(
            done, usage(final, prompt_tokens)))

    def failed(self, message: str) -> bytes:
        body = self.response("failed", None)
        body["error"] = {"code": "server_error", "message": message}
        return self.event("response.failed", response=body)

    def response(self, state: str, use: dict[str, Any] | None) -> dict[str, Any]:
        req = self.req
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": state,
            "error": None, "model": req.model, "output": [dict(i) for i in self.items],
            "incomplete_details": {"reason": "max_output_tokens"}
            if state == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": req.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "text": {"format": {"type": "text"}},
            "tool_choice": req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump")
            else (req.tool_choice or "auto"),
            "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools or ()],
            "truncation": "disabled", "usage": use, "user": req.user,
            "metadata": req.metadata or {}, "output_text": self.text(),
        }

    def text(self) -> str:
        return "".join(c["text"] for i in self.items if i["type"] == "message"
                       for c in i["content"])

    def begin(self, piece: str) -> bytes:
        """Open a message or reasoning item."""
        kind = _ITEM[piece]
        item: dict[str, Any]
        if kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                    "status": "in_progress", "content": []}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.items.append(item)
        index = len(self.items) - 1
        self._delta = delta_template(kind, item["id"], index)
        out = self.event("response.output_item.added", output_index=index, item=dict(item))
        item["content"].append(part)
        return out + self.event("response.content_part.added", item_id=item["id"],
                                output_index=index, content_index=0, part=dict(part))

    def close(self, piece: str) -> bytes:
        """Close the message or reasoning item being streamed."""
        kind = _ITEM[piece]
        item, index = self.items[-1], len(self.items) - 1
        item["status"] = "completed"
        part = item["content"][0]
        extra = {} if kind == "reasoning" else {"logprobs": part["logprobs"]}
        return (
            self.event(f"response.{_DELTA[kind]}.done", item_id=item["id"], output_index=index,
                       content_index=0, text=part["text"], **extra)
            + self.event("response.content_part.done", item_id=item["id"], output_index=index,
                         content_index=0, part=dict(part))
            + self.event("response.output_item.done", output_index=index, item=item))

    def call(self, call: ToolCall, n: int) -> bytes:
        """A function call, custom tool call or tool search, in the shape it was offered."""
        index, call_id = len(self.items), hex_id("call_", 24)
        ref = self.catalog.ref(call.name)
        item: dict[str, Any] = {"id": "", "type": "", "status": "completed", "call_id": call_id}
        if ref.kind == "tool_search":
            item.update(id=new_id("tsc"), type="tool_search_call", execution="client",
                        arguments=call.arguments)
            self.items.append(item)
            return (self.event("response.output_item.added", output_index=index,
                               item={**item, "status": "in_progress"})
                    + self.event("response.output_item.done", output_index=index, item=item))
        if ref.namespace:
            item["namespace"] = ref.namespace
        if ref.kind == "custom":
            value = call.arguments.get(CUSTOM_INPUT)
            text = value if isinstance(value, str) else call.arguments_json()
            item.update(id=new_id("ctc"), type="custom_tool_call", name=ref.name, input=text)
            kind, empty, done = "custom_tool_call_input", {"input": ""}, {"input": text}
        else:
            text = call.arguments_json()
            item.update(id=new_id("fc"), type="function_call", name=ref.name, arguments=text)
            kind, empty, done = "function_call_arguments", {"arguments": ""}, {"arguments": text}
            done["name"] = ref.name
        self.items.append(item)
        return (self.event("response.output_item.added", output_index=index,
                           item={**item, "status": "in_progress", **empty})
                + self.event(f"response.{kind}.delta", item_id=item["id"], output_index=index,
                             delta=text)
                + self.event(f"response.{kind}.done", item_id=item["id"], output_index=index,
                             **done)
                + self.event("response.output_item.done", output_index=index, item=item))

    def conversation_tail(self) -> dict[str, Any] | None:
        """This response as the assistant message of the stored conversation."""
        if not self.items:
            return None
        calls = [{"id": i["call_id"], "type": "function",
                  "function": {"name": _template_call_name(i), "arguments": _call_args(i)}}
                 for i in self.items if i["type"] not in ("message", "reasoning")]
        msg: dict[str, Any] = {"role": "assistant", "content": self.text()}
        if calls:
            msg["tool_calls"] = calls
        thought = "".join(c["text"] for i in self.items if i["type"] == "reasoning"
                          for c in i["content"])
        return with_past_reasoning(msg, thought)


def _template_call_name(item: dict[str, Any]) -> str:
    if item["type"] == "tool_search_call":
        return TOOL_SEARCH
    return template_name(item["name"], item.get("namespace"))


def _call_args(item: dict[str, Any]) -> Any:
    if item["type"] == "custom_tool_call":
        return {CUSTOM_INPUT: item["input"]}
    if item["type"] == "tool_search_call":
        return item["arguments"]
    return json.loads(item["arguments"])
