"""The field rule (``router.api.common.fields``): a test per registry row (honoured: the
schema parses it; refused: a 400 naming it, its off values accepted; harmless: accepted
and not counted as unknown), the probe of every field of vLLM's own request models, the
unknown-field counter and docs/api.md's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from router import metrics
from router.api.anthropic.schema import MessagesRequest
from router.api.common import fields
from router.api.common.fields import HARMLESS, HONOURED, REFUSED, REGISTRY, Rule
from router.api.common.request import _invalid
from router.api.openai.schema import ChatCompletionRequest, CompletionRequest
from router.api.responses.schema import ResponsesRequest
from router.errors import ApiError

ROOT = Path(__file__).resolve().parents[4]
VLLM = json.loads((ROOT / "tests/router/fixtures/vllm_request_fields.json").read_text())
SCHEMAS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest,
                                       "completions": CompletionRequest,
                                       "messages": MessagesRequest,
                                       "responses": ResponsesRequest}
MINIMAL: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "messages": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
}
# Refused fields whose off values are a predicate: a value that asks for something.
ASKING = {"response_format": {"type": "json_object"}, "tool_choice": "required",
          "include": ["message.output_text.logprobs"], "text.format": {"type": "json_object"}}
ASKING_MESSAGES = {"tool_choice": {"type": "any"}}
# vLLM's fields that cannot change vLLM's output: the only ones kvroute may ignore.
CANNOT_CHANGE_OUTPUT = {"user", "priority", "request_id", "session_id", "stream_interval",
                        "metadata", "service_tier", "store", "safety_identifier",
                        "prompt_cache_retention", "stream_options", "client_metadata"}


def ignored(api: str, field: str) -> float:
    value = metrics.REGISTRY.get_sample_value("kvroute_ignored_fields_total",
                                              {"api": api, "field": field})
    return value or 0.0


def parse(api: str, extra: dict[str, Any]) -> BaseModel:
    """The body as ``parse_body`` takes it: a 400 ``ApiError`` on any error."""
    body = json.dumps({**MINIMAL[api], **extra})
    try:
        return SCHEMAS[api].model_validate_json(body)
    except ValidationError as e:
        raise _invalid(e.errors()) from None


def _body(name: str, value: Any) -> dict[str, Any]:
    if "." in name:
        parent, child = name.split(".", 1)
        return {parent: {child: value}}
    return {name: value}


def asking(api: str, name: str, rule: Rule) -> Any:
    """A value of a refused field that asks for something."""
    if api == "messages" and name in ASKING_MESSAGES:
        return ASKING_MESSAGES[name]
    if callable(rule.off):
        return ASKING[name]
    off = rule.off[0] if rule.off else None
    if isinstance(off, bool):
        return not off
    if isinstance(off, (int, float)):
        return off + 7
    if isinstance(off, list):
        return [1]
    if isinstance(off, dict):
        return {"x": 1}
    return {"type": "x"} if off is None else f"{off}-x"


ROWS = [(api, name, rule) for api, table in REGISTRY.items() for name, rule in table.items()]


@pytest.mark.parametrize(("api", "name", "rule"), [r for r in ROWS if r[2].status == REFUSED],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_refused_field_is_a_400_naming_it(api: str, name: str, rule: Rule) -> None:
    with pytest.raises(ApiError) as err:
        parse(api, _body(name, asking(api, name, rule)))
    assert err.value.status == 400 and err.value.param == name
    assert err.value.message.startswith(f"{name}: ")
    if isinstance(rule.off, tuple):
        for off in (None, *rule.off):  # what clients send routinely is accepted
            check = fields.check(api, {**MINIMAL[api], **_body(name, off)})
            assert check is not None


@pytest.mark.parametrize(("api", "name", "rule"), [r for r in ROWS if r[2].status != REFUSED],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_an_honoured_field_is_the_schemas_and_a_harmless_one_is_not_counted(
        api: str, name: str, rule: Rule) -> None:
    top = name.split(".")[0]
    schema = SCHEMAS[api]
    if rule.status == HONOURED:
        assert top in schema.model_fields, f"{api}: {name} honoured but not in the schema"
    else:
        assert rule.status == HARMLESS
        before = ignored(api, top)
        fields.check(api, {**MINIMAL[api], top: "x"})
        assert ignored(api, top) == before


@pytest.mark.parametrize("api", list(SCHEMAS))
def test_every_schema_field_is_in_the_registry(api: str) -> None:
    missing = set(SCHEMAS[api].model_fields) - set(REGISTRY[api])
    assert not missing, f"{api}: schema fields the registry does not classify: {missing}"


@pytest.mark.parametrize(("api", "name"), [(api, n) for api in ("chat", "completions",
                                                                 "responses")
                                           for n in VLLM[api]])
def test_no_vllm_field_that_changes_the_output_is_silently_dropped(api: str, name: str) -> None:
    rule = REGISTRY[api].get(name)
    assert rule is not None, f"vLLM's {api} field {name} is not classified"
    if rule.status == HARMLESS:
        assert name in CANNOT_CHANGE_OUTPUT, f"{api}: {name} ignored, yet it changes vLLM's output"
    elif rule.status == HONOURED:
        assert name in SCHEMAS[api].model_fields
    else:
        with pytest.raises(ApiError) as err:
            parse(api, {name: asking(api, name, rule)})
        assert err.value.param == name


def test_an_unknown_field_is_counted_with_a_bounded_label(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    def count(label: str) -> float:
        return ignored("chat", label)

    before = count("frobnicate")
    parse("chat", {"frobnicate": 1})
    parse("chat", {"frobnicate": 2})
    assert count("frobnicate") == before + 2
    assert sum("frobnicate" in r.getMessage() for r in caplog.records) <= 1  # logged once
    long = "z" * 500
    parse("chat", {long: 1})
    assert count("z" * fields.MAX_FIELD_CHARS) >= 1
    for i in range(fields.MAX_FIELDS_PER_API + 5):
        fields.check("chat", {f"flood_{i}": 1})
    labels = {s.labels["field"] for m in metrics.IGNORED_FIELDS.collect() for s in m.samples
              if s.labels.get("api") == "chat" and s.name.endswith("_total")}
    assert len(labels) <= fields.MAX_FIELDS_PER_API + 1 and fields.OTHER in labels
    assert count(fields.OTHER) >= 5


def test_docs_api_md_holds_the_registrys_table() -> None:
    doc = (ROOT / "docs/api.md").read_text()
    assert fields.table() in doc, "regenerate it: python -m router.api.common.fields"
