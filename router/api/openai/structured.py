"""vLLM's structured-output fields on chat and completions, and the constraint they set.

- ``structured_outputs``: ``{"json": schema}``, ``{"regex": ..}``, ``{"choice": [..]}``,
  ``{"grammar": ..}`` (Lark in llguidance's dialect, or EBNF that vLLM's backends read) or
  ``{"json_object": true}``; one kind at a time, as vLLM requires. Its whitespace and
  ``additionalProperties`` options are accepted; ``structural_tag`` is a 400 naming it.
- ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``: the older names
  of the same constraints, honoured as vLLM honoured them before it dropped them (vLLM
  0.32 ignores them with a warning; here they still constrain).
- ``response_format`` (``json_object``, ``json_schema`` strict or not) sets the same JSON
  constraint; given with another kind it is a 400, as in vLLM.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from router.api.common import limits as lim
from router.api.common.structured import json_schema, one_of
from router.errors import ApiError
from workers.protocol import Constraint

MAX_CHOICES = 256


class StructuredOutputs(BaseModel):
    """vLLM's ``StructuredOutputsParams`` as a request carries it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)
    choice: list[Any] | None = Field(None, max_length=MAX_CHOICES)
    grammar: str | None = Field(None, max_length=lim.MAX_TEXT_CHARS)
    json_object: bool | None = None
    structural_tag: str | None = None
    # options that only shape whitespace and extra keys: accepted (vLLM's backends honour
    # them in part; the engines here keep JSON compact and schemas as written)
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


def _schema(value: str | dict[str, Any], param: str) -> Constraint:
    if isinstance(value, dict):
        return json_schema(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"invalid JSON schema: {e}", "invalid_request", param) from e
    if not isinstance(parsed, dict):
        raise ApiError(400, "a JSON schema must be an object", "invalid_request", param)
    return json_schema(parsed)


def _choice(values: list[Any], param: str) -> Constraint:
    if not values:
        raise ApiError(400, "choice must not be empty", "invalid_request", param)
    return Constraint("choice", choices=tuple(str(v) for v in values))


def _text(kind: str, value: str, param: str) -> Constraint:
    if kind == "grammar" and not value.strip():
        raise ApiError(400, "grammar must not be empty", "invalid_request", param)
    if "\x00" in value:
        raise ApiError(400, f"{kind} must not contain a NUL character", "invalid_request",
                       param)
    return Constraint(kind, value)


def from_structured(so: StructuredOutputs) -> Constraint | None:
    p = "structured_outputs"
    if so.structural_tag is not None:
        raise ApiError(400, "structured_outputs.structural_tag is not supported",
                       "invalid_request", f"{p}.structural_tag")
    if so.json_object is False:
        raise ApiError(400, "structured_outputs.json_object must be true if set",
                       "invalid_request", f"{p}.json_object")
    return one_of([
        (f"{p}.json", None if so.json_ is None else _schema(so.json_, f"{p}.json")),
        (f"{p}.regex", None if so.regex is None else _text("regex", so.regex, f"{p}.regex")),
        (f"{p}.choice", None if so.choice is None else _choice(so.choice, f"{p}.choice")),
        (f"{p}.grammar", None if so.grammar is None
         else _text("grammar", so.grammar, f"{p}.grammar")),
        (f"{p}.json_object", Constraint("json_object") if so.json_object else None),
    ])


class Structured(Protocol):
    """The fields of a request (``schema.SamplingFields``) that set a constraint."""

    structured_outputs: StructuredOutputs | None
    guided_json: str | dict[str, Any] | None
    guided_regex: str | None
    guided_choice: list[Any] | None
    guided_grammar: str | None


def output_constraint(req: Structured) -> Constraint | None:
    """The constraint a chat or completions request sets, or None."""
    fmt = getattr(req, "response_format", None)  # chat and completions have it
    found: list[tuple[str, Constraint | None]] = [
        ("structured_outputs", from_structured(req.structured_outputs)
         if req.structured_outputs is not None else None),
        ("guided_json", None if req.guided_json is None
         else _schema(req.guided_json, "guided_json")),
        ("guided_regex", None if req.guided_regex is None
         else _text("regex", req.guided_regex, "guided_regex")),
        ("guided_choice", None if req.guided_choice is None
         else _choice(req.guided_choice, "guided_choice")),
        ("guided_grammar", None if req.guided_grammar is None
         else _text("grammar", req.guided_grammar, "guided_grammar")),
        ("response_format", fmt.constraint() if fmt is not None else None),
    ]
    return one_of(found)
