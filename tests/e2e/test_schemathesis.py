"""Schemathesis against a real stack (API keys on): generated requests on every API never get a 5xx.

Real Ray Serve, one sim-engine replica and one mlx replica of the tiny model (CPU MLX:
engine-dependent failures, such as a seed the engine refuses, only show on a real
engine). The schema is loaded from the live
``/openapi.json`` (``router.app.openapi.kvroute_openapi``: request bodies from the
pydantic models, error responses in each API's shape). Schemathesis generates
valid and invalid bodies for every operation (one hypothesis run per operation
and mode, via ``APIOperation.as_strategy``: schemathesis' lazy ``from_fixture``
fails under pytest 9); most generated bodies (3 in 4) get the served model's
name, so generation reaches templating, routing and the engine rather than stopping
at a 404. Checks:

- no 5xx (``not_a_server_error``), and every error body in its API's shape;
- the status and content type are ones the document declares, and the body
  matches the declared schema (the error shapes included).

Not checked: ``positive_data_acceptance`` (a valid body may still be a 404 for an
unknown model or a 400 for a prompt over the context) and ``negative_data_rejection`` (pydantic's
lax mode accepts ``"3"`` for an integer, as OpenAI-compatible servers commonly do).
Budget: ``KVROUTE_SCHEMATHESIS_EXAMPLES`` (default 50) examples per operation on the sim
model; ``KVROUTE_SCHEMATHESIS_MLX_EXAMPLES`` (default 6) valid bodies per POST operation on
the mlx model, each naming it, with ``max_tokens`` capped at 8 so a case costs one short
generation.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from deploy.config import IndexConfig, ModelConfig
from deploy.config.auth import ApiKeyConfig, AuthConfig
from router.auth.keys import hash_key
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL, MLX = "sim-model", "mlx-model"
# Keys on, as production runs (review: the suite ran open): every case carries one.
KEY = "sk-kvr-schemathesis-key"
AUTH = {"authorization": f"Bearer {KEY}"}
EXAMPLES = int(os.environ.get("KVROUTE_SCHEMATHESIS_EXAMPLES", "50"))
MLX_EXAMPLES = int(os.environ.get("KVROUTE_SCHEMATHESIS_MLX_EXAMPLES", "6"))
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
         "/v1/messages/count_tokens", "/tokenize", "/detokenize")
GETS = ("/v1/models", "/v1/models/{model_id}", "/health", "/metrics", "/kvroute/replicas",
        "/version")
OPERATIONS = [*(("POST", p) for p in POSTS), *(("GET", p) for p in GETS)]


@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, context_window=2048, default_max_tokens=8,
                      max_queued_requests=256, tpot_s=0.0002, prefill_tok_s=1e6)
    mlx = ModelConfig(name=MLX, engine="mlx", model_path=str(tiny_model_dir), num_replicas=1,
                      num_cpus=0.5, context_window=2048, default_max_tokens=8)
    auth = AuthConfig(api_keys=[ApiKeyConfig(name="schemathesis", key_sha256=hash_key(KEY))])
    with deployed(stack_config(serve_port, model, mlx, index=IndexConfig(redis_url=None),
                               auth=auth), timeout_s=300) as base:
        yield base


@pytest.fixture(scope="module")
def api_schema(url: str) -> Any:
    """The live document, checked to be the complete one (request bodies included)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", wait_for_schema=30.0,
                                           headers=AUTH)
    paths = schema.raw_schema["paths"]
    served = {(m.upper(), p) for p, ops in paths.items() for m in ops}
    assert served == set(OPERATIONS), f"update OPERATIONS: the app serves {sorted(served)}"
    for path in POSTS:
        assert "requestBody" in paths[path]["post"], (
            f"{path}: /openapi.json has no request body; wire router.app.openapi.kvroute_openapi "
            "into router/app/ingress.py (app.openapi = lambda: kvroute_openapi(app))")
    return schema


def api_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx body on an API route is that API's error JSON."""
    if response.status_code < 400 or not case.path.startswith("/v1/"):
        return None
    body = response.json()
    if case.path.startswith("/v1/messages"):
        assert body.get("type") == "error", body
        assert {"type", "message"} <= set(body.get("error", {})), body
    else:
        assert {"message", "type", "param", "code"} <= set(body.get("error", {})), body
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
MODES = {"positive": GenerationMode.POSITIVE, "negative": GenerationMode.NEGATIVE}
CASES = [pytest.param(m, p, mode, id=f"{m} {p} {mode}") for m, p in OPERATIONS
         for mode in (("positive", "negative") if m == "POST" else ("positive",))]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_api_never_answers_5xx(api_schema: Any, method: str, path: str, mode: str) -> None:
    """Generated requests (valid, or invalid for ``negative``) never get a 5xx."""
    fuzz(api_schema, method, path, mode, MODEL, EXAMPLES if method == "POST" else 3)


@pytest.mark.parametrize("path", POSTS)
def test_mlx_engine_never_answers_5xx(api_schema: Any, path: str) -> None:
    """Valid bodies, every one naming the mlx model: the real engine's input handling."""
    fuzz(api_schema, "POST", path, "positive", MLX, MLX_EXAMPLES, always=True)


def fuzz(api_schema: Any, method: str, path: str, mode: str, model: str, examples: int,
         always: bool = False) -> None:
    """``examples`` generated cases of one operation, most (``always``: all) naming
    ``model``, each checked (``CHECKS``, the error shapes)."""
    operation = api_schema[path][method]
    statuses: Counter[int] = Counter()

    @given(case=operation.as_strategy(generation_mode=MODES[mode]), named=st.integers(0, 3))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any, named: int) -> None:
        if (always or named < 3) and isinstance(case.body, dict):  # reach the engine
            case.body = {**case.body, "model": model}
            if always:  # one short generation per case on a real engine
                case.body.update({k: min(v, 8) for k, v in case.body.items()
                                  if k in LENGTH_FIELDS and isinstance(v, int)})
        response = case.call(headers=AUTH, timeout=60)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS, additional_checks=[api_error_shape])

    run()
    print(f"{method} {path} {mode} on {model}: statuses {dict(sorted(statuses.items()))}")
