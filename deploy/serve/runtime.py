"""Starting and stopping kvroute on Ray: shared by the CLI and the tests."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time

import httpx
import psutil
import ray
from ray import serve

from deploy.config import KvrouteConfig
from deploy.serve.builder import build_app
from deploy.serve.serve_env import cluster_env

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
    config = resolve_ingress(config, proxy_port())
    serve.start(http_options=http_options(config), proxy_location=config.server.proxy_location)
    serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
    host = config.server.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{config.server.port}"


def resolve_ingress(config: KvrouteConfig, proxy_port: int | None) -> KvrouteConfig:
    """``server.ingress: auto`` made ``direct`` or ``proxy`` for a deploy that starts Serve
    itself. ``proxy_port``: the port of a Serve proxy already running, if any.

    direct needs a fixed port that Serve's proxy does not hold (a Serve started by someone
    else keeps its http_options), and router autoscaling that never reaches 0 replicas (no
    listener would wake one); anything else stays behind the proxy."""
    server = config.server
    if server.ingress != "auto":
        return config
    scaling = config.router.autoscaling
    direct = (server.port != 0 and server.port != proxy_port
              and (scaling is None or scaling.min_replicas >= 1))
    resolved = server.model_copy(update={"ingress": "direct" if direct else "proxy"})
    return config.model_copy(update={"server": resolved})


def proxy_port() -> int | None:
    """The port of Serve's HTTP proxy in this Ray, or None while Serve is not running."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return None if client is None else int(client.http_config.port)


def http_options(config: KvrouteConfig) -> dict[str, object]:
    """Serve's proxy options: bind address and the end-to-end request timeout. With
    ``server.ingress: direct`` the router replicas hold ``host:port``, and the proxy (kept for
    Serve's own use) gets a free loopback port."""
    server = config.server
    host, port = server.host, server.port
    if server.ingress == "direct":
        host, port = "127.0.0.1", unclaimed_port()
    return {"host": host, "port": port, "request_timeout_s": server.request_timeout_s}


# Between Ray's worker ports (10002-19999 by default) and the kernel's ephemeral range
# (32768 and up): a port picked here is not handed to another process's bind(0) between the
# pick and Serve's bind, as Ray's own starting processes would.
_UNCLAIMED = range(20000, 32768)


def unclaimed_port(host: str = "127.0.0.1") -> int:
    """A free port outside the ranges other processes are given ports from."""
    for port in random.sample(_UNCLAIMED, 64):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port in {_UNCLAIMED.start}-{_UNCLAIMED.stop - 1} on {host}")


def proxy_url() -> str:
    """Serve's HTTP proxy on this node: the clients' URL unless ``server.ingress`` is direct,
    which moves the proxy to a free port (other apps deployed beside kvroute stay on it)."""
    port = proxy_port()
    if port is None:
        raise RuntimeError("Serve is not running in this Ray")
    return f"http://127.0.0.1:{port}"


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


def _ray_children() -> list[psutil.Process]:
    """This process's descendants that are Ray's (raylet, GCS, agents, workers): never the
    other programs a caller started (a Redis, a collector)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if any("/ray/" in part or part.startswith("ray::") for part in cmd):
                out.append(proc)
    return out


def shutdown(grace_s: float = 5.0) -> None:
    """Serve and Ray down; then whatever the local Ray left of its processes (its agents
    poll for their parent and would linger up to a minute) is ended too."""
    if not ray.is_initialized():
        return
    ours = _ray_children()  # a cluster we started, if any
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        left = [p for p in ours if p.is_running()]
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
