"""Structured output on the ``sim`` engine emulator: a valid reply without a model.

For a request's ``Constraint`` (``workers.protocol``) the emulator answers with a minimal
text the constraint accepts, so routing tests and benchmarks of structured requests stay
fast: a minimal instance of a JSON schema (``minimal``: required properties only, the
first of an ``enum`` / ``anyOf`` / type list, ``minItems`` items, bounds and formats
respected), ``{}`` for any JSON object, the first choice, a shortest match of a regex
(``regex_match``, from Python's own regex parser) and, for a Lark grammar, the first
derivation of each rule with ``%json`` parts as minimal instances and ``<[id]>`` tokens
as their text (``lark_text``): the router's forced tool calls are written so. A grammar
outside that subset (a user's EBNF) is an ``InputRejected``: the emulator names it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from re import _constants as sc  # type: ignore[attr-defined]  # Python's own regex parser
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from workers.protocol import Constraint, InputRejected

SEPARATORS = (", ", ": ")  # as the real engines keep JSON
_FORMATS = {"date": "2024-01-01", "date-time": "2024-01-01T00:00:00Z", "time": "00:00:00Z",
            "email": "a@example.com", "uri": "https://example.com", "uuid":
            "00000000-0000-0000-0000-000000000000", "ipv4": "127.0.0.1", "hostname": "a"}


def text_for(c: Constraint, special: Callable[[int], str]) -> str:
    """A minimal text ``c`` accepts; ``special``: a token id's text (for ``<[id]>``)."""
    if c.kind == "json":
        return json.dumps(minimal(json.loads(c.text)), separators=SEPARATORS)
    if c.kind == "json_object":
        return "{}"
    if c.kind == "choice":
        return c.choices[0]
    if c.kind == "regex":
        return regex_match(c.text)
    return lark_text(c.text, special)


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return _resolve(node, root)


def minimal(schema: Any, root: Any = None) -> Any:
    """A minimal value valid against ``schema`` (a JSON schema, ``$ref`` within it)."""
    root = schema if root is None else root
    if schema is True or not isinstance(schema, Mapping):
        return None
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return minimal(schema[key][0], root)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part, root))
        return minimal(merged, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "null"
    return _BY_TYPE[kind](schema, root)


def _object(s: Mapping[str, Any], root: Any) -> dict[str, Any]:
    props = s.get("properties") or {}
    return {k: minimal(props.get(k, {}), root) for k in s.get("required") or ()}


def _array(s: Mapping[str, Any], root: Any) -> list[Any]:
    prefix = list(s.get("prefixItems") or ())
    n = max(int(s.get("minItems", 0)), 0)
    items = [minimal(p, root) for p in prefix[:n]]
    return items + [minimal(s.get("items", {}), root) for _ in range(n - len(items))]


def _string(s: Mapping[str, Any], root: Any) -> str:
    if isinstance(s.get("pattern"), str):
        return regex_match(s["pattern"])
    if s.get("format") in _FORMATS:
        return _FORMATS[s["format"]]
    return "a" * int(s.get("minLength", 0))


def _number(s: Mapping[str, Any], root: Any) -> int | float:
    low = s.get("minimum", s.get("exclusiveMinimum"))
    value = 0 if low is None else low + (1 if "exclusiveMinimum" in s else 0)
    high = s.get("maximum", s.get("exclusiveMaximum"))
    if high is not None and value > high - (1 if "exclusiveMaximum" in s else 0):
        value = high - (1 if "exclusiveMaximum" in s else 0)
    if (step := s.get("multipleOf")) and value % step:
        value += step - value % step
    return int(value) if s.get("type") == "integer" else value


_BY_TYPE: dict[str, Callable[[Mapping[str, Any], Any], Any]] = {
    "object": _object, "array": _array, "string": _string, "integer": _number,
    "number": _number, "boolean": lambda s, r: False, "null": lambda s, r: None,
}


def regex_match(pattern: str) -> str:
    """A shortest string ``pattern`` matches whole (Python's regex syntax)."""
    try:
        return _walk(sre_parse.parse(pattern))
    except (re.error, ValueError, KeyError) as e:
        raise InputRejected(f"regex: the sim emulator cannot generate from {pattern!r}: {e}") \
            from e


def _walk(items: Any) -> str:
    out = []
    for op, arg in items:
        if op is sc.LITERAL:
            out.append(chr(arg))
        elif op is sc.IN:
            out.append(_member(arg))
        elif op is sc.ANY:
            out.append("a")
        elif op is sc.NOT_LITERAL:
            out.append("a" if chr(arg) != "a" else "b")
        elif op in (sc.MAX_REPEAT, sc.MIN_REPEAT, getattr(sc, "POSSESSIVE_REPEAT", None)):
            low, _, sub = arg
            out.append(_walk(sub) * low)
        elif op is sc.SUBPATTERN:
            out.append(_walk(arg[-1]))
        elif op is sc.BRANCH:
            out.append(min((_walk(b) for b in arg[1]), key=len))
        elif op in (sc.AT, sc.ASSERT, sc.ASSERT_NOT):
            continue
        else:
            raise ValueError(f"unsupported regex item {op}")
    return "".join(out)


def _member(arg: Any) -> str:
    op, value = arg[0]
    if op is sc.NEGATE:
        banned = {chr(v) for o, v in arg[1:] if o is sc.LITERAL}
        return next(c for c in "a0_-x" if c not in banned)
    if op is sc.LITERAL:
        return chr(value)
    if op is sc.RANGE:
        return chr(value[0])
    if op is sc.CATEGORY:
        return {sc.CATEGORY_DIGIT: "0", sc.CATEGORY_SPACE: " "}.get(value, "a")
    raise ValueError(f"unsupported regex class {op}")


_RULE = re.compile(r"^(\??[a-z_][a-z0-9_]*)\s*:\s*(.*)$", re.M)
_ITEM = re.compile(r'\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|<\[(?P<tok>\d+)\]>|(?P<json>%json\s*\{)'
                   r"|(?P<ref>[a-z_][a-z0-9_]*)|(?P<open>\()|(?P<close>\))"
                   r"|(?P<quant>\{\d+(?:,\d*)?\}|[?*+])|(?P<bar>\|))")


def lark_text(grammar: str, special: Callable[[int], str]) -> str:
    """The first derivation of ``start`` in a Lark grammar of literals, ``<[id]>`` tokens,
    ``%json {schema}``, rule references, groups, ``|`` and quantifiers."""
    rules = {m.group(1).lstrip("?"): m.group(2) for m in _RULE.finditer(grammar)}
    if "start" not in rules:
        raise InputRejected("grammar: the sim emulator reads Lark grammars with a start rule")
    return _derive(rules["start"], rules, special, 0)


def _derive(body: str, rules: Mapping[str, str], special: Callable[[int], str],
            depth: int) -> str:
    if depth > 50:
        raise InputRejected("grammar: too deep for the sim emulator")
    out: list[str] = []
    stack: list[list[str]] = []  # open groups' text so far
    pos = 0
    while pos < len(body.rstrip()):
        m = _ITEM.match(body, pos)
        if m is None:
            raise InputRejected(f"grammar: the sim emulator cannot read {body[pos:pos + 30]!r}")
        pos = m.end()
        if m["bar"]:  # the first alternative is taken: skip to the end of this group
            pos = _skip_alternatives(body, pos)
        elif m["lit"]:
            out.append(json.loads(m["lit"]))
        elif m["tok"]:
            out.append(special(int(m["tok"])))
        elif m["json"]:
            schema, end = json.JSONDecoder().raw_decode(body, m.end() - 1)
            out.append(json.dumps(minimal(schema), separators=SEPARATORS))
            pos = end
        elif m["ref"]:
            out.append(_derive(rules[m["ref"]], rules, special, depth + 1))
        elif m["open"]:
            stack.append(out)
            out = []
        elif m["close"]:
            group, out = "".join(out), stack.pop()
            out.append(group)
        elif (q := m["quant"]) and out:  # the fewest repeats
            low = 0 if q in ("?", "*") else 1 if q == "+" else int(q[1:-1].split(",")[0])
            out[-1] = out[-1] * low
    return "".join(out)


def _skip_alternatives(body: str, pos: int) -> int:
    """Past the rest of the current group (or rule body): up to its closing ``)``."""
    depth, in_str = 0, False
    while pos < len(body):
        ch = body[pos]
        if in_str:
            if ch == "\\":
                pos += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            if depth == 0:
                return pos
            depth -= 1
        pos += 1
    return pos


def spelled(c: Constraint, tokenizer: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(token ids, each token's text) of the reply to ``c``: with the model's tokenizer
    (``tokenizers.Tokenizer``) its own tokens, else one character a token (ids 0..n-1)."""
    if tokenizer is None:
        text = text_for(c, lambda i: f"<[{i}]>")
        return tuple(range(len(text))), tuple(text)
    from workers.engines.sim.script import incremental_pieces

    text = text_for(c, lambda i: tokenizer.id_to_token(i) or "")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return tuple(ids), incremental_pieces(tokenizer, ids)
