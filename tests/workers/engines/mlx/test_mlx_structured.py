"""Structured output on the real mlx engine (the random-weight tiny model, CPU MLX): what it
writes under a constraint validates (20 JSON schemas, checked with ``jsonschema``), matches
(a regex, a choice) and ends where the grammar does; a forced tool call, built by the
router in a family's markup (``router.output.tool_grammar``), is read back by that family's
parser with arguments valid against the tool's schema; a grammar that does not compile
fails its request alone as an input error."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from router.output import tool_calls as tc
from router.output.tool_grammar import forced_calls
from router.output.tool_parsers import ToolCall
from router.prompt.tokenizer import ChatTokenizer
from tests.router.output.tool_parsers.family_models import family_model_dir
from tests.workers.engines.structured_cases import MAX_TOKENS, SCHEMAS
from workers.protocol import Constraint, Finished, GenerateRequest, SamplingParams

pytestmark = pytest.mark.slow
TOOLS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False},
    "noop": {"type": "object", "properties": {}, "additionalProperties": False}}
PROMPT = [5, 17, 99, 240, 31, 8]


async def _engine(model_dir: Path) -> Any:
    from workers.engines.mlx.engine import MlxEngine

    engine = MlxEngine(str(model_dir), "structured/model", "r0", 16)
    await engine.start()
    return engine


async def _run(engine: Any, rid: str, c: Constraint, prompt: list[int] = PROMPT,
               max_tokens: int = MAX_TOKENS, **sampling: Any) -> tuple[str, Finished]:
    text, fin = "", None
    sp = SamplingParams(max_tokens=max_tokens, constraint=c, **sampling)
    async for item in engine.generate(GenerateRequest(rid, prompt, sp)):
        if isinstance(item, Finished):
            fin = item
        else:
            text += item.text
    assert fin is not None
    return text, fin


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> AsyncIterator[Any]:
    loop = asyncio.new_event_loop()
    eng = loop.run_until_complete(_engine(tiny_model_dir))
    yield loop, eng
    loop.run_until_complete(eng.shutdown())
    loop.close()


def test_twenty_schemas_validate_and_end_at_the_grammar(engine: Any) -> None:
    loop, eng = engine

    async def all_at_once() -> list[tuple[str, Finished]]:  # one batch, a grammar each
        return await asyncio.gather(*(
            _run(eng, f"s{i}", Constraint("json", json.dumps(s)), [5 + i, *PROMPT],
                 temperature=0.0 if i % 2 else 1.0, seed=i)
            for i, s in enumerate(SCHEMAS)))
    for schema, (text, fin) in zip(SCHEMAS, loop.run_until_complete(all_at_once()),
                                   strict=True):
        assert fin.finish_reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_regex_choice_and_free_text_in_one_batch(engine: Any) -> None:
    loop, eng = engine

    async def batch() -> list[tuple[str, Finished]]:
        return await asyncio.gather(
            _run(eng, "re", Constraint("regex", r"[A-C]{2}-\d{3}")),
            _run(eng, "ch", Constraint("choice", choices=("alpha", "beta gamma"))),
            _run(eng, "js", Constraint("grammar", 'start: "<" /[a-z]{2,4}/ ">"\n')),
            _run(eng, "free", None, max_tokens=12),  # type: ignore[arg-type]
        )
    (rx, f1), (ch, f2), (gr, f3), (free, f4) = loop.run_until_complete(batch())
    assert re.fullmatch(r"[A-C]{2}-\d{3}", rx) and f1.finish_reason == "stop"
    assert ch in ("alpha", "beta gamma") and f2.finish_reason == "stop"
    assert re.fullmatch(r"<[a-z]{2,4}>", gr) and f3.finish_reason == "stop"
    assert f4.usage.completion_tokens == 12 or f4.finish_reason == "stop"


def test_the_grammar_ends_output_under_ignore_eos(engine: Any) -> None:
    loop, eng = engine
    text, fin = loop.run_until_complete(
        _run(eng, "ie", Constraint("choice", choices=("yes",)), ignore_eos=True))
    assert (text, fin.finish_reason) == ("yes", "stop")


@pytest.mark.parametrize("bad", [Constraint("regex", "(unclosed"),
                                 Constraint("grammar", "start: undefined_rule\n"),
                                 Constraint("json", '{"type": "no-such-type"}')])
def test_a_grammar_that_does_not_compile_is_an_input_error(engine: Any, bad: Constraint
                                                           ) -> None:
    loop, eng = engine
    with pytest.raises(ValueError, match=bad.kind):
        loop.run_until_complete(_run(eng, "bad", bad))
    text, fin = loop.run_until_complete(_run(eng, "after", Constraint("choice", choices=("x",))))
    assert text == "x"  # the engine serves on


def _parsed(family: str, text: str) -> list[ToolCall]:
    parser = tc.make_parser(family, TOOLS)
    assert parser is not None
    events = parser.feed(text) + parser.flush()
    return [e for e in events if isinstance(e, ToolCall)]


@pytest.mark.parametrize("family", ["hermes", "mistral", "deepseek-v3.1", "kimi-k2"])
def test_a_forced_call_in_the_family_markup_parses(tiny_model_dir: Path, tmp_path: Path,
                                                   family: str) -> None:
    folder = family_model_dir(tiny_model_dir, family, tmp_path / family)
    tok = ChatTokenizer(str(folder))
    assert tc.family_for_model(str(folder)) == family
    prompt = tok.encode("What is the weather in Paris?")

    async def go() -> list[tuple[str, Finished]]:
        eng = await _engine(folder)
        try:
            named = forced_calls(family, TOOLS, ["get_weather"], tok.added_token_id, False)
            anyof = forced_calls(family, TOOLS, list(TOOLS), tok.added_token_id, True)
            return [await _run(eng, "named", Constraint("grammar", named), prompt),
                    await _run(eng, "any", Constraint("grammar", anyof), prompt,
                               temperature=1.0, seed=3)]
        finally:
            await eng.shutdown()
    (named_text, f1), (any_text, f2) = asyncio.run(go())
    assert f1.finish_reason == "stop", named_text
    calls = _parsed(family, named_text)
    assert [c.name for c in calls] == ["get_weather"], named_text
    jsonschema.validate(calls[0].arguments, TOOLS["get_weather"])
    if f2.finish_reason == "stop":  # parallel calls may run past the budget
        calls = _parsed(family, any_text)
        assert calls and all(c.name in TOOLS for c in calls), any_text
        for c in calls:
            jsonschema.validate(c.arguments, TOOLS[c.name])
