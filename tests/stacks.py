"""Real kvroute stacks for the end-to-end tests: sim models, Redis URLs, a deployed app.

A module's fixture builds its config with ``sim_model`` and ``stack_config`` (models
on the session's loopback port, where the router replicas listen themselves unless the
config asks for Serve's proxy) and serves it with ``deployed``, which waits for
``/health``. One app runs at a time (one app name), held in a pool keyed by its config:
modules marked ``@pytest.mark.stack(name)`` with one name run one after another
(``tests/conftest.py`` orders them) and the second finds the first's app up when its
config is the same. Anything else replaces the app, and after a module whose
successor does not share it the app is deleted (``release``), so that module starts clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deploy.config import IndexConfig, KvrouteConfig, ModelConfig, ServerConfig


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


def shared_index(proc: HostPort, **fields: Any) -> IndexConfig:
    """The index of a stack whose tests assert where requests go, on ``proc``'s Redis.

    Its Redis calls get 500 ms (1 s hard cap) instead of the production 50 ms: on a busy
    machine (CI's two lanes) a 50 ms call times out, routing falls back to the per-router
    index, and an affinity assert fails for a reason the test is not about. The fault tests
    (chaos, index faults) keep the production timeouts."""
    return IndexConfig(redis_url=redis_url(proc), **{"timeout_s": 0.5, "op_timeout_s": 1.0,
                                                     **fields})


def stack_config(port: int, *models: ModelConfig, **sections: Any) -> KvrouteConfig:
    """``models`` served on 127.0.0.1:``port``, plus other sections (index, router, auth...)."""
    return KvrouteConfig(
        models=list(models), server=ServerConfig(host="127.0.0.1", port=port), **sections
    )


@dataclass
class _Pool:
    """The app this session runs, its config's JSON, and the fixtures holding it now."""

    key: str | None = None
    url: str = ""
    holders: int = 0


_POOL = _Pool()


@contextmanager
def deployed(cfg: KvrouteConfig, timeout_s: float = 120.0, fresh: bool = False
             ) -> Iterator[str]:
    """Serve ``cfg`` on the running Ray, wait until healthy, yield its URL.

    The app outlives the block: the next ``deployed`` with an equal config gets it as it is
    (checked healthy again), a different one deletes and replaces it. ``fresh``: a new app
    even if the pooled one has this config (a module that needs replicas nobody has loaded)."""
    from deploy.serve import runtime

    if cfg.server.ingress == "proxy":  # on the port Serve's proxy holds this session
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(
            update={"port": proxy_port()})})
    key = cfg.model_dump_json()
    if fresh and key == _POOL.key and not _POOL.holders:
        release()
    if key != _POOL.key:
        if _POOL.holders:
            raise RuntimeError("a stack is still held: one app runs at a time")
        release()
        url = runtime.deploy(cfg)
        _POOL.key, _POOL.url = key, url  # from here on release() deletes it
    try:
        runtime.wait_healthy(_POOL.url, timeout_s=timeout_s)
    except BaseException:
        release()
        raise
    _POOL.holders += 1
    try:
        yield _POOL.url
    finally:
        _POOL.holders -= 1


def release() -> None:
    """Delete the pooled app unless a fixture still holds it (a package-scoped stack)."""
    if _POOL.key is None or _POOL.holders:
        return
    import ray

    from deploy.serve import runtime

    _POOL.key = None
    if ray.is_initialized():  # at the session's end the Ray fixture has already shut it down
        delete_now(runtime.APP_NAME)


def delete_now(app: str, timeout_s: float = 60.0) -> None:
    """``serve.delete`` without the graceful drain: its replicas are killed, not asked to
    stop. Between test stacks nothing is in flight, and each stop would cost Serve's 2 s
    wait loop (``graceful_shutdown_wait_loop_s``) plus a controller round."""
    import time

    import ray
    from ray import serve

    serve.delete(app, _blocking=False)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == "serve" and actor["name"].startswith(f"SERVE_REPLICA::{app}#"):
            try:
                ray.kill(ray.get_actor(actor["name"], namespace="serve"), no_restart=True)
            except ValueError:  # already gone
                pass
    deadline = time.monotonic() + timeout_s
    while app in serve.status().applications:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Serve app {app!r} still there {timeout_s:.0f} s after delete")
        time.sleep(0.05)


def kill_replica(deployment: str, replica: str, timeout_s: float = 30.0) -> None:
    """SIGKILL one Serve replica of the kvroute app and return once Ray reports it dead.

    ``ray.kill`` only asks for the kill: a request sent right after it can still be
    served by the replica, so a test that asserts where the next request goes waits."""
    import time

    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from deploy.serve import runtime

    actor = ray.get_actor(f"SERVE_REPLICA::{runtime.APP_NAME}#{deployment}#{replica}",
                          namespace="serve")
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=1.0)
        except RayActorError:
            return
        except GetTimeoutError:
            continue
        time.sleep(0.05)
    raise TimeoutError(f"replica {replica} still alive {timeout_s:.0f} s after ray.kill")


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


def listener_pid(url: str) -> int:
    """The process listening on ``url``'s port: a stack's router replica under direct
    ingress. By port, not by name: another Ray on the machine (CI's other lane) may run
    a kvroute router too."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                and conn.pid:
            return int(conn.pid)
    raise AssertionError(f"nothing listens on port {port}")


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
