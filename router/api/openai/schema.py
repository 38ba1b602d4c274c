"""OpenAI request schemas (the subset kvroute serves), validated by pydantic.

Unknown top-level fields are ignored, as OpenAI-compatible servers commonly do,
so newer SDKs keep working; known fields are checked strictly.

``response_format``: the engines cannot constrain decoding yet, so ``json_object``
and ``json_schema`` are passed to the model as an instruction only (``instruction()``).
A ``json_schema`` with ``strict: true`` (which promises conformance) is served the same
way, and its reply says so in the ``x-kvroute-schema-not-enforced`` header
(``ResponseFormat.not_enforced``): the Codex TUI sends one for every new thread's title.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.api.common import limits as lim
from router.output.reasoning_parsers.controls import options, with_past_reasoning
from router.prompt.template import strip_volatile
from router.prompt.tokenizer import TemplateOptions

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seed: engines seed 64-bit generators
MAX_STOP_CHARS = 512  # stop matching costs grow with the length
SCHEMA_NOT_ENFORCED = "x-kvroute-schema-not-enforced"  # value: the strict schema's name


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Lenient):
    type: str
    text: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)


class ToolCallFunction(_Lenient):
    name: str = Field(max_length=lim.MAX_ID_CHARS)
    arguments: str | dict[str, Any] = Field("{}", max_length=lim.MAX_TEXT_CHARS)


class ToolCall(_Lenient):
    id: str | None = Field(None, max_length=lim.MAX_ID_CHARS)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: (Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)]
              | Annotated[list[ContentPart], Field(max_length=lim.MAX_BLOCKS)] | None) = None
    name: str | None = Field(None, max_length=lim.MAX_ID_CHARS)
    tool_calls: list[ToolCall] | None = Field(None, max_length=lim.MAX_BLOCKS)
    tool_call_id: str | None = Field(None, max_length=lim.MAX_ID_CHARS)
    # Past reasoning sent back (vLLM and DeepSeek name it reasoning_content; newer vLLM
    # ``reasoning``): rendered as the model's template renders it.
    reasoning_content: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)
    reasoning: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content if p.type in ("text", "input_text"))

    def template_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": self.text()}
        if self.name:
            msg["name"] = self.name
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            msg["tool_calls"] = [_template_call(call.model_dump()) for call in self.tool_calls]
        if self.role == "assistant":
            with_past_reasoning(msg, self.reasoning_content or self.reasoning)
        return msg


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    args = call["function"]["arguments"]
    if isinstance(args, str):  # templates expect a mapping
        with contextlib.suppress(json.JSONDecodeError):
            call["function"]["arguments"] = json.loads(args)
    return call


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingFields(_Lenient):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)  # vLLM's own bounds
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a session key (router.api.common.identity)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if any(len(s) > MAX_STOP_CHARS for s in ([v] if isinstance(v, str) else v or [])):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters")
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(None, max_length=lim.MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionName(_Lenient):
    name: str = Field(min_length=1)


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionName


class JsonSchemaFormat(_Lenient):
    name: str = Field("response", min_length=1)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is 'json_schema'")
        return self

    def not_enforced(self) -> dict[str, str]:
        """The header of a reply to a strict schema, which decoding does not enforce."""
        if self.type == "json_schema" and self.json_schema and self.json_schema.strict:
            return {SCHEMA_NOT_ENFORCED: self.json_schema.name}
        return {}

    def instruction(self) -> str | None:
        """The instruction this format adds to the system message (None for text)."""
        if self.type == "json_object":
            return "Respond with a single valid JSON object and nothing else."
        if self.type == "json_schema" and self.json_schema is not None:
            schema = json.dumps(self.json_schema.schema_ or {}, ensure_ascii=False)
            return ("Respond with a single valid JSON object and nothing else, conforming "
                    f"to this JSON schema ({self.json_schema.name}): {schema}")
        return None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=lim.MAX_MESSAGES)
    tools: list[ToolDef] | None = Field(None, max_length=lim.MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] \
        | None = None

    def template_options(self) -> TemplateOptions:
        return options(None, self.reasoning_effort)

    def template_messages(self) -> list[dict[str, Any]]:
        """The chat template's input: developer → system, volatile header lines stripped,
        tool-call arguments as mappings, a response format's instruction in the system prompt."""
        out = [m.template_message() for m in self.messages]
        if out and out[0]["role"] == "system":
            out[0]["content"] = strip_volatile(out[0]["content"])
        if self.response_format and (note := self.response_format.instruction()):
            if out[0]["role"] == "system":  # the end of the system prompt: stable across turns
                out[0]["content"] = f"{out[0]['content']}\n\n{note}" if out[0]["content"] else note
            else:
                out.insert(0, {"role": "system", "content": note})
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(SamplingFields):
    prompt: Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)] | list[int] = Field(
        description="A string, or a list of token ids.")
    echo: bool = False
