"""Twenty JSON schemas for structured-output tests on every engine: nested objects,
arrays, enums, ``anyOf``, ``$ref``, patterns, formats, consts and nullables. Every string,
array and integer is bounded and every object closed, so a random-weight model, whose
grammar lets it write at most that much, ends within ``MAX_TOKENS``."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 160


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


S = {"type": "string", "maxLength": 6}
INT = {"type": "integer", "minimum": 0, "maximum": 99}
COLOR = {"enum": ["red", "green", "blue"]}

SCHEMAS: list[dict[str, Any]] = [
    obj({"name": S}),
    obj({"age": INT, "ok": {"type": "boolean"}}),
    obj({"color": COLOR}),
    obj({"tags": {"type": "array", "items": S, "maxItems": 3}}),
    obj({"point": obj({"x": INT, "y": INT})}),
    obj({"a": obj({"b": obj({"c": COLOR})})}),
    obj({"items": {"type": "array", "items": obj({"id": INT, "label": S}), "minItems": 1,
                   "maxItems": 2}}),
    obj({"value": {"anyOf": [INT, S]}}),
    obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "r": INT}),
                             obj({"kind": {"const": "square"}, "side": INT})]}}),
    obj({"maybe": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}),
    obj({"day": {"type": "string", "format": "date"}}),
    obj({"status": {"const": "done"}, "count": INT}),
    obj({"grid": {"type": "array", "items": {"type": "array", "items": INT, "maxItems": 2},
                  "maxItems": 2}}),
    obj({"opt": S, "req": INT}, required=["req"]),
    {"$defs": {"leaf": obj({"v": COLOR})}, **obj({"left": {"$ref": "#/$defs/leaf"},
                                                  "right": {"$ref": "#/$defs/leaf"}})},
    obj({"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2,
                   "maxItems": 2}}),
    obj({"user": obj({"name": S, "role": {"enum": ["admin", "guest"]},
                      "emails": {"type": "array", "items": S, "maxItems": 1}})}),
    obj({"n": {"type": "integer", "minimum": 10, "maximum": 12},
         "level": {"enum": [1, 2, 3]}}),
    obj({"answer": {"anyOf": [{"type": "boolean"}, {"type": "null"}, COLOR]},
         "note": {"type": "string", "minLength": 1, "maxLength": 3}}),
]
assert len(SCHEMAS) == 20
