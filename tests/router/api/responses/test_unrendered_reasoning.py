"""Stored past reasoning is what a continuation renders, so it is tokenized and charged:
what no continuation can render is not stored (``ChatTokenizer.past_reasoning``,
``normalize.without_unrendered_reasoning``). Before, every turn's ``reasoning`` item was
stored and re-sent turn after turn, never rendered by the tiny model's template (nor by a
thinking template before the last user message), so never charged: the stored
conversation grew by a body a turn, for 1 prompt token."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.api.responses.normalize import without_unrendered_reasoning
from router.api.responses.store import StoredResponse
from router.prompt.tokenizer import ChatTokenizer
from tests.router.api.anthropic.test_anthropic_api import FakeCore
from tests.router.api.responses.test_responses_api import _post
from tests.router.output.tool_parsers.family_models import template_model_dir


@pytest.mark.parametrize(("template", "renders"), [
    (None, "none"), ("Qwen-Qwen3-0.6B.jinja", "after_last_user"),
    ("GLM-4.6.jinja", "after_last_user"), ("openai-gpt-oss-120b.jinja", "after_last_user"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "none")])
def test_what_each_template_renders_of_past_reasoning(
        tiny_model_dir: Path, tmp_path: Path, template: str | None, renders: str) -> None:
    """None: the tiny model's own ChatML template."""
    folder = tiny_model_dir if template is None else \
        template_model_dir(tiny_model_dir, template, tmp_path / "m")
    assert ChatTokenizer(str(folder)).past_reasoning == renders


def test_reasoning_a_continuation_may_render_is_kept() -> None:
    r = {"reasoning_content": "why", "thinking": "why"}
    chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", **r},
            {"role": "user", "content": "v"},
            {"role": "assistant", "content": "", "tool_calls": [], **r},
            {"role": "tool", "content": "out"}]
    kept = without_unrendered_reasoning(chat, "after_last_user")
    assert "reasoning_content" not in kept[1] and kept[3]["reasoning_content"] == "why"
    assert without_unrendered_reasoning(chat, "all") == chat
    assert not any("thinking" in m for m in without_unrendered_reasoning(chat, "none"))


def test_stored_conversations_do_not_grow_by_unrendered_reasoning(tiny_model_dir: Path
                                                                  ) -> None:
    """Five turns, each with 300 kB of ``reasoning`` and ``previous_response_id``, on a
    4,096-token model (a body may carry 1.18 MB). Before: the stored entry grew 300 kB a
    turn, none of it charged (300, 600, 900 kB raw), turn 4's was past the entry bound
    and not stored, so turn 5 was a 404; now each entry holds what a continuation
    renders (205 to 713 bytes)."""
    core = FakeCore(tiny_model_dir)
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text",
                                                   "text": "thought " * 37_500}]}
    prev, sizes = None, []
    for t in range(5):
        turn = [reasoning, {"role": "assistant", "content": f"answer {t}"},
                {"role": "user", "content": f"question {t}"}]
        r = _post(core, {"input": turn, "max_output_tokens": 1, "previous_response_id": prev})
        if r.status_code != 200:
            break
        prev = r.json()["id"]
        blob = core.store._recall(prev)  # None: over the entry bound, not stored
        sizes.append(None if blob is None else StoredResponse.decode(blob).raw_bytes)
    print(f"\nstored entry after each turn (raw JSON bytes): {sizes}; last {r.status_code}")
    assert r.status_code == 200, r.text[:300]  # before: turn 5 was a 404 (turn 4 too big)
    assert len(sizes) == 5 and all(n is not None and n < 2_000 for n in sizes), sizes
