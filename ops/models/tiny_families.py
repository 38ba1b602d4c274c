"""Model families the tiny model can be built as (``make-model --family F``).

Each family names its public chat template (``ops/models/chat_templates``, sources and licences in
its README) and the special tokens that template and kvroute's parsers for it use, so the
tiny tokenizer encodes each marker as one id, as the real model's does. The strings are
copied from each template and ``router/output/tool_parsers`` / ``router/output/reasoning_parsers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES_DIR = Path(__file__).with_name("chat_templates")
DEFAULT_FAMILY = "qwen2.5"  # the ChatML template built into ops/models/tiny_model.py


@dataclass(frozen=True)
class Family:
    """A family's template file and tokens. ``control`` tokens are special (role and turn
    markers); ``markers`` are plain added tokens (like Qwen's ``<tool_call>``) that tool
    and reasoning parsers read in the decoded text. ``stops`` end generation besides eos."""

    template: str
    eos: str
    bos: str | None
    control: tuple[str, ...]
    markers: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()

    def template_text(self) -> str:
        return (TEMPLATES_DIR / self.template).read_text(encoding="utf-8")

    def tokens(self) -> tuple[str, ...]:
        """Every added token, bos/eos first, without repeats, in a fixed order."""
        seen = [t for t in (self.bos, self.eos) if t]
        for t in (*self.control, *self.stops, *self.markers):
            if t not in seen:
                seen.append(t)
        return tuple(seen)


_CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_HERMES = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_THINK = ("<think>", "</think>")

FAMILIES: dict[str, Family] = {
    "qwen3": Family("Qwen-Qwen3-0.6B.jinja", "<|im_end|>", None, _CHATML, (*_HERMES, *_THINK)),
    "qwen3-coder": Family("Qwen3-Coder.jinja", "<|im_end|>", None, _CHATML, _HERMES),
    "gpt-oss": Family(
        "openai-gpt-oss-120b.jinja", "<|return|>", "<|startoftext|>",
        ("<|start|>", "<|channel|>", "<|message|>", "<|end|>",
         "<|constrain|>"),
        stops=("<|call|>",),
    ),
    "deepseek-v3.1": Family(
        "deepseek-ai-DeepSeek-V3.1.jinja", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>",
        ("<｜User｜>", "<｜Assistant｜>"),
        ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
         "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
         "<｜tool▁output▁end｜>", *_THINK),
    ),
    "glm-4.5": Family(
        "GLM-4.6.jinja", "<|endoftext|>", None,
        ("[gMASK]", "<sop>", "<|system|>", "<|assistant|>"),
        (*_HERMES, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", *_THINK),
        stops=("<|user|>", "<|observation|>"),
    ),
    "kimi-k2": Family(
        "moonshotai-Kimi-K2.jinja", "<|im_end|>", "[BOS]",
        ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"),
        ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_end|>", "<|tool_call_argument_begin|>"),
    ),
    "minimax-m2": Family(
        "MiniMax-M2.jinja", "[e~[", "]~!b[", ("]~b]",),
        ("<minimax:tool_call>", "</minimax:tool_call>", *_THINK),
    ),
    "mistral": Family(
        "Mistral-Small-3.2-24B-Instruct-2506.jinja", "</s>", "<s>",
        ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
         "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CONTENT]", "[IMG]"),
        ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    ),
}
FAMILY_NAMES: tuple[str, ...] = (DEFAULT_FAMILY, *FAMILIES)
