"""The tools of a Responses request, as the chat template sees them and as calls come back.

Codex offers tools in several shapes, all of which the model must see as plain
functions (what chat templates render) and whose calls must come back in the shape
the client offered:

- ``function``: the function itself; a call is a ``function_call``;
- ``custom`` (freeform, e.g. ``apply_patch``): a function of one string, ``input``;
  a call is a ``custom_tool_call`` with that ``input``;
- ``namespace`` ``ns`` holding the tools above: each as ``ns.name``; a call is as
  above, with ``namespace: ns``;
- ``tool_search`` with ``execution: client``: a function ``tool_search``; a call is
  a ``tool_search_call`` (the client searches and sends ``tool_search_output``);
- ``web_search``: nothing (kvroute has no search engine), so it is never called.

Other hosted tools (file search, code interpreter, MCP, ...) are refused with a 400
naming them. ``web_search`` is left out instead of refused because Codex offers it
on every request; refusing it would make Codex unusable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from router.api.common.limits import MAX_TEXT_CHARS, Expansion
from router.api.responses.schema import (
    CustomTool,
    FunctionTool,
    NamespaceTool,
    Tool,
    ToolSearchTool,
    WebSearchTool,
)
from router.errors import ApiError

CUSTOM_INPUT = "input"  # the one parameter a freeform tool is offered with
TOOL_SEARCH = "tool_search"


@dataclass(frozen=True, slots=True)
class ToolRef:
    """What a template-level function name stands for."""

    kind: Literal["function", "custom", "tool_search"]
    name: str
    namespace: str | None = None


def template_name(name: str, namespace: str | None) -> str:
    return f"{namespace}.{name}" if namespace else name


@dataclass
class ToolCatalog:
    """Template names → what they stand for; ``listed``: the template's tool list."""

    refs: dict[str, ToolRef] = field(default_factory=dict)
    listed: list[dict[str, Any]] = field(default_factory=list)
    room: Expansion = field(default_factory=lambda: Expansion(MAX_TEXT_CHARS))

    def add(self, tools: list[Tool], where: str) -> list[dict[str, Any]]:
        """Register ``tools``; their template functions (not yet listed)."""
        out: list[dict[str, Any]] = []
        for i, tool in enumerate(tools):
            out.extend(self._one(tool, f"{where}.{i}", None))
        return out

    def ref(self, name: str) -> ToolRef:
        return self.refs.get(name) or ToolRef("function", name)

    def _one(self, tool: Tool, where: str, namespace: str | None) -> list[dict[str, Any]]:
        if isinstance(tool, NamespaceTool):
            return [f for j, inner in enumerate(tool.tools)
                    for f in self._one(inner, f"{where}.tools.{j}", tool.name)]
        if isinstance(tool, WebSearchTool):
            return []
        self.room.add_tools(1, where)  # each function the template would list, counted
        if isinstance(tool, FunctionTool):
            ref = ToolRef("function", tool.name, namespace)
            params = tool.parameters or {"type": "object", "properties": {}}
            desc = tool.description
        elif isinstance(tool, CustomTool):
            ref = ToolRef("custom", tool.name, namespace)
            params = {"type": "object", "required": [CUSTOM_INPUT],
                      "properties": {CUSTOM_INPUT: {"type": "string"}}}
            desc = _custom_description(tool)
        elif isinstance(tool, ToolSearchTool):
            ref = ToolRef("tool_search", TOOL_SEARCH)
            params = tool.parameters or {"type": "object", "properties": {}}
            desc = tool.description
        else:
            raise ApiError(400, f"{where}: hosted tool {tool.type!r} is not supported: kvroute "
                           "serves function, custom, namespace and client tool_search tools, "
                           "which the client runs", "unsupported_tool", f"{where}.type")
        name = template_name(ref.name, namespace)
        self.refs[name] = ref
        fn: dict[str, Any] = {"name": name}
        if desc:
            fn["description"] = desc
        fn["parameters"] = params
        return [{"type": "function", "function": fn}]


def _custom_description(tool: CustomTool) -> str:
    text = tool.description or ""
    fmt = tool.format or {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        text += (f"\n\nWrite `{CUSTOM_INPUT}` in this {fmt.get('syntax', 'grammar')} "
                 f"grammar:\n{fmt['definition']}")
    return text.strip()
