"""OpenAI request schemas (the subset kvroute serves), validated by pydantic.

Unknown top-level fields are ignored, as OpenAI-compatible servers commonly do,
so newer SDKs keep working; known fields are checked strictly.

Which field is honoured, refused or ignored is the field rule's
(``router.api.common.fields``), which runs on the raw body first.

``response_format`` (``json_object``, ``json_schema`` strict or not) and vLLM's
``structured_outputs`` / ``guided_*`` fields (``router.api.openai.structured``) become a
decoding constraint the engine enforces (``ResponseFormat.constraint``); nothing is added to
the prompt, so the prompt and its cached prefix stay the client's own.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.api.common import limits as lim
from router.api.common.fields import Checked
from router.api.common.sampling import OutputControls, check_min_tokens, check_stops, stop_tuple
from router.api.common.structured import json_schema
from router.api.openai.structured import StructuredOutputs
from router.errors import ApiError
from router.output.reasoning_parsers.controls import options, with_past_reasoning
from router.prompt.template import strip_volatile
from router.prompt.tokenizer import TemplateOptions
from workers.protocol import Constraint

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seed: engines seed 64-bit generators
MAX_LOGPROBS = 20  # top logprobs per token: OpenAI's chat bound, vLLM's max_logprobs default
MAX_CHOICES = 128  # n, and a batched prompt's prompts × n: OpenAI's bound on n


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
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk (with include_usage)


class SamplingFields(OutputControls):
    """OpenAI's sampling fields and vLLM's (``OutputControls``), shared by chat and
    completions."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)  # vLLM's own bounds
    n: int | None = Field(1, ge=1, le=MAX_CHOICES)  # null: 1 (router.api.common.fanout)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a session key (router.api.common.identity)
    # structured outputs, vLLM's names (router.api.openai.structured)
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)
    guided_choice: list[Any] | None = Field(None, max_length=256)
    guided_grammar: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stops(v)

    @model_validator(mode="after")
    def _min_tokens(self) -> SamplingFields:
        try:
            check_min_tokens(self.min_tokens, self.output_limit())
        except ValueError as e:
            raise ApiError(400, f"min_tokens: {e}", "invalid_request", "min_tokens") from None
        return self

    def stop_list(self) -> tuple[str, ...]:
        return stop_tuple(self.stop)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def copies(self) -> int:
        return self.n or 1


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

    def constraint(self) -> Constraint | None:
        """What decoding is held to (None for text): the schema, strict or not, else any
        JSON object."""
        if self.type == "json_object":
            return Constraint("json_object")
        if self.type == "json_schema" and self.json_schema is not None:
            return json_schema(self.json_schema.schema_)
        return None


class ChatCompletionRequest(SamplingFields, Checked):
    field_api = "chat"
    messages: list[ChatMessage] = Field(min_length=1, max_length=lim.MAX_MESSAGES)
    tools: list[ToolDef] | None = Field(None, max_length=lim.MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] \
        | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's

    def template_options(self) -> TemplateOptions:
        return options(None, self.reasoning_effort)

    def template_messages(self) -> list[dict[str, Any]]:
        """The chat template's input: developer → system, volatile header lines stripped,
        tool-call arguments as mappings."""
        out = [m.template_message() for m in self.messages]
        if out and out[0]["role"] == "system":
            out[0]["content"] = strip_volatile(out[0]["content"])
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


COMPLETION_MAX_TOKENS = 16  # completions' max_tokens when unset, as OpenAI's and vLLM's
Text = Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)]


class CompletionRequest(SamplingFields, Checked):
    field_api = "completions"
    prompt: (Text | list[int] | Annotated[list[Text], Field(min_length=1)]
             | Annotated[list[list[int]], Field(min_length=1)]) = Field(
        description="A string or a list of token ids; or a batch: a list of strings or of "
        "token-id lists (one choice per prompt and copy, OpenAI's and vLLM's batched prompt).")
    echo: bool = False
    best_of: int | None = Field(None, ge=1)  # only equal to n (router.api.openai.choices)
    response_format: ResponseFormat | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's bound (OpenAI: 5)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        """A batch of one prompt (lm-eval's ``[[ids]]``) is that prompt."""
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
            return v[0]
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the batch (one for a single prompt)."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return [p]  # type: ignore[list-item]  # a string or one id list
        return list(p)  # type: ignore[arg-type]
