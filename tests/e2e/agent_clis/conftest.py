"""The agent CLIs' fixtures: ``stack`` (the scripted stack, one config for every module
here, so ``tests.stacks`` keeps one app for them all) and ``recorder`` (a recording proxy
in front of it, one per test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents import clis
from tests.agents.recorder import Recorder


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from clis.serve_stack(serve_port, tiny_model_dir, stack_redis, tmp_path_factory)


@pytest.fixture
def recorder(stack: str) -> Iterator[Recorder]:
    yield from clis.record(stack)
