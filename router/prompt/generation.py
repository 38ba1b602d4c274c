"""A model's own sampling defaults, from its ``generation_config.json``, as vLLM reads them.

vLLM (``--generation-config auto``, its default) fills every sampling field a request
leaves unset from the model's generation config (``ModelConfig.get_diff_sampling_param``),
else from OpenAI's defaults (temperature 1.0, top-p 1.0, no top-k, min-p or penalty).
kvroute does the same on every API (``router.api.common.sampling``), so a model served
through it samples as it does behind ``vllm serve``. A value of the wrong type or out of
range in the file is dropped, never a failed load.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FILE = "generation_config.json"


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """The defaults of an unset field (OpenAI's unless the model's file says otherwise)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @classmethod
    def load(cls, folder: Path) -> GenerationDefaults:
        path = folder / FILE
        try:
            raw = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError) as e:
            log.warning("%s unreadable, OpenAI's sampling defaults apply: %s", path, e)
            return cls()
        return cls.from_config(raw if isinstance(raw, dict) else {})

    @classmethod
    def from_config(cls, raw: dict[str, object]) -> GenerationDefaults:
        checks = {
            "temperature": lambda v: 0.0 <= v <= 2.0,
            "top_p": lambda v: 0.0 < v <= 1.0,
            "top_k": lambda v: v == int(v) and v >= -1,
            "min_p": lambda v: 0.0 <= v <= 1.0,
            "repetition_penalty": lambda v: v > 0.0,
            "presence_penalty": lambda v: -2.0 <= v <= 2.0,
            "frequency_penalty": lambda v: -2.0 <= v <= 2.0,
        }
        got: dict[str, float | int] = {}
        for name, ok in checks.items():
            v = raw.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            if ok(v):
                got[name] = int(v) if name == "top_k" else float(v)
        return cls(**got)  # type: ignore[arg-type]
