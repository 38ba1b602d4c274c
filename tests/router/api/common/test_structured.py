"""Structured outputs and forced tool choice through each API's route (over a scripted
core): the request becomes one typed ``Constraint`` on its sampling, the prompt is left as
the client wrote it (so its prefix hashes do not depend on the schema), a strict schema's
reply carries no not-enforced header, and bad or conflicting constraints are 400s naming
the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cache_service.hashing import block_hashes
from deploy.config import KvrouteConfig
from router.output import reasoning_parsers as rp
from router.routing.target import Targets
from tests.router.api.anthropic.test_anthropic_api import FakeCore, Script, make_client
from tests.router.output.tool_parsers.family_models import family_model_dir
from workers.engines.sim.structured import lark_text
from workers.protocol import Constraint

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
          "required": ["title"], "additionalProperties": False}
OTHER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]


def _post(core: FakeCore, path: str, **body: Any) -> Any:
    return make_client(core).post(path, json={"model": "tiny", "max_tokens": 8, **body})


def _chat(core: FakeCore, **body: Any) -> Any:
    return _post(core, "/v1/chat/completions", messages=MESSAGES, **body)


def _constraint(core: FakeCore) -> Constraint | None:
    return core.calls[-1]["sampling"].constraint  # type: ignore[no-any-return]


def _fmt(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "T", "schema": schema,
                                                   "strict": strict}}


@pytest.fixture
def core(tiny_model_dir: Path) -> FakeCore:
    return FakeCore(tiny_model_dir, Script(chunks=['{"title": "t"}']))


def test_a_strict_schema_is_enforced_not_described(core: FakeCore) -> None:
    plain = _chat(core)
    ids = core.calls[-1]["ids"]
    assert plain.status_code == 200 and _constraint(core) is None
    r = _chat(core, response_format=_fmt(SCHEMA))
    assert r.status_code == 200, r.text
    assert not any(h.startswith("x-kvroute-schema") for h in r.headers)
    assert _constraint(core) == Constraint("json", json.dumps(SCHEMA))
    assert core.calls[-1]["ids"] == ids  # nothing added to the prompt


def test_different_schemas_hash_the_same_prefix(core: FakeCore) -> None:
    """The grammar is not part of the prompt: routing sees the same blocks."""
    _chat(core, response_format=_fmt(SCHEMA))
    first = core.calls[-1]
    _chat(core, response_format=_fmt(OTHER, strict=False))
    second = core.calls[-1]
    assert first["sampling"].constraint != second["sampling"].constraint
    assert first["ids"] == second["ids"]
    assert list(block_hashes(first["ids"], 4)) == list(block_hashes(second["ids"], 4))


@pytest.mark.parametrize(("body", "want"), [
    ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
    ({"response_format": _fmt(SCHEMA, strict=False)}, Constraint("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": SCHEMA}}, Constraint("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, Constraint("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[a-z]{3}"}}, Constraint("regex", "[a-z]{3}")),
    ({"structured_outputs": {"choice": ["yes", "no"]}},
     Constraint("choice", choices=("yes", "no"))),
    ({"structured_outputs": {"grammar": 'start: "a"'}}, Constraint("grammar", 'start: "a"')),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}},
     Constraint("json_object")),
    ({"guided_json": SCHEMA}, Constraint("json", json.dumps(SCHEMA))),
    ({"guided_regex": "a+"}, Constraint("regex", "a+")),
    ({"guided_choice": ["x", 2]}, Constraint("choice", choices=("x", "2"))),
    ({"guided_grammar": 'start: "b"'}, Constraint("grammar", 'start: "b"')),
])
def test_each_field_sets_its_constraint(core: FakeCore, body: dict[str, Any],
                                        want: Constraint) -> None:
    r = _chat(core, **body)
    assert r.status_code == 200, r.text
    assert _constraint(core) == want
    r = _post(core, "/v1/completions", prompt="x", **body)  # vLLM's completions take them too
    assert r.status_code == 200, r.text
    assert _constraint(core) == want


@pytest.mark.parametrize(("body", "param"), [
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "response_format"),
    ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": "  "}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
    ({"guided_json": "[1]"}, "guided_json"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
])
def test_bad_constraints_are_400s_naming_the_field(core: FakeCore, body: dict[str, Any],
                                                   param: str) -> None:
    r = _chat(core, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not core.calls  # refused before routing


def test_forced_tool_choice_is_a_grammar_in_the_family_markup(core: FakeCore) -> None:
    """The tiny model writes hermes's ``<tool_call>``: an added token, matched by its id."""
    tid = core.tok.added_token_id("<tool_call>")
    assert tid is not None
    r = _chat(core, tools=TOOLS, tool_choice={"type": "function",
                                             "function": {"name": "get_weather"}})
    assert r.status_code == 200, r.text
    c = _constraint(core)
    assert c is not None and c.kind == "grammar"
    assert f"<[{tid}]>" in c.text and '\\"name\\": \\"get_weather\\"' in c.text
    assert "noop" not in c.text and "{0," not in c.text  # one call of the named tool
    _chat(core, tools=TOOLS, tool_choice="required")
    c = _constraint(core)
    assert c is not None and "noop" in c.text and "{0,7}" in c.text  # parallel calls
    _chat(core, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    c = _constraint(core)
    assert c is not None and "{0," not in c.text
    _chat(core, tools=TOOLS, tool_choice="auto")
    assert _constraint(core) is None


def test_anthropic_any_and_tool_are_forced(core: FakeCore) -> None:
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    msgs = [{"role": "user", "content": "x"}]
    r = _post(core, "/v1/messages", messages=msgs, tools=tools,
              tool_choice={"type": "tool", "name": "get_weather"})
    assert r.status_code == 200, r.text
    c = _constraint(core)
    assert c is not None and c.kind == "grammar" and "noop" not in c.text
    _post(core, "/v1/messages", messages=msgs, tools=tools, tool_choice={"type": "any"})
    c = _constraint(core)
    assert c is not None and "noop" in c.text
    r = _post(core, "/v1/messages", messages=msgs, tools=tools,
              tool_choice={"type": "tool", "name": "nope"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = _post(core, "/v1/messages", messages=msgs,
              output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    assert r.status_code == 200, r.text
    assert _constraint(core) == Constraint("json", json.dumps(SCHEMA))


def test_responses_text_format_and_tool_choice(core: FakeCore) -> None:
    fmt = {"type": "json_schema", "name": "codex_output_schema", "schema": SCHEMA,
           "strict": True}
    r = _post(core, "/v1/responses", input="Name this thread", stream=True,
              text={"format": fmt}, store=False)
    assert r.status_code == 200, r.text
    assert not any(h.startswith("x-kvroute-schema") for h in r.headers)
    assert _constraint(core) == Constraint("json", json.dumps(SCHEMA))
    assert "codex_output_schema" not in core.prompt_text()
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = _post(core, "/v1/responses", input="x", tools=tools, store=False,
              tool_choice={"type": "function", "name": "get_weather"})
    assert r.status_code == 200, r.text
    c = _constraint(core)
    assert c is not None and c.kind == "grammar" and "noop" not in c.text


def test_a_family_without_a_forced_call_grammar_is_a_400(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["x"]))
    # XML-style arguments: not covered
    model = core.models["tiny"].model_copy(update={"tool_parser": "qwen3-coder"})
    core.config = KvrouteConfig(models=[model])
    core.targets = Targets(core.config, {"tiny": core.tok})
    r = _chat(core, tools=TOOLS, tool_choice="required")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "qwen3-coder" in r.json()["error"]["message"]


def test_a_prompt_that_opened_reasoning_closes_it_first(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    """MiniMax-M2's template opens ``<think>``: a JSON constraint there would be read as
    reasoning, so the grammar writes ``</think>`` first and the JSON is the answer."""
    folder = family_model_dir(tiny_model_dir, "minimax-m2", tmp_path / "mm")
    core = FakeCore(folder, Script(chunks=["x"]))
    r = _chat(core, response_format=_fmt(SCHEMA))
    assert r.status_code == 200, r.text
    c = _constraint(core)
    closer = core.tok.added_token_id("</think>")
    assert c is not None and c.kind == "grammar" and closer is not None
    assert c.text.startswith(f"start: <[{closer}]> body\n")
    text = lark_text(c.text, lambda i: "</think>" if i == closer else "?")
    assert text.startswith("</think>") and json.loads(text[len("</think>"):]) == {"title": ""}
    parser = rp.for_request(core.models["tiny"], core.tok, core.calls[-1]["ids"])
    assert parser is not None  # the template opened reasoning: the parser starts inside it
    answer = [p for p in parser.feed(text) + parser.flush() if isinstance(p, str)]
    assert json.loads("".join(answer)) == {"title": ""}  # the JSON is the answer
