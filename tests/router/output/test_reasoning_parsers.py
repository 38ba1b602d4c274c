"""Reasoning parsers on recorded model outputs: one feed, and streamed in random pieces.

Outputs come from vLLM's parser tests (vllm-project/vllm tests/reasoning/
test_qwen3_reasoning_parser.py, test_deepseekr1_reasoning_parser.py,
test_gptoss_reasoning_parser.py, test_kimi_k2_reasoning_parser.py) and the formats
from vllm/reasoning/*.py and openai/harmony docs/format.md. Streaming must give the
same reasoning and answer as one feed, with no markup leaking into either.
"""

from __future__ import annotations

import random

import pytest

from router.output.reasoning_parsers import SPECS, Reasoning, detect
from router.output.reasoning_parsers.base import ReasoningParser

TOOL_BODY = ("<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n"
             "</parameter>\n</function>\n</tool_call>")
HARMONY_R = "<|channel|>analysis<|message|>"
HARMONY_FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"
HARMONY_CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather "
                "<|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|call|>")

# (family, prompt opened the reasoning, output, reasoning, answer)
CASES = [
    ("qwen3", False, "<think>This is a reasoning section</think>This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("qwen3", False, "<think>\nLet me think.\n</think>\n\nHello!", "Let me think.", "Hello!"),
    ("qwen3", False, "<think>This is a reasoning\nsection</think>This is the rest\nThat",
     "This is a reasoning\nsection", "This is the rest\nThat"),
    ("qwen3", False, "<think>This is a reasoning section", "This is a reasoning section", ""),
    ("qwen3", False, "Some output without think tokens", "", "Some output without think tokens"),
    ("qwen3", False, "Answer with a <think> inside", "", "Answer with a <think> inside"),
    ("qwen3", False, "Say </think> here", "", "Say </think> here"),  # no reasoning: as is
    ("qwen3", True, "This is a reasoning section</think>This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("qwen3", True, "I need to read the file.\n\n" + TOOL_BODY,
     "I need to read the file.", TOOL_BODY),
    ("qwen3", False, "<think>\n\n</think>\n\nNo thoughts.", "", "No thoughts."),
    ("deepseek-r1", True, "This is a reasoning section</think>This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("deepseek-r1", True, "<think>This is a reasoning section</think>",
     "This is a reasoning section", ""),
    ("deepseek-v3.1", True, "Thinking.</think>The answer.", "Thinking.", "The answer."),
    ("glm-4.5", False, "<think>Plan.</think>\nDone.", "Plan.", "Done."),
    ("minimax-m2", True, "Plan it.\n</think>\n\nDone.", "Plan it.", "Done."),
    # vLLM tests/reasoning/test_minimax_m2_reasoning_parser.py (the prompt opened <think>)
    ("minimax-m2", True, "This is a reasoning section</think>This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("minimax-m2", True, "This is reasoning in progress", "This is reasoning in progress", ""),
    ("minimax-m2", True, "First line\nSecond line</think>Response first line\nResponse second",
     "First line\nSecond line", "Response first line\nResponse second"),
    ("minimax-m2", True, "</think>This is the response", "", "This is the response"),
    ("minimax-m2", True, "```python\nprint('hello')\n```</think>Here is the code.",
     "```python\nprint('hello')\n```", "Here is the code."),
    ("minimax-m2", True, "reasoning</think>content A</think>content B", "reasoning",
     "content Acontent B"),
    # vLLM tests/reasoning/test_glm4_moe_reasoning_parser.py
    ("glm-4.5", False, "<think>This is a reasoning section</think>This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("glm-4.5", False, "This is the rest", "", "This is the rest"),
    ("glm-4.5", False, "<think></think>This is the rest", "", "This is the rest"),
    ("glm-4.5", False, "<think>This is a reasoning section", "This is a reasoning section", ""),
    ("kimi-k2", False, "<think>Call a tool.<|tool_calls_section_begin|><|tool_call_begin|>x",
     "Call a tool.", "<|tool_calls_section_begin|><|tool_call_begin|>x"),
    ("kimi-k2", False, "<think>R</think>A", "R", "A"),
    ("gpt-oss", False, HARMONY_R + "This is reasoning" + HARMONY_FINAL
     + "This is the rest", "This is reasoning", "This is the rest"),
    ("gpt-oss", False, HARMONY_R + "Need weather.<|end|>" + HARMONY_CALL,
     "Need weather.", HARMONY_CALL),
    ("gpt-oss", False, HARMONY_R + "This is reasoning<|end|>", "This is reasoning", ""),
    ("gpt-oss", False, "Plain text, no channels.", "", "Plain text, no channels."),
    ("gpt-oss", False, "<|channel|>final<|message|>Hi<|return|>", "", "Hi"),
]


def run(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str, list[object]]:
    events = [ev for p in pieces for ev in parser.feed(p)] + parser.flush()
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    answer = "".join(e for e in events if isinstance(e, str))
    return reasoning, answer, events


def random_pieces(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 4)
        pieces.append(text[i:i + n])
        i += n
    return pieces


@pytest.mark.parametrize(("family", "inside", "output", "reasoning", "answer"), CASES)
def test_recorded_outputs_one_feed_and_streamed(family: str, inside: bool, output: str,
                                                reasoning: str, answer: str) -> None:
    assert run(SPECS[family].make(inside), [output])[:2] == (reasoning, answer)
    rng = random.Random(hash(output) & 0xFFFF)
    for _ in range(20):
        got_r, got_a, events = run(SPECS[family].make(inside), random_pieces(output, rng))
        assert (got_r, got_a) == (reasoning, answer)
        kinds = [type(e) for e in events]  # reasoning never comes back after the answer
        assert kinds == sorted(kinds, key=lambda k: k is str) or family == "gpt-oss"


def test_no_partial_marker_is_released_early() -> None:
    parser = SPECS["qwen3"].make(False)
    assert parser.feed("<thi") == []
    assert parser.feed("nk>abc</th") == [Reasoning("abc")]
    assert parser.feed("ink>\n\nok") == ["ok"]


@pytest.mark.parametrize(("template", "family"), [
    ("{{ '<|start|>assistant<|channel|>analysis' }}", "gpt-oss"),
    ("<|tool_calls_section_begin|> <think>", "kimi-k2"),
    ("]~b]ai <think>", "minimax-m2"),
    ("[gMASK]<sop> <think>", "glm-4.5"),
    ("<｜Assistant｜>{% if thinking %}<think>{% endif %}", "deepseek-v3.1"),
    ("<｜Assistant｜><think>\n", "deepseek-r1"),
    ("<|im_start|>assistant\n<think>", "qwen3"),
    ("<|im_start|>assistant\n", None),
])
def test_detect_from_template(template: str, family: str | None) -> None:
    assert detect(template) == family


def test_detect_from_added_tokens() -> None:
    assert detect("<|im_start|>", think_tokens=True) == "qwen3"


def test_config_checks_the_reasoning_parser_name() -> None:
    from pydantic import ValidationError

    from deploy.config import ModelConfig

    base = {"name": "m", "engine": "sim", "model_path": "/x"}
    assert ModelConfig(**base, reasoning_parser="gpt-oss").reasoning_parser == "gpt-oss"
    assert ModelConfig(**base, reasoning_parser="none").reasoning_parser == "none"
    with pytest.raises(ValidationError, match="not a known reasoning format"):
        ModelConfig(**base, reasoning_parser="qwen-3")


def test_an_unrecognised_template_is_logged_once_and_passes_through(
        tiny_model_dir, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from deploy.config import ModelConfig
    from router.output.reasoning_parsers import for_request
    from router.prompt.tokenizer import ChatTokenizer

    tok = ChatTokenizer(str(tiny_model_dir))  # the demo template: no reasoning format
    model = ModelConfig(name="demo-once", engine="sim", model_path=str(tiny_model_dir))
    with caplog.at_level(logging.INFO, logger="router.output.reasoning_parsers"):
        assert for_request(model, tok, [1, 2]) is None
        assert for_request(model, tok, [1, 2]) is None
    assert sum("no reasoning format" in r.message for r in caplog.records) == 1
    forced = model.model_copy(update={"reasoning_parser": "qwen3"})
    assert for_request(forced, tok, [1, 2]) is not None  # the config's choice wins


def test_reasoning_switches() -> None:
    from router.output.reasoning_parsers.controls import budget_effort, options

    assert options(None) == () and options(None, "bogus") == ()
    assert dict(options(None, "none")) == {"enable_thinking": False, "thinking": False,
                                           "reasoning_effort": "low"}
    assert dict(options(True, "max"))["reasoning_effort"] == "high"
    assert dict(options(False)) == {"enable_thinking": False, "thinking": False}
    assert [budget_effort(b) for b in (None, 1024, 4096, 10000, 32000)] == \
        [None, "low", "low", "medium", "high"]
