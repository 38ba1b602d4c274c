"""Anthropic Messages request schemas (the subset kvroute serves), validated by pydantic.

Like the OpenAI schemas: unknown top-level fields and unknown fields inside known
blocks are ignored, so newer clients (Claude Code sends new fields often) keep
working; known fields are checked strictly. Content blocks are a union tagged by
``type``: an unknown block type is a 400 naming the type. ``image`` and
``document`` blocks parse (so the error can say why) and are refused later, in
``router.api.anthropic.normalize``: kvroute serves text-only models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from router.api.common import limits as lim
from router.api.common.fields import Checked


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str = Field(max_length=lim.MAX_TEXT_CHARS)


class ImageBlock(_Lenient):
    type: Literal["image"]


class DocumentBlock(_Lenient):
    type: Literal["document"]


class ThinkingBlock(_Lenient):
    type: Literal["thinking"]
    thinking: str = Field("", max_length=lim.MAX_TEXT_CHARS)


class RedactedThinkingBlock(_Lenient):
    type: Literal["redacted_thinking"]


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=lim.MAX_ID_CHARS)
    name: str = Field(min_length=1, max_length=lim.MAX_ID_CHARS)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolReferenceBlock(_Lenient):
    """A tool search result naming a (deferred) tool: expanded to its definition."""

    type: Literal["tool_reference"]
    tool_name: str = Field(min_length=1, max_length=128)


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock,
                       Field(discriminator="type")]


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=lim.MAX_ID_CHARS)
    content: (Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)]
              | Annotated[list[ResultPart], Field(max_length=lim.MAX_BLOCKS)] | None) = None
    is_error: bool = False


ContentBlock = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ThinkingBlock | RedactedThinkingBlock
    | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class Message(_Lenient):
    """``system`` inside ``messages``: Claude Code sends its environment block this way
    (beta ``mid-conversation-tool-changes-2026-07-01``)."""

    role: Literal["user", "assistant", "system"]
    content: (Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)]
              | Annotated[list[ContentBlock], Field(max_length=lim.MAX_BLOCKS)])


class Tool(_Lenient):
    """A client tool. Server tools (``web_search_…``, ``bash_…``) carry another ``type``.

    ``defer_loading`` (tool search): the tool is not in the prompt until a search
    result names it; Claude Code's ``ToolSearch`` returns found definitions as text."""

    type: str | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(None, max_length=lim.MAX_DESCRIPTION_CHARS)
    input_schema: dict[str, Any] | None = None
    defer_loading: bool = False


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Metadata(_Lenient):
    user_id: str | None = None


class ThinkingConfig(_Lenient):
    """``enabled`` (with ``budget_tokens``), ``adaptive`` or ``disabled``: passed to
    thinking templates (``router.output.reasoning_parsers.controls``)."""

    type: str | None = None
    budget_tokens: int | None = Field(None, ge=0)


class OutputConfig(_Lenient):
    """``effort`` goes to thinking templates; ``format`` (structured outputs,
    ``{"type": "json_schema", "schema": {..}}``) constrains decoding to the schema."""

    effort: str | None = None
    format: dict[str, Any] | None = None

    @field_validator("format")
    @classmethod
    def _json_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and (v.get("type") != "json_schema"
                              or not isinstance(v.get("schema"), dict)):
            raise ValueError('format must be {"type": "json_schema", "schema": {..}}')
        return v


class Safeguard(_Lenient):
    """A safety check the client asks for on the reply's tool calls (Claude Code's auto
    mode: ``dangerous_tool_use`` with its permission rules as ``classifier_context``);
    answered in ``message_delta`` (``router.api.anthropic.safeguards``)."""

    type: str = Field(min_length=1, max_length=128)
    classifier_context: dict[str, Any] | None = None


class CountTokensRequest(_Lenient):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1, max_length=lim.MAX_MESSAGES)
    system: (Annotated[str, Field(max_length=lim.MAX_TEXT_CHARS)]
             | Annotated[list[TextBlock], Field(max_length=lim.MAX_BLOCKS)] | None) = None
    tools: list[Tool] | None = Field(None, max_length=lim.MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # Accepted and not applied (docs/api.md): context edits (clearing old thinking or tool
    # results) would move the cached prefix.
    context_management: dict[str, Any] | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest, Checked):
    field_api = "messages"
    max_tokens: int = Field(ge=1)
    metadata: Metadata | None = None
    safeguards: list[Safeguard] | None = Field(None, max_length=16)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # 0: off

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if v is not None and any(len(s) > 512 for s in v):  # as openai_schema.MAX_STOP_CHARS
            raise ValueError("a stop sequence may have at most 512 characters")
        return v
