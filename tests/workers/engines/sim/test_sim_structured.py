"""Structured output on the sim emulator: without a model it answers a constraint with a
valid minimal reply (``workers.engines.sim.structured``): a schema instance that validates
(the 20 engine-test schemas), a choice, a regex match, a forced call that the family's
parser reads with schema-valid arguments; a grammar it cannot read is an input error."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import jsonschema
import pytest

from router.output import tool_calls as tc
from router.output.tool_grammar import forced_calls
from router.output.tool_parsers import ToolCall
from router.prompt.tokenizer import ChatTokenizer
from tests.workers.engines.sim.test_sim_engine import make_engine, prompt, run
from tests.workers.engines.structured_cases import SCHEMAS
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.structured import lark_text, minimal, regex_match, spelled, text_for
from workers.engines.sim.vocab import SimVocab
from workers.protocol import Constraint, InputRejected

TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string",
                                                                   "minLength": 2}},
                         "required": ["city"]}, "noop": {}}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_minimal_instance_validates(schema: dict[str, object]) -> None:
    text = text_for(Constraint("json", json.dumps(schema)), str)
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("pattern", [r"[a-c]{3}-\d{2}(x|yy)?\w+", r"^(?:foo|ba)[^a]$",
                                     r"\d+\.\d{2}", r"(ab|c)*z", r"[A-Z][a-z]+ [0-9]{3,}",
                                     r"(?i)yes|no", r"\s?[^\d]{2}"])
def test_a_regex_match(pattern: str) -> None:
    assert re.fullmatch(pattern, regex_match(pattern))


def test_numbers_meet_their_bounds() -> None:
    assert minimal({"type": "integer", "minimum": 5, "multipleOf": 4}) == 8
    assert minimal({"type": "integer", "exclusiveMinimum": 5}) == 6
    assert minimal({"type": "integer", "maximum": -3}) == -3
    assert minimal({"type": "string", "minLength": 3}) == "aaa"


def test_choice_and_any_object() -> None:
    assert text_for(Constraint("choice", choices=("b", "a")), str) == "b"
    assert text_for(Constraint("json_object"), str) == "{}"


@pytest.mark.parametrize("family", ["hermes", "mistral", "llama3-json", "deepseek-v3.1",
                                    "kimi-k2"])
def test_a_forced_call_parses(family: str) -> None:
    ids = {"<tool_call>": 1, "</tool_call>": 2}
    text = lark_text(forced_calls(family, TOOLS, list(TOOLS), ids.get, parallel=True),
                     {v: k for k, v in ids.items()}.__getitem__)
    parser = tc.make_parser(family, TOOLS)
    assert parser is not None
    calls = [e for e in parser.feed(text) + parser.flush() if isinstance(e, ToolCall)]
    assert [c.name for c in calls] == ["get_weather"], text
    jsonschema.validate(calls[0].arguments, TOOLS["get_weather"])


def test_a_grammar_outside_the_subset_is_an_input_error() -> None:
    with pytest.raises(InputRejected):
        text_for(Constraint("grammar", "root ::= [a-z]+"), str)
    with pytest.raises(InputRejected):
        regex_match(r"(a)\1")  # a back-reference


def test_the_engine_replies_under_a_constraint() -> None:
    async def go() -> tuple[str, str, str]:
        engine = await make_engine()
        try:
            schema = SCHEMAS[8]
            chunks, fin = await run(engine, prompt(40), "j", max_tokens=200,
                                    constraint=Constraint("json", json.dumps(schema)))
            assert fin.finish_reason == "stop"
            assert fin.usage.completion_tokens == sum(len(c.token_ids) for c in chunks)
            js = "".join(c.text for c in chunks)
            chunks, fin = await run(engine, prompt(40), "c", max_tokens=200, ignore_eos=True,
                                    constraint=Constraint("choice", choices=("yes", "no")))
            assert fin.finish_reason == "stop"  # the constraint ends it, ignore_eos or not
            ch = "".join(c.text for c in chunks)
            chunks, fin = await run(engine, prompt(40), "l", max_tokens=3,
                                    constraint=Constraint("regex", "[a-z]{10}"))
            assert fin.finish_reason == "length"
            return js, ch, "".join(c.text for c in chunks)
        finally:
            await engine.shutdown()
    js, ch, cut = asyncio.run(go())
    jsonschema.validate(json.loads(js), SCHEMAS[8])
    assert ch == "yes" and cut == "aaa"


def test_with_the_model_tokenizer_the_reply_is_its_tokens(tiny_model_dir: Path) -> None:
    vocab = SimVocab.of_model(str(tiny_model_dir))
    assert vocab is not None and vocab.tokenizer is not None
    tok = ChatTokenizer(str(tiny_model_dir))
    grammar = forced_calls("hermes", TOOLS, ["get_weather"], tok.added_token_id, False)
    ids, pieces = spelled(Constraint("grammar", grammar), vocab.tokenizer)
    text = "".join(pieces)
    assert text.startswith("<tool_call>\n{") and tok.encode(text) == list(ids)

    async def go() -> str:
        engine = SimEngine("sim/tok", "r0", 16, vocab=vocab)
        await engine.start()
        try:
            chunks, _ = await run(engine, prompt(40), "t", max_tokens=200,
                                  constraint=Constraint("grammar", grammar))
            return "".join(c.text for c in chunks)
        finally:
            await engine.shutdown()
    assert asyncio.run(go()) == text
