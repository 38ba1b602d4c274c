"""Reasoning parsers per model family, in a registry; one module per parser.

A model's ``reasoning_parser`` (``deploy.config.model.ModelConfig``; the family names of
``router.output.tool_parsers``, checked when the config loads) picks the parser; unset, it
is detected once from the chat template (and the tokenizer's added tokens); ``"none"``
turns reasoning parsing off. A model whose family is not
recognised gets no parser: its text passes through as the answer (logged once).

- ``think`` (``router.output.reasoning_parsers.think``): ``qwen3``, ``deepseek-r1``,
  ``deepseek-v3.1`` (V3.1/V3.2), ``glm-4.5``, ``minimax-m2``, ``kimi-k2`` (vLLM's
  ``qwen3``, ``deepseek_r1``, ``deepseek_v3``, ``glm45``, ``minimax_m2``, ``kimi_k2``).
- ``harmony`` (``router.output.reasoning_parsers.harmony``): ``gpt-oss`` (vLLM's
  ``openai_gptoss``).

Per request, ``for_request`` builds a fresh parser and tells it whether the prompt
already opened the reasoning (the rendered prompt ends with the opener). The
reasoning parser runs first; the tool-call parser reads the answer text it emits
(``router.output.events``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deploy.config.model import MODEL_CHECKS, ModelConfig
from router.output.reasoning_parsers import harmony
from router.output.reasoning_parsers.base import Reasoning, ReasoningParser
from router.output.reasoning_parsers.harmony import HarmonyParser
from router.output.reasoning_parsers.think import ThinkParser
from router.prompt.tokenizer import ChatTokenizer

__all__ = ["Reasoning", "ReasoningParser", "SPECS", "fit_history", "for_request", "resolve"]
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Spec:
    """One family: how to build its parser and how to recognise its chat template."""

    name: str
    make: Callable[[bool], ReasoningParser]  # argument: the prompt opened the reasoning
    opener: str  # at the end of the rendered prompt: the output starts inside reasoning
    detect: Callable[[str], bool]
    # Past reasoning as the family's template accepts it (None: as normalised).
    fit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None


def _has(*parts: str) -> Callable[[str], bool]:
    return lambda template: all(p in template for p in parts)


_KIMI_CALLS = "<|tool_calls_section_begin|>"
# Most specific first: every family but harmony writes <think>.
SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("gpt-oss", HarmonyParser, "", _has("<|channel|>", "analysis"), harmony.fit_history),
    Spec("kimi-k2", lambda inside: ThinkParser(inside, implicit_ends=(_KIMI_CALLS,)),
         "<think>", _has(_KIMI_CALLS, "<think>")),
    Spec("minimax-m2", ThinkParser, "<think>", _has("]~b]", "<think>")),
    Spec("glm-4.5", ThinkParser, "<think>", _has("[gMASK]", "<think>")),
    Spec("deepseek-v3.1", ThinkParser, "<think>", _has("<｜Assistant｜>", "<think>", "thinking")),
    Spec("deepseek-r1", ThinkParser, "<think>", _has("<｜Assistant｜>", "<think>")),
    # Qwen3-Coder/3.5 may start a call without closing the reasoning (vLLM's qwen3 parser).
    Spec("qwen3", lambda inside: ThinkParser(inside, implicit_ends=("<tool_call>",)),
         "<think>", _has("<think>")),
)}


def _check_reasoning_parser(model: ModelConfig) -> None:
    name = model.reasoning_parser
    if name is not None and name != "none" and name not in SPECS:
        raise ValueError(f"reasoning_parser {name!r} is not a known reasoning format; "
                         f"known: {sorted(SPECS)} or 'none'")


MODEL_CHECKS.append(_check_reasoning_parser)  # config validation checks the name


def detect(template: str | None, think_tokens: bool = False) -> str | None:
    """The family of a chat template (first match); ``think_tokens``: the tokenizer has
    ``<think>``/``</think>`` as added tokens (then ``qwen3``'s parser if nothing else)."""
    for spec in SPECS.values():
        if template and spec.detect(template):
            return spec.name
    return "qwen3" if think_tokens else None


@functools.lru_cache(maxsize=64)
def _template_spec(template: str) -> Spec | None:
    name = detect(template)
    return SPECS[name] if name else None


def fit_history(template: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with its past reasoning in the shape the chat template accepts
    (the template's own family: this is about rendering, whatever parses the output)."""
    spec = _template_spec(template)
    return spec.fit(messages) if spec is not None and spec.fit is not None else messages


@functools.lru_cache(maxsize=64)
def _resolved(model: str, configured: str | None, template: str, think_tokens: bool
              ) -> Spec | None:
    if configured == "none":
        return None
    name = configured or detect(template, think_tokens)
    if name is None:  # cached: logged once per model
        log.info("model %s: no reasoning format recognised in its chat template; its "
                 "output passes through as the answer (set reasoning_parser to choose)", model)
        return None
    return SPECS[name]


def resolve(model: ModelConfig, tok: ChatTokenizer) -> Spec | None:
    """The model's reasoning family: configured, else detected (cached per model)."""
    think = tok.token_id("<think>") is not None and tok.token_id("</think>") is not None
    return _resolved(model.name, model.reasoning_parser, tok.template_source, think)


def for_request(model: ModelConfig, tok: ChatTokenizer, prompt_ids: list[int]
                ) -> ReasoningParser | None:
    """A fresh parser for one generation, or None (text passes through)."""
    spec = resolve(model, tok)
    if spec is None:
        return None
    inside = bool(spec.opener) and tok.decode(prompt_ids[-16:]).rstrip().endswith(spec.opener)
    return spec.make(inside)
