"""Family detection from each family's public chat template (tests/chat_templates) and
from the tokenizer's special tokens, and the model config's override."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.tool_parsers import FAMILIES, detect_family

TEMPLATES = Path(__file__).parents[2] / "chat_templates"
EXPECTED = {
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3-coder",
    "openai-gpt-oss-120b.jinja": "gpt-oss",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1",
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek-v3.2",
    "GLM-4.6.jinja": "glm-4.5",
    "Kimi-K2-Instruct.jinja": "kimi-k2",
    "MiniMax-M2.jinja": "minimax-m2",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3-json",
}


@pytest.mark.parametrize(("file", "family"), sorted(EXPECTED.items()))
def test_each_family_is_detected_from_its_own_template(file: str, family: str) -> None:
    assert detect_family((TEMPLATES / file).read_text()) == family


def test_every_registered_family_has_a_template_here() -> None:
    assert set(EXPECTED.values()) == set(FAMILIES)
    assert all(name == name.lower() and "_" not in name for name in FAMILIES)  # kebab-case


def test_special_tokens_count_and_unknown_templates_give_none() -> None:
    assert detect_family("{{ messages }}", "<|tool_calls_section_begin|>\n<|im_end|>") == "kimi-k2"
    assert detect_family("{{ message.content }}") is None
    assert detect_family(None) is None and detect_family(None, "") is None
