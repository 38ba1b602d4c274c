"""``deepseek-v3.2``: DSML, ``<｜DSML｜function_calls>`` around ``<｜DSML｜invoke name="f">``
blocks of ``<｜DSML｜parameter name="p" string="true|false">v</｜DSML｜parameter>``
(DeepSeek-V3.2; V3.2-Exp wrote the V3.1 format). ``string="false"`` values are JSON;
all are typed by the tool's schema when it declares one.
"""

from router.output.tool_parsers.base import Family, Schemas, ToolCall
from router.output.tool_parsers.xml_calls import decode_invokes

DSML = "｜DSML｜"


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    return decode_invokes(payload, schemas, prefix=DSML)


# The template spells the tags through a variable: only the DSML token itself shows.
FAMILY = Family("deepseek-v3.2", f"<{DSML}function_calls>", f"</{DSML}function_calls>",
                decode, (DSML,))
