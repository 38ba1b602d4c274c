"""One benchmark stack's life, for every bench that deploys kvroute: a local Ray on
loopback (or ``RAY_ADDRESS``), a config deployed, ``/health`` waited for, the URL handed
to the bench, the app deleted and Ray shut down, on success or error. The work is
``deploy.serve.runtime``'s; this only orders it.

    with stack(config.build(spec), num_cpus=4) as url:
        ...

A bench that deploys several configs on one cluster nests ``deployed`` in ``local_ray``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from deploy.config import KvrouteConfig

HEALTHY_TIMEOUT_S = 300.0
T = TypeVar("T")


def bench_env() -> None:
    """Set before Ray loads: a local cluster on loopback, and Serve's per-request logs kept
    in their files instead of streaming to the bench's terminal."""
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")


def start_ray(num_cpus: int | None = None, tries: int = 1, retry_wait_s: float = 10.0) -> None:
    """A local Ray; ``tries`` > 1 retries, since a raylet on a saturated machine can miss
    Ray's fixed 30 s registration window (a failed start leaves no process behind)."""
    import ray

    from deploy.serve import runtime

    for attempt in range(tries):
        try:
            runtime.init_ray("127.0.0.1", num_cpus=num_cpus)
            return
        except Exception:
            if ray.is_initialized():
                ray.shutdown()
            if attempt == tries - 1:
                raise
            time.sleep(retry_wait_s)


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None, tries: int = 1) -> Iterator[None]:
    """Ray (and Serve, once something deploys) for the block; shut down after it."""
    from deploy.serve import runtime

    bench_env()
    start_ray(num_cpus, tries)
    try:
        yield
    finally:
        runtime.shutdown()


@contextlib.contextmanager
def deployed(config: KvrouteConfig, timeout_s: float = HEALTHY_TIMEOUT_S) -> Iterator[str]:
    """``config`` deployed on the running Ray, healthy: its URL; the app deleted after."""
    from ray import serve

    from deploy.serve import runtime

    url = runtime.deploy(config)
    try:
        runtime.wait_healthy(url, timeout_s=timeout_s)
        yield url
    finally:
        with contextlib.suppress(Exception):  # not deployed: nothing to delete
            serve.delete(runtime.APP_NAME)


@contextlib.contextmanager
def stack(config: KvrouteConfig, num_cpus: int | None = 4,
          timeout_s: float = HEALTHY_TIMEOUT_S) -> Iterator[str]:
    """A fresh local Ray running ``config``: its URL for the block."""
    with local_ray(num_cpus), deployed(config, timeout_s) as url:
        yield url


def with_fresh_ray(run: Callable[[], T], num_cpus: int | None = 4, attempts: int = 3) -> T:
    """``run()`` on a fresh local Ray, the whole of it again (new Ray, new deploy) if it
    raises, up to ``attempts`` times: on a saturated machine Serve's proxy or a raylet can
    miss its start-up window, which no later step recovers from."""
    for attempt in range(1, attempts + 1):
        try:
            with local_ray(num_cpus, tries=3):
                return run()
        except Exception as e:
            if attempt == attempts:
                raise
            print(f"attempt {attempt} of {attempts} failed ({type(e).__name__}: {e}); "
                  "again on a fresh Ray", flush=True)
    raise AssertionError("unreachable")
