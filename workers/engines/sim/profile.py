"""Calibrated profiles of the ``sim`` engine emulator: the emulator's constants fitted to a
real engine on a model by ``kvroute bench calibrate``, loaded with
``engine_kwargs.profile`` (a profile's name in ``workers/engines/sim/profiles/``, or a path
to its JSON). The profile's ``fitted`` values are the defaults; ``engine_kwargs`` given
next to ``profile`` override them.

A profile file::

    {"engine": "mlx", "model": "tiny-llama-v1", "fitted": {"prefill_tok_s": ..., ...},
     "error": {"ttft_rel_median": ..., "ttft_rel_p90": ..., "hit_rate_diff": ...},
     "command": "kvroute bench calibrate ...", ...}
"""

from __future__ import annotations

import json
from pathlib import Path

PROFILES = Path(__file__).with_name("profiles")
FITTED = ("prefill_tok_s", "tpot_s", "tpot_per_batch_s", "prefill_base_s", "cache_load_tok_s")


def profile_path(name_or_path: str) -> Path:
    """A profile's file: ``name_or_path`` itself if it is a file, else a shipped profile."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = PROFILES / f"{name_or_path}.json"
    if shipped.is_file():
        return shipped
    known = sorted(p.stem for p in PROFILES.glob("*.json"))
    raise ValueError(f"sim profile {name_or_path!r}: no such file, and not one of {known}")


def load_profile(name_or_path: str) -> dict[str, float]:
    """The fitted constants of a profile (only the ones the emulator takes)."""
    path = profile_path(name_or_path)
    try:
        fitted = json.loads(path.read_text())["fitted"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"sim profile {path}: unreadable ({e})") from e
    if not isinstance(fitted, dict) or not all(isinstance(fitted.get(k, 0.0), int | float)
                                               for k in FITTED):
        raise ValueError(f"sim profile {path}: `fitted` must map {FITTED} to numbers")
    return {k: float(fitted[k]) for k in FITTED if k in fitted}
