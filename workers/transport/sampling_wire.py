"""The sampling controls on the loopback call's wire (``workers.transport.loopback_wire``).

The ``REQUEST`` header carries ``SamplingParams``' first fields as its ``sampling`` list;
the controls added after them (top-k, min-p, the penalties, logit bias, min tokens, stop
token ids, bad words) travel as one more list, ``controls``, in ``CONTROLS`` order. A
header without it (an older router) means every control off. Every value is checked: a
bad one is ``ValueError``, never a crash.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from workers.protocol import SamplingParams

CONTROLS = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias", "min_tokens", "stop_token_ids", "bad_words")
_OFF = SamplingParams()


def controls(s: SamplingParams) -> list[Any] | None:
    """The wire's ``controls`` list; None when every control is off (the common case)."""
    values = [getattr(s, name) for name in CONTROLS]
    if values == [getattr(_OFF, name) for name in CONTROLS]:
        return None
    out = values[:5] + [[list(p) for p in s.logit_bias], s.min_tokens,
                        list(s.stop_token_ids), list(s.bad_words)]
    return out


def _bad(name: str) -> ValueError:
    return ValueError(f"loopback request: bad {name}")


def _int(v: Any, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(name)
    return v


def _float(v: Any, name: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise _bad(name)
    return float(v)


def _list(v: Any, name: str) -> list[Any]:
    if not isinstance(v, list):
        raise _bad(name)
    return v


def with_controls(base: SamplingParams, wire: Any) -> SamplingParams:
    """``base`` with the controls of a header's ``controls`` value (None: all off)."""
    if wire is None:
        return base
    v = _list(wire, "controls")
    if len(v) != len(CONTROLS):
        raise _bad("controls")
    bias = tuple((_int(p[0], "logit_bias"), _float(p[1], "logit_bias"))
                 for p in _list(v[5], "logit_bias") if len(_list(p, "logit_bias")) == 2)
    if len(bias) != len(v[5]):
        raise _bad("logit_bias")
    words = tuple(_list(v[8], "bad_words"))
    if not all(isinstance(w, str) for w in words):
        raise _bad("bad_words")
    return replace(
        base, top_k=_int(v[0], "top_k"), min_p=_float(v[1], "min_p"),
        presence_penalty=_float(v[2], "presence_penalty"),
        frequency_penalty=_float(v[3], "frequency_penalty"),
        repetition_penalty=_float(v[4], "repetition_penalty"), logit_bias=bias,
        min_tokens=_int(v[6], "min_tokens"),
        stop_token_ids=tuple(_int(t, "stop_token_ids") for t in _list(v[7], "stop_token_ids")),
        bad_words=words)
