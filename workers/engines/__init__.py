"""Engine registry: engine name → adapter constructor.

Adapters import their runtime lazily, so a missing package is reported with the
extra to install rather than failing at import time.
"""

from __future__ import annotations

from collections.abc import Callable

from deploy.config import ModelConfig
from workers.protocol import Engine

EngineFactory = Callable[[ModelConfig, str, int], Engine]


def _mlx(cfg: ModelConfig, replica: str, block_size: int) -> Engine:
    from workers.engines.mlx.engine import MlxEngine

    kw = cfg.mlx_kwargs().model_dump(exclude_none=True)  # validated at config load
    return MlxEngine(
        cfg.model_path, cfg.name, replica, block_size,
        cache_bytes=kw.pop("cache_bytes", 1 << 30),
        max_cache_entries=kw.pop("max_cache_entries", 64), **kw,
    )


def _sim(cfg: ModelConfig, replica: str, block_size: int) -> Engine:
    from workers.engines.sim.engine import SimEngine, SimParams
    from workers.engines.sim.script import SimScript
    from workers.engines.sim.vocab import SimVocab

    kw = dict(cfg.engine_kwargs)
    # The script is the adapter's, not the core's: SimParams keeps its strict key check.
    script_path = kw.pop("script_path", None)
    if script_path is not None and not isinstance(script_path, str):
        raise ValueError(f"sim engine_kwargs.script_path must be a string, got {script_path!r}")
    if (profile := kw.pop("profile", None)) is not None:  # fitted defaults, kwargs override
        from workers.engines.sim.profile import load_profile

        kw = {**load_profile(str(profile)), **kw}
    params = SimParams.from_kwargs(kw, block_size)
    script = SimScript.load(script_path, cfg.model_path) if script_path is not None else None
    # The model's own words, unless ids below an explicit vocab_size are asked for.
    vocab = None if "vocab_size" in kw else SimVocab.of_model(cfg.model_path)
    engine = SimEngine(cfg.name, replica, block_size, params, script, vocab)
    if cfg.vllm_kv_events is not None:  # benchmarks of peer routers that read vLLM's events
        from workers.engines.sim.vllm_wire import VllmEventPublisher

        engine.set_event_tap(VllmEventPublisher(block_size, cfg.vllm_kv_events.block_size))
    return engine


def _vllm(cfg: ModelConfig, replica: str, block_size: int) -> Engine:
    from workers.engines.vllm.engine import VllmEngine  # imports vllm lazily, in start()

    return VllmEngine(cfg.model_path, cfg.name, replica, block_size, cfg.engine_kwargs)


ENGINES: dict[str, EngineFactory] = {"mlx": _mlx, "sim": _sim, "vllm": _vllm}


def make_engine(cfg: ModelConfig, replica: str, block_size: int) -> Engine:
    try:
        factory = ENGINES[cfg.engine]
    except KeyError:
        raise ValueError(
            f"engine {cfg.engine!r} is not available; known engines: {sorted(ENGINES)}"
        ) from None
    return factory(cfg, replica, block_size)
