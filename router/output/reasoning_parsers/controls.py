"""A request's reasoning controls → the variables thinking templates read.

Each API says it its own way: chat's ``reasoning_effort``, Responses'
``reasoning.effort``, Anthropic's ``thinking`` (``enabled`` with ``budget_tokens``,
``adaptive``, ``disabled``) and ``output_config.effort``. Templates read:

- ``enable_thinking`` (Qwen3, GLM-4.5; false renders an empty ``<think></think>``),
- ``thinking`` (DeepSeek-V3.1/V3.2, Kimi; true opens ``<think>`` in the prompt),
- ``reasoning_effort`` (gpt-oss: ``low``/``medium``/``high`` in its system message).

All three are set together; a template ignores those it does not use. A request
without controls sets none (each template's own default). Effort ``none`` turns
thinking off (gpt-oss cannot: it gets ``low``).
"""

from __future__ import annotations

from typing import Any

from router.prompt.tokenizer import TemplateOptions

# The API efforts onto the three gpt-oss levels.
_LEVEL = {"minimal": "low", "low": "low", "medium": "medium", "high": "high",
          "xhigh": "high", "max": "high", "none": "low"}
# Anthropic budget_tokens → effort: at most 4k tokens low, at most 16k medium, above high.
_BUDGETS = ((4096, "low"), (16384, "medium"))


def options(enabled: bool | None, effort: str | None = None) -> TemplateOptions:
    """The template variables for thinking on/off (None: unsaid) and an effort (one the
    templates do not know is unsaid)."""
    effort = effort if effort in _LEVEL else None
    if effort == "none":
        enabled = False
    if enabled is None and effort is None:
        return ()
    on = enabled is not False
    out: TemplateOptions = (("enable_thinking", on), ("thinking", on))
    level = _LEVEL.get(effort or "")
    return (*out, ("reasoning_effort", level)) if level else out


def budget_effort(budget_tokens: int | None) -> str | None:
    if budget_tokens is None:
        return None
    return next((name for limit, name in _BUDGETS if budget_tokens <= limit), "high")


def with_past_reasoning(message: dict[str, Any], text: str | None) -> dict[str, Any]:
    """An assistant message for the template, carrying the reasoning a client sent back
    under the names templates read: ``reasoning_content`` (Qwen3, GLM-4.5, Kimi-K2,
    MiniMax-M2, DeepSeek) and ``thinking`` (gpt-oss). Each template decides what of it
    to render (most keep only the reasoning after the last user message)."""
    if text:
        message["reasoning_content"] = text
        message["thinking"] = text
    return message
