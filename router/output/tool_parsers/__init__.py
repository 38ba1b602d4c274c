"""Tool-call parsers, one module per model family, registered by kebab-case name.

Each family module defines ``FAMILY`` (``router.output.tool_parsers.base.Family``): its
markers, the decoder of a tool-call section, and the markers its chat template (or
its tokenizer's special tokens) gives away. ``FAMILIES`` lists them in detection
order, most specific first (Qwen3-Coder's template also mentions hermes's
``<tool_call>``). A model config's ``tool_parser`` names one explicitly; an unknown
name fails when the config is loaded (``deploy.config.model.MODEL_CHECKS``).
"""

from __future__ import annotations

from deploy.config.model import MODEL_CHECKS, ModelConfig
from router.output.tool_parsers import (
    deepseek_v31,
    deepseek_v32,
    glm45,
    gpt_oss,
    hermes,
    kimi_k2,
    llama3_json,
    minimax_m2,
    mistral,
    qwen3_coder,
)
from router.output.tool_parsers.base import Event, Family, Schemas, ToolCall, ToolParser

__all__ = ["FAMILIES", "Event", "Family", "Schemas", "ToolCall", "ToolParser",
           "detect_family", "make_parser"]

FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in (
    gpt_oss, kimi_k2, deepseek_v32, deepseek_v31, minimax_m2, qwen3_coder, glm45,
    hermes, mistral, llama3_json,
)}


def detect_family(template: str | None, special_tokens: str = "") -> str | None:
    """The first registered family whose markers the chat template all mentions; failing
    that, whose markers the tokenizer's special tokens (joined in ``special_tokens``) do.
    The template comes first: it teaches the format, while a tokenizer may carry tokens
    its model never writes."""
    for source in (template or "", special_tokens):
        for family in FAMILIES.values():
            if source and all(s in source for s in family.detect):
                return family.name
    if template and '"parameters"' in template and "ipython" in template:  # Llama 3.x
        return llama3_json.FAMILY.name
    return None


def make_parser(family: str | None, schemas: Schemas | None = None) -> ToolParser | None:
    return FAMILIES[family].parser(schemas) if family in FAMILIES else None


def _check_tool_parser(model: ModelConfig) -> None:
    if model.tool_parser is not None and model.tool_parser not in FAMILIES:
        raise ValueError(f"tool_parser {model.tool_parser!r} is not a known tool-call family; "
                         f"known: {sorted(FAMILIES)}")


MODEL_CHECKS.append(_check_tool_parser)  # config validation checks the name (deploy.config.model)
