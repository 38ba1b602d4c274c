"""``hermes``: ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``.

Qwen2.5, Qwen3 (instruct and thinking), Hermes and the tiny test model write this;
their templates teach it with ``<tool_call>`` (Qwen3-Coder's template also does, so
that family is told apart by its ``<function=`` markup, checked first).
"""

from router.output.tool_parsers.base import Family, decode_json_calls

FAMILY = Family("hermes", "<tool_call>", "</tool_call>", decode_json_calls, ("<tool_call>",))
