"""Tool calls in a model's output: which family's parser a request gets.

The parsers live in ``router.output.tool_parsers`` (one module per family). A model's family
is its config's ``tool_parser`` if set, else detected once from its own chat template
and its tokenizer's special tokens (``family_for_model``); a model whose family is not
recognised is logged once and its output passes through as text. The events of a
generation come from ``router.output.events``. The request's tools
(in the template's OpenAI function shape, as all three APIs render them) give the
parser the parameters' JSON schemas, which the XML-style families need to type values.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from deploy.config import ModelConfig
from router.output.tool_parsers import (
    FAMILIES,
    Event,
    Schemas,
    ToolCall,
    ToolParser,
    detect_family,
    make_parser,
)
from router.prompt.tokenizer import resolve_model_dir

__all__ = ["FAMILIES", "Event", "ToolCall", "ToolParser", "detect_family",
           "family_for_model", "make_parser", "parser_for", "template_source"]

log = logging.getLogger(__name__)


def template_source(model_path: str) -> str | None:
    """The chat template text of a model folder, found as ``ChatTokenizer`` finds it."""
    folder = resolve_model_dir(model_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: tools may live in "tool_use"
        template = "\n".join(str(t.get("template", "")) for t in template)
    if not template and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    return template or None


def special_tokens(model_path: str) -> str:
    """The contents of the tokenizer's added tokens, one a line (markers live there)."""
    cfg = json.loads((resolve_model_dir(model_path) / "tokenizer_config.json").read_text())
    added = cfg.get("added_tokens_decoder") or {}
    return "\n".join(str(t.get("content", "")) for t in added.values() if isinstance(t, dict))


@functools.lru_cache(maxsize=64)
def family_for_model(model_path: str) -> str | None:
    """The tool-call family of a model, detected once from its template and tokens."""
    try:
        family = detect_family(template_source(model_path), special_tokens(model_path))
    except (OSError, ValueError):
        family = None
    if family is None:
        log.warning("no tool-call family recognised for %s (set tool_parser in its config; "
                    "known: %s): tool-call markup passes through as text",
                    model_path, ", ".join(sorted(FAMILIES)))
    return family


def schemas(tools: Sequence[Mapping[str, Any]] | None) -> Schemas:
    """Template tools (``{"type": "function", "function": {..}}``) → name → parameters."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else {}
    return out


def parser_for(model: ModelConfig, tools: Sequence[Mapping[str, Any]] | None
               ) -> ToolParser | None:
    """A fresh parser for one request to ``model`` offering ``tools``."""
    family = model.tool_parser or family_for_model(model.model_path)
    return make_parser(family, schemas(tools))
