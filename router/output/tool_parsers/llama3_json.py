"""``llama3-json``: ``<|python_tag|>{"name": .., "parameters": {..}}``, several joined by
``;``, or an output that is one such JSON object (Llama 3.1-3.3's JSON tool calling).

Detected by ``<|python_tag|>`` in the template; Llama 3.x templates without it are
recognised by ``"parameters"`` together with ``ipython`` (see ``router.output.tool_parsers``).
"""

from router.output.tool_parsers.base import Family, decode_json_calls

FAMILY = Family("llama3-json", "<|python_tag|>", None, decode_json_calls,
                ("<|python_tag|>",), bare_json=True)
