"""Structured output on every API: the request's constraint (``workers.protocol.Constraint``),
built once by the router and enforced by the engine while it decodes.

- A JSON schema (chat ``response_format`` ``json_schema``, Responses ``text.format``, vLLM's
  ``structured_outputs.json``) or any JSON object (``json_object``) is sent as it is.
- A forced tool choice (``required`` / ``any``, or one named tool) is a grammar of the
  tools' parameter schemas in the model family's own tool-call markup
  (``router.output.tool_grammar``), which the family's parser then reads. A family with no
  such grammar, or a named tool that was not offered, is a 400 naming the field.

The constraint travels in ``SamplingParams.constraint``, never in the prompt: two requests
with the same messages and different schemas have the same token ids and prefix hashes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from router.errors import ApiError
from router.output import reasoning_parsers as rp
from router.output.tool_calls import family_for_model
from router.output.tool_grammar import ForcedCallsUnsupported, after_marker, forced_calls
from router.routing.target import Target
from workers.protocol import Constraint


def json_schema(schema: Mapping[str, Any] | None) -> Constraint:
    """Output that validates against ``schema`` (None or empty: any JSON object)."""
    if not schema:
        return Constraint("json_object")
    return Constraint("json", json.dumps(schema, ensure_ascii=False))


REASONING_CLOSER = "</think>"  # the <think> families' (router.output.reasoning_parsers.think)


def opened_reasoning(target: Target, prompt_ids: Sequence[int]) -> bool:
    """Whether the rendered prompt ends inside a ``<think>`` block (DeepSeek-V3.1 with
    thinking, MiniMax-M2): the output's first text is then read as reasoning."""
    spec = rp.resolve(target.model, target.tokenizer)
    return spec is not None and spec.opener == "<think>" and target.tokenizer.decode(
        list(prompt_ids[-16:])).rstrip().endswith(spec.opener)


def after_reasoning(c: Constraint | None, target: Target, prompt_ids: Sequence[int]
                    ) -> Constraint | None:
    """``c`` for a prompt that opened a reasoning block: a JSON constraint closes the block
    first (``</think>``, so the parser reads the JSON as the answer, not as reasoning).
    Other kinds and other prompts: ``c`` as it is."""
    if c is None or c.kind not in ("json", "json_object") \
            or not opened_reasoning(target, prompt_ids):
        return c
    return Constraint("grammar", after_marker(c.text if c.kind == "json" else None,
                                              REASONING_CLOSER,
                                              target.tokenizer.added_token_id))


def forced_tools(target: Target, tools: Mapping[str, Mapping[str, Any]],
                 name: str | None, parallel: bool, param: str,
                 prompt_ids: Sequence[int] = ()) -> Constraint:
    """A forced call: of ``name`` (a named choice), else of any offered tool (one, or up to
    ``tool_grammar.MAX_CALLS`` when ``parallel``). ``tools``: name → parameters schema.
    A prompt that opened a reasoning block (``prompt_ids``) gets its closer first."""
    if not tools:
        raise ApiError(400, "a forced tool choice needs `tools`", "invalid_request", param)
    if name is not None and name not in tools:
        raise ApiError(400, "The tool specified in `tool_choice` does not match any of the "
                       "specified `tools`", "invalid_request", param)
    names: Sequence[str] = [name] if name is not None else list(tools)
    family = target.model.tool_parser or family_for_model(target.model.model_path)
    try:
        grammar = forced_calls(family, tools, names, target.tokenizer.added_token_id,
                               parallel=parallel and name is None,
                               first=REASONING_CLOSER if opened_reasoning(target, prompt_ids)
                               else None)
    except ForcedCallsUnsupported as e:
        raise ApiError(400, str(e), "invalid_request", param) from e
    return Constraint("grammar", grammar)


def one_of(found: Sequence[tuple[str, Constraint | None]]) -> Constraint | None:
    """The one constraint a request sets, from the fields that can set one (param, value);
    two set at once is a 400 naming the second, as vLLM refuses two kinds at once."""
    given = [(param, c) for param, c in found if c is not None]
    if len(given) > 1:
        raise ApiError(400, f"only one kind of structured output constraint may be given; "
                       f"got {', '.join(p for p, _ in given)}", "invalid_request", given[1][0])
    return given[0][1] if given else None
