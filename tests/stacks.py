"""Real kvroute stacks for the end-to-end tests: sim models, Redis URLs, a deployed app.

A module's fixture builds its config with ``sim_model`` and ``stack_config`` (models
on the session's loopback port, where the router replicas listen themselves unless the
config asks for Serve's proxy) and serves it with ``deployed``, which waits for
``/health`` and always deletes the app again, so the next module starts clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from deploy.config import KvrouteConfig, ModelConfig, ServerConfig


class HostPort(Protocol):
    """A running server fixture, such as pytest-redis's ``redis_proc``."""

    host: str
    port: int


def sim_model(
    name: str, model_dir: Path, *, replicas: int = 1, tpot_s: float = 0.002,
    prefill_tok_s: float = 100000.0, num_cpus: float = 0.1, **fields: Any,
) -> ModelConfig:
    """A sim-engine model on the tiny model's tokenizer; ``fields`` are other ModelConfig fields."""
    return ModelConfig(
        name=name, engine="sim", model_path=str(model_dir), num_replicas=replicas,
        num_cpus=num_cpus, engine_kwargs={"tpot_s": tpot_s, "prefill_tok_s": prefill_tok_s},
        **fields,
    )


def redis_url(proc: HostPort) -> str:
    return f"redis://{proc.host}:{proc.port}/0"


def stack_config(port: int, *models: ModelConfig, **sections: Any) -> KvrouteConfig:
    """``models`` served on 127.0.0.1:``port``, plus other sections (index, router, auth...)."""
    return KvrouteConfig(
        models=list(models), server=ServerConfig(host="127.0.0.1", port=port), **sections
    )


@contextmanager
def deployed(cfg: KvrouteConfig, timeout_s: float = 120.0) -> Iterator[str]:
    """Deploy ``cfg`` on the running Ray, wait until healthy, yield its URL; then delete it."""
    from ray import serve

    from deploy.serve import runtime

    if cfg.server.ingress == "proxy":  # on the port Serve's proxy holds this session
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(
            update={"port": proxy_port()})})
    try:
        url = runtime.deploy(cfg)
        runtime.wait_healthy(url, timeout_s=timeout_s)
        yield url
    finally:
        serve.delete(runtime.APP_NAME)


def proxy_port() -> int:
    """The port of this session's Serve proxy, started on a free port if it is not running.

    Serve keeps the proxy of its first start for the whole session, so an app behind the
    proxy must use its port; the routers of the other apps (``server.ingress`` resolved to
    direct) listen on the session's ``serve_port``, which the proxy never takes."""
    from ray import serve

    from deploy.serve import runtime
    from tests.conftest import free_port

    port = runtime.proxy_port()
    if port is None:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    return port


def counter(url: str, name: str) -> float:
    """A counter's total over all its label sets, from the stack's merged ``/metrics``.

    ``/metrics`` is a snapshot up to ``CACHE_S`` old (``router.app.metrics_hub.MetricsCache``):
    waiting that long first makes the figure include everything done before the call."""
    import time

    import httpx

    from router.app.metrics_hub import CACHE_S

    time.sleep(CACHE_S + 0.1)
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((f"{name}{{", f"{name} ")))


def report_fault(fault: str, sent: int, failed: int, retried: float, worst_s: float) -> None:
    """One line per fault test (``pytest -s``): what the fault costs: requests, errors, recovery."""
    print(f"\nFAULT {fault}: sent {sent}, failed {failed}, retried {retried:.0f}, "
          f"worst {worst_s:.3f} s")
