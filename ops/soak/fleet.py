"""``kvroute soak --stack``: the soak's own fleet on loopback, and the faults it injects.

The fleet: a ``redis-server`` (the prefix index, sessions and rate limits), an OTLP collector
(rotel, when its package is installed; else none, and the report says so), and
``kvroute up --config`` (its own local Ray) with ``server.ingress: direct`` (two router
replicas listening on one port), a sim model (two replicas) and an mlx model (one replica of
the tiny model, CPU MLX).

Faults, in turn on a schedule (``--faults``, ``--fault-every``): ``redis-restart`` (SIGKILL,
back empty on the same port after ``REDIS_DOWN_S``), ``worker-kill`` (SIGKILL one sim
replica: Serve starts another), ``router-kill`` (SIGKILL one router replica: its connections
are cut, the kernel sends new ones to the other, Serve starts another). Each fault's victim
pids are recorded, so a process that dies otherwise counts as a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

SIM_MODEL, MLX_MODEL = "soak-sim", "soak-mlx"
FAULTS = ("redis-restart", "worker-kill", "router-kill")
REDIS_DOWN_S = 5.0


def _free_port() -> int:
    from ops.bench.harness.procs import free_port

    return free_port()


class RedisProc:
    """A ``redis-server`` on a fixed loopback port that can be killed and started again."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return
            time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None
        return pid

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class Collector:
    """rotel's OTLP receiver discarding what it gets (``--exporter blackhole``)."""

    def __init__(self, workdir: Path) -> None:
        import rotel

        self.binary = Path(rotel.__file__).parent / "rotel-agent"
        self.port, self.log = _free_port(), workdir / "rotel.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(self.binary), "start", "--otlp-http-endpoint", f"127.0.0.1:{self.port}",
             "--otlp-grpc-endpoint", f"127.0.0.1:{_free_port()}", "--exporter", "blackhole",
             "--pid-file", str(self.log.with_suffix(".pid"))],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Fleet:
    url: str
    redis: RedisProc
    collector: Collector | None
    models: tuple[str, ...]
    up_pid: int = 0  # the ``kvroute up`` process (the Ray driver)
    victims: set[int] = field(default_factory=set)  # pids the faults killed
    faults: list[dict[str, Any]] = field(default_factory=list)

    def extra_pids(self) -> list[int]:
        """Processes outside Ray's tree to sample: the driver, Redis and the collector."""
        procs = [self.redis.proc, self.collector.proc if self.collector else None]
        return [self.up_pid, *(p.pid for p in procs if p is not None)]


def build_config(port: int, redis_url: str, mlx: bool) -> Any:
    from deploy.config import IndexConfig, KvrouteConfig, ModelConfig, RouterConfig, ServerConfig
    from ops.models.tiny_model import ensure_model

    path = str(ensure_model())
    models = [ModelConfig(name=SIM_MODEL, engine="sim", model_path=path, num_replicas=2,
                          num_cpus=0.1, context_window=32768, max_ongoing_requests=32,
                          engine_kwargs={"tpot_s": 0.01, "prefill_tok_s": 20000.0})]
    if mlx:
        models.append(ModelConfig(name=MLX_MODEL, engine="mlx", model_path=path,
                                  num_replicas=1, num_cpus=0.5))
    return KvrouteConfig(models=models, index=IndexConfig(redis_url=redis_url),
                         router=RouterConfig(replicas=2),
                         server=ServerConfig(host="127.0.0.1", port=port, ingress="direct"))


@contextlib.contextmanager
def fleet(workdir: Path, mlx: bool = True, timeout_s: float = 900.0) -> Iterator[Fleet]:
    """The fleet running, for the block; everything stopped after it. kvroute runs as
    ``kvroute up --config`` in a process of its own, as an operator runs it: the soak is
    no Ray driver, so a Ray that dies under it is a crash the report counts, not the end
    of the soak."""
    import yaml

    redis = RedisProc()
    redis.start()
    env = dict(os.environ)
    collector = None
    with contextlib.suppress(ImportError):
        collector = Collector(workdir)
        collector.start()
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{collector.port}"
        env.setdefault("OTEL_SERVICE_NAME", "kvroute-soak")
    port = _free_port()
    config = workdir / "soak-fleet.yaml"
    config.write_text(yaml.safe_dump(build_config(port, redis.url, mlx).model_dump(
        mode="json", exclude_defaults=True)))
    url, up = f"http://127.0.0.1:{port}", None
    try:
        up = _start_up(config, env, workdir / "kvroute-up.log", url, timeout_s)
        models = (SIM_MODEL, MLX_MODEL) if mlx else (SIM_MODEL,)
        yield Fleet(url, redis, collector, models, up.pid)
    finally:
        if up is not None:
            _stop(up)
        redis.stop()
        if collector is not None:
            collector.stop()


def _start_up(config: Path, env: dict[str, str], log_path: Path, url: str, timeout_s: float,
              tries: int = 3) -> subprocess.Popen[bytes]:
    """``kvroute up --config``, healthy; started again when it exits during its start (a
    raylet on a saturated machine can miss Ray's fixed 30 s registration window)."""
    for attempt in range(tries):
        up = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "up", "--config", str(config)],
            stdout=log_path.open("ab"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        try:
            _wait_healthy(url, up, timeout_s)
            return up
        except RuntimeError:  # it exited
            if attempt == tries - 1:
                raise
            time.sleep(10)
        except BaseException:  # not healthy in time, or Ctrl-C: stop it before leaving
            _stop(up)
            raise
    raise AssertionError("unreachable")


def _wait_healthy(url: str, up: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"kvroute up exited with {up.returncode} (its log: "
                               "kvroute-up.log beside the report)")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(2)
    raise TimeoutError(f"the soak's fleet was not healthy within {timeout_s:.0f} s")


def _stop(up: subprocess.Popen[bytes]) -> None:
    """SIGTERM (``kvroute up`` shuts Ray down cleanly), then its process group."""
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(180)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
            up.wait(30)


def _replica_pids(deployment: str) -> list[int]:
    tag = f"ServeReplica:kvroute:{deployment}"
    return sorted(p.pid for p in psutil.process_iter(["cmdline"])
                  if any(tag in part for part in (p.info["cmdline"] or [])[:1]))


def listeners(port: int) -> list[int]:
    return sorted({c.pid for c in psutil.net_connections("tcp") if c.pid and c.laddr
                   and c.laddr.port == port and c.status == psutil.CONN_LISTEN})


def inject(f: Fleet, fault: str, t_s: float) -> dict[str, Any]:
    """Inject ``fault`` now; what was killed, for the report."""
    port = int(f.url.rsplit(":", 1)[1])
    if fault == "redis-restart":
        pids = [f.redis.kill()]
        time.sleep(REDIS_DOWN_S)
        f.redis.start()
    else:
        pool = _replica_pids(SIM_MODEL) if fault == "worker-kill" else listeners(port)
        pids = pool[:1]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    f.victims.update(pids)
    event = {"t_s": round(t_s, 1), "fault": fault, "pids": pids}
    f.faults.append(event)
    return event
