"""Starting and stopping kvroute on Ray: shared by the CLI and the tests."""

from __future__ import annotations

import os
import time

import httpx
import ray
from ray import serve

from deploy.builder import build_app
from deploy.config import KvrouteConfig
from deploy.serve_env import cluster_env

APP_NAME = "kvroute"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def init_ray(host: str = "127.0.0.1", num_cpus: int | None = None) -> None:
    """Join ``RAY_ADDRESS`` if set, else start a local Ray (on loopback for a local host)."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or None
    if address is None and host in _LOOPBACK:
        # Ray 2.60 binds to the machine's address unless told otherwise.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": True,
                                 "runtime_env": {"env_vars": cluster_env()}}
    if address is None:
        kwargs["num_cpus"] = num_cpus or max(4, os.cpu_count() or 1)
    # "local": always a fresh cluster, never silently joining another one on this host
    ray.init(address=address or "local", **kwargs)


def deploy(config: KvrouteConfig) -> str:
    """Deploy the app on the running Ray; returns the base URL."""
    serve.start(http_options=http_options(config), proxy_location=config.server.proxy_location)
    serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
    host = config.server.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{config.server.port}"


def http_options(config: KvrouteConfig) -> dict[str, object]:
    """Serve's proxy options: bind address and the end-to-end request timeout."""
    server = config.server
    return {"host": server.host, "port": server.port,
            "request_timeout_s": server.request_timeout_s}


def wait_healthy(url: str, timeout_s: float = 600.0) -> float:
    """Polls ``/health`` until 200; returns seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url}/health not ready after {timeout_s:.0f} s")


def shutdown() -> None:
    if ray.is_initialized():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
