"""A request's ``Constraint`` (``workers.protocol``) as vLLM's structured-outputs sampling
parameter: ``StructuredOutputsParams`` (vLLM 0.11 and later), else ``GuidedDecodingParams``
(older releases).

The engine runs vLLM's guidance backend (``structured_config``): llguidance, the library
the mlx engine uses, so a grammar means the same on both; the router's forced tool calls
are Lark in its dialect (``%json``, ``<[token id]>``). JSON is kept compact
(``disable_any_whitespace``), as on the mlx engine, so a model cannot pad its output with
whitespace forever.
"""

from __future__ import annotations

import json
from typing import Any

from workers.protocol import Constraint


def _fields(c: Constraint) -> dict[str, Any]:
    if c.kind == "json":
        return {"json": json.loads(c.text), "disable_any_whitespace": True}
    if c.kind == "json_object":
        return {"json_object": True, "disable_any_whitespace": True}
    if c.kind == "choice":
        return {"choice": list(c.choices)}
    return {c.kind: c.text}  # regex, grammar


def structured_config() -> dict[str, Any]:
    """The engine's structured-outputs settings (``AsyncEngineArgs``): vLLM's guidance
    backend, llguidance as on the mlx engine (it reads the router's forced-call grammars,
    regexes, choices and JSON schemas alike), with compact JSON. vLLM reads
    ``disable_any_whitespace`` from the engine's config only, and only for the xgrammar
    and guidance backends, so the backend is named here rather than left on ``auto``."""
    try:
        from vllm.config import StructuredOutputsConfig
    except ImportError:  # pragma: no cover - vLLM before 0.11: its own defaults
        return {}
    return {"structured_outputs_config": StructuredOutputsConfig(
        backend="guidance", disable_any_whitespace=True)}


def sampling_kwargs(c: Constraint | None) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``SamplingParams`` that carry ``c`` (none: empty)."""
    if c is None:
        return {}
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:  # pragma: no cover - vLLM before 0.11
        from vllm.sampling_params import GuidedDecodingParams

        fields = _fields(c)
        fields.pop("disable_any_whitespace", None)
        return {"guided_decoding": GuidedDecodingParams(**fields)}
    return {"structured_outputs": StructuredOutputsParams(**_fields(c))}
