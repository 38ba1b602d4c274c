"""Family detection from each family's public chat template (ops/ and tests/chat_templates) and
from the tokenizer's special tokens (the config's override:
tests/router/output/test_tool_calls.py)."""

from __future__ import annotations

import pytest

from router.output.tool_parsers import FAMILIES, detect_family
from tests.router.output.tool_parsers.family_models import TEMPLATE_OF, template_path

# Each family's template, and the other templates kept for a family.
EXPECTED = {file: family for family, file in TEMPLATE_OF.items()} | {
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral"}


@pytest.mark.parametrize(("file", "family"), sorted(EXPECTED.items()))
def test_each_family_is_detected_from_its_own_template(file: str, family: str) -> None:
    assert detect_family(template_path(file).read_text()) == family


def test_every_registered_family_has_a_template_here() -> None:
    assert set(EXPECTED.values()) == set(FAMILIES)
    assert all(name == name.lower() and "_" not in name for name in FAMILIES)  # kebab-case


def test_special_tokens_count_and_unknown_templates_give_none() -> None:
    assert detect_family("{{ messages }}", "<|tool_calls_section_begin|>\n<|im_end|>") == "kimi-k2"
    # The template wins over tokens its model may never write (the tiny tokenizer has
    # <tool_call> as a token whatever template a test gives it).
    assert detect_family("{{ '[TOOL_CALLS]' }}", "<tool_call>") == "mistral"
    assert detect_family("{{ message.content }}") is None
    assert detect_family(None) is None and detect_family(None, "") is None
