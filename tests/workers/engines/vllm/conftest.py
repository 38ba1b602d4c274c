"""One vLLM engine for the modules here (engine, sampling, structured outputs).

They asked for the same engine (the tiny model, 32-token vLLM blocks, an 8 MiB KV cache,
seed 0), and starting one costs ~20 s of CPU. Each module's prompts are its own (distinct
seeds or token patterns), so no module's cache-hit assertion reads another's blocks; a
module that counts events drains the queue first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from workers.engines.vllm.engine import VllmEngine

MODEL = "tiny-llama-v1"
CANONICAL_BLOCK = 64
KWARGS = {"block_size": 32, "kv_cache_memory_bytes": 8 << 20, "seed": 0}


@pytest_asyncio.fixture(scope="package", loop_scope="session")  # gone after the package
async def vllm_engine(tiny_model_dir: Path) -> AsyncIterator[VllmEngine]:
    eng = VllmEngine(str(tiny_model_dir), MODEL, "r0", CANONICAL_BLOCK, dict(KWARGS))
    await eng.start()
    yield eng
    await eng.shutdown()
