"""Wire helpers every API's encoder uses: JSON string quoting for the streams' pre-built
byte templates."""

from __future__ import annotations

from collections.abc import Callable
from json.encoder import encode_basestring_ascii

# ``json.dumps(text)`` for a str, without its Python layers: the function it calls.
quote: Callable[[str], str] = encode_basestring_ascii
