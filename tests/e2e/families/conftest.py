"""The families' end-to-end stack, started once for this package's modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.config import IndexConfig, LeaseConfig, RouterConfig
from tests.router.output.tool_parsers.family_stack import family_models
from tests.stacks import deployed, redis_url, stack_config


@pytest.fixture(scope="package")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models = family_models(tiny_model_dir, tmp_path_factory.mktemp("families"))
    cfg = stack_config(serve_port, *models, index=IndexConfig(redis_url=redis_url(stack_redis)),
                       router=RouterConfig(leases=LeaseConfig(enabled=True)))  # by_ending test
    with deployed(cfg, timeout_s=240) as url:
        yield url
