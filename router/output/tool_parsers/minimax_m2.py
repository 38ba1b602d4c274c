"""``minimax-m2``: ``<minimax:tool_call>`` around ``<invoke name="f">`` blocks of
``<parameter name="p">v</parameter>`` (MiniMax-M2); values typed by the tool's schema.
"""

from router.output.tool_parsers.base import Family, Schemas, ToolCall
from router.output.tool_parsers.xml_calls import decode_invokes


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    return decode_invokes(payload, schemas)


FAMILY = Family("minimax-m2", "<minimax:tool_call>", "</minimax:tool_call>", decode,
                ("<minimax:tool_call>",))
