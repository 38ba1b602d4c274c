"""OpenAI Responses request schema (the subset kvroute serves), validated by pydantic.

As with the other APIs, unknown top-level fields and unknown fields inside known
items are ignored (Codex adds fields often), and known fields are checked
strictly. ``input`` items are a union tagged by ``type`` (a bare
``{"role", "content"}`` is a ``message``): an unknown item type, content part
type or tool type is a 400 naming it. ``input_image`` / ``input_file`` parts
parse so the error can say why they are refused (text-only models,
``router.api.responses.normalize``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from router.api.common.fields import Checked
from router.api.common.limits import (
    MAX_BLOCKS,
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_MESSAGES,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
)
from router.api.common.sampling import EngineControls, check_stops
from router.api.openai.schema import INT64_MAX, INT64_MIN, JsonSchemaFormat, ResponseFormat
from router.errors import ApiError


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(_Lenient):
    """A freeform tool: the model writes its input as plain text (Codex's ``apply_patch``);
    offered to the model as a function of one string (``router.api.responses.tools``)."""

    type: Literal["custom"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    format: dict[str, Any] | None = None


class NamespaceTool(_Lenient):
    """A named group of function and custom tools (Codex: ``multi_agent_v1``, ``clock``)."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] = Field(
        default_factory=list, max_length=512)


class ToolSearchTool(_Lenient):
    """Search over deferred tools; kvroute serves the client-executed kind."""

    type: Literal["tool_search"]
    execution: Literal["client", "server"] = "client"
    description: str | None = None
    parameters: dict[str, Any] | None = None


class WebSearchTool(_Lenient):
    """Accepted and left out of the prompt: Codex offers it on every request."""

    type: Literal["web_search", "web_search_preview"]


class HostedTool(_Lenient):
    """A tool OpenAI runs itself: kvroute cannot run it (a 400 naming it)."""

    type: Literal["file_search", "code_interpreter", "computer_use_preview", "computer",
                  "image_generation", "mcp", "local_shell", "shell", "apply_patch"]


Tool = Annotated[FunctionTool | CustomTool | NamespaceTool | ToolSearchTool | WebSearchTool
                 | HostedTool, Field(discriminator="type")]


class TextPart(_Lenient):
    """``input_text`` (user, system, developer) and ``output_text`` (assistant)."""

    type: Literal["input_text", "output_text", "text", "summary_text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class RefusalPart(_Lenient):
    type: Literal["refusal"]
    refusal: str = ""


class ImagePart(_Lenient):
    type: Literal["input_image"]


class FilePart(_Lenient):
    type: Literal["input_file", "input_audio"]


_SEALED = re.compile(r"gAAAA[A-Za-z0-9_=-]*")  # a Fernet token: content OpenAI sealed


class EncryptedPart(_Lenient):
    """What the model wrote for a tool argument Codex marks ``encrypted`` (the
    ``message`` of ``collaboration.spawn_agent``: a sub-agent's task), passed on verbatim
    in an ``agent_message``. OpenAI's models write it sealed (a Fernet token, which kvroute
    cannot read: dropped, as a reasoning item's ``encrypted_content`` is); kvroute's models
    write plain text, which is the message's own text."""

    type: Literal["encrypted_content"]
    encrypted_content: str | None = Field(None, max_length=MAX_TEXT_CHARS)

    def text(self) -> str:
        found = self.encrypted_content or ""
        return "" if _SEALED.fullmatch(found) else found


Part = Annotated[TextPart | RefusalPart | ImagePart | FilePart | EncryptedPart,
                 Field(discriminator="type")]


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: (Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
              | Annotated[list[Part], Field(max_length=MAX_BLOCKS)])


class AgentMessageItem(_Lenient):
    """A message between Codex agents (``collaboration.spawn_agent``: the parent's task
    to a child, a child's report): rendered as a user message naming its author."""

    type: Literal["agent_message"]
    author: str | None = Field(None, max_length=MAX_ID_CHARS)
    recipient: str | None = Field(None, max_length=MAX_ID_CHARS)
    content: (Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
              | Annotated[list[Part], Field(max_length=MAX_BLOCKS)]) = ""


class OpaqueItem(_Lenient):
    """Items with nothing kvroute can render: a compaction's sealed summary
    (``compaction``, ``compaction_summary``), Codex's ``ghost_snapshot`` (a git snapshot
    for undo) and ``web_search_call`` (a search OpenAI ran). Accepted and dropped."""

    type: Literal["compaction", "compaction_summary", "ghost_snapshot", "web_search_call"]
    encrypted_content: str | None = Field(None, max_length=MAX_TEXT_CHARS)


class LocalShellCallItem(_Lenient):
    """A call of OpenAI's ``local_shell`` tool in a conversation another server began; its
    output comes as a ``function_call_output`` with the same ``call_id``."""

    type: Literal["local_shell_call"]
    call_id: str | None = Field(None, max_length=MAX_ID_CHARS)
    action: dict[str, Any] = Field(default_factory=dict)


class _Call(_Lenient):
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    namespace: str | None = Field(None, max_length=128)


class _Output(_Lenient):
    call_id: str = Field(min_length=1, max_length=256)
    output: (Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
             | Annotated[list[Part], Field(max_length=MAX_BLOCKS)]) = ""


class FunctionCallItem(_Call):
    type: Literal["function_call"]
    arguments: str = Field("{}", max_length=MAX_TEXT_CHARS)


class FunctionCallOutputItem(_Output):
    type: Literal["function_call_output"]


class CustomToolCallItem(_Call):
    """A call of a freeform (``custom``) tool, such as Codex's ``apply_patch``."""

    type: Literal["custom_tool_call"]
    input: str = Field("", max_length=MAX_TEXT_CHARS)


class CustomToolCallOutputItem(_Output):
    type: Literal["custom_tool_call_output"]


class AdditionalToolsItem(_Lenient):
    """Tools made available from this point on (Codex sends its tools this way)."""

    type: Literal["additional_tools"]
    role: Literal["developer"] = "developer"
    tools: list[Tool] = Field(default_factory=list, max_length=512)


class ToolSearchCallItem(_Lenient):
    type: Literal["tool_search_call"]
    call_id: str | None = Field(None, max_length=256)
    arguments: Any = None
    execution: Literal["client", "server"] | None = None


class ToolSearchOutputItem(_Lenient):
    """The tools a client-side search loaded: callable from here on."""

    type: Literal["tool_search_output"]
    call_id: str | None = Field(None, max_length=256)
    tools: list[Tool] = Field(default_factory=list, max_length=512)


class ReasoningText(_Lenient):
    type: str = "reasoning_text"
    text: str = Field("", max_length=MAX_TEXT_CHARS)


class ReasoningItem(_Lenient):
    """Earlier reasoning: its ``content`` texts (else its ``summary``) are the next
    assistant message's past reasoning; ``encrypted_content`` is ignored."""

    type: Literal["reasoning"]
    content: list[ReasoningText] | None = Field(None, max_length=MAX_MESSAGES)
    summary: list[ReasoningText] = Field(default_factory=list, max_length=MAX_MESSAGES)

    def text(self) -> str:
        return "".join(p.text for p in self.content or self.summary)


class ReasoningConfig(_Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = \
        None  # passed to thinking templates
    summary: str | None = None  # accepted; kvroute returns the reasoning, not a summary


_OPAQUE = frozenset(get_args(OpaqueItem.model_fields["type"].annotation))  # one tag for all


def _item_type(value: Any) -> str:
    """The item's tag; bracketed, so a 400 names ``input.N.field``, not the tag (the
    error path drops union labels, ``router.api.common.request``)."""
    kind = value.get("type", "message") if isinstance(value, dict) \
        else getattr(value, "type", "message")
    return "[opaque]" if kind in _OPAQUE else f"[{kind}]"


InputItem = Annotated[
    Annotated[MessageItem, Tag("[message]")]
    | Annotated[FunctionCallItem, Tag("[function_call]")]
    | Annotated[FunctionCallOutputItem, Tag("[function_call_output]")]
    | Annotated[CustomToolCallItem, Tag("[custom_tool_call]")]
    | Annotated[CustomToolCallOutputItem, Tag("[custom_tool_call_output]")]
    | Annotated[AdditionalToolsItem, Tag("[additional_tools]")]
    | Annotated[ToolSearchCallItem, Tag("[tool_search_call]")]
    | Annotated[ToolSearchOutputItem, Tag("[tool_search_output]")]
    | Annotated[ReasoningItem, Tag("[reasoning]")]
    | Annotated[AgentMessageItem, Tag("[agent_message]")]
    | Annotated[LocalShellCallItem, Tag("[local_shell_call]")]
    | Annotated[OpaqueItem, Tag("[opaque]")],
    Discriminator(_item_type),
]


class NamedTool(_Lenient):
    type: Literal["function", "custom"]
    name: str = Field(min_length=1)
    namespace: str | None = None


class TextFormat(_Lenient):
    """``text.format``: the Responses spelling of chat's ``response_format``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> TextFormat:
        try:  # the chat API's rules at parse time
            self.as_response_format()
        except ValidationError as e:
            raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    def as_response_format(self) -> ResponseFormat:
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        schema = JsonSchemaFormat(name=self.name, schema=self.schema_, strict=self.strict,
                                  description=self.description)
        return ResponseFormat(type="json_schema", json_schema=schema)


class TextConfig(_Lenient):
    format: TextFormat | None = None
    verbosity: str | None = None  # accepted; the engines have no verbosity control


_TOOL_ITEMS = ("additional_tools", "tool_search_output")


def _functions(tools: Any, where: str, left: int) -> int:
    """How many functions ``tools`` holds (a namespace: each of its tools); a 400 naming
    the tool that goes past ``left``."""
    n = 0
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        inner = tool.get("tools") if isinstance(tool, dict) else None
        n += len(inner) if isinstance(inner, list) else 1
        if n > left:
            raise ApiError(400, f"{where}.{i}: more than {MAX_TOOLS} tools in all (namespaces "
                           "and additional_tools count each tool they hold)", "too_many_tools",
                           f"{where}.{i}")
    return n


class ResponsesRequest(EngineControls, Checked):
    field_api = "responses"
    model: str = Field(min_length=1)
    input: (Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
            | Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]) = Field(
        description="A string, or a list of input items.")
    instructions: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = None
    prompt_cache_key: str | None = None
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    stream: bool = False
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)  # vLLM's Responses extras
    stop: str | list[str] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stops(v)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = Field(None, max_length=16)

    def output_logprobs(self) -> int | None:
        """The top logprobs per output token when ``include`` asks for the output text's
        logprobs (vLLM's rule: ``top_logprobs`` alone returns none), else None."""
        if self.include and "message.output_text.logprobs" in self.include:
            return self.top_logprobs or 0
        return None

    @model_validator(mode="before")
    @classmethod
    def _tool_count(cls, data: Any) -> Any:
        """Every function the request holds, namespaces and tool-carrying items included,
        against the tool cap, on the raw JSON: before 10,000 tools are validated."""
        if isinstance(data, dict):
            left = MAX_TOOLS - _functions(data.get("tools"), "tools", MAX_TOOLS)
            items = data.get("input")
            for i, item in enumerate(items if isinstance(items, list) else ()):
                if isinstance(item, dict) and item.get("type") in _TOOL_ITEMS:
                    left -= _functions(item.get("tools"), f"input.{i}.tools", left)
        return data

    def items(self) -> list[Any]:
        """``input`` as items: a string is one user message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)
