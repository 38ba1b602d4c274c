"""A Redis fleet for ``kvroute bench failover``: a primary, one replica and three Sentinels
(``redis-server --sentinel``), each a ``redis-server`` process on a free loopback port in a
temp dir, stopped by its own pid.

The Sentinel values are those of ``tests/cache_service/test_sentinel_failover.py``: a quorum
of 2 and ``down-after-milliseconds`` 500, so a killed primary is replaced in about two
seconds on loopback.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ops.bench.harness.procs import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
MASTER = "kvroute"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 5000


def sentinel_conf(primary_port: int, master: str = MASTER) -> str:
    """A Sentinel's config watching ``primary_port`` (Sentinels rewrite it, so one file each)."""
    return (f"sentinel monitor {master} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {master} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {master} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {master} 1\n")


@dataclass
class Node:
    """One redis-server process (a data node or a Sentinel)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]

    def client(self, timeout_s: float = 0.5) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s,
                           socket_connect_timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: the crash a failover is for (no shutdown save, no goodbye to clients)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class RedisFleet:
    primary: Node
    replica: Node
    sentinels: list[Node] = field(default_factory=list)
    master: str = MASTER

    @property
    def sentinel_addrs(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def current_primary(self) -> tuple[str, int] | None:
        """What the first Sentinel that answers says the primary is."""
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError, OSError):
                addr = s.client().execute_command("SENTINEL", "get-master-addr-by-name",
                                                  self.master)
                if addr:
                    return addr[0].decode(), int(addr[1])
        return None

    def wait_replicated(self, timeout_ms: int = 5000) -> bool:
        """True once the replica has acknowledged every write the primary took so far."""
        return bool(self.primary.client(timeout_ms / 1000 + 1).execute_command(
            "WAIT", 1, timeout_ms) >= 1)

    def wait_promotion(self, timeout_s: float = 30.0, interval_s: float = 0.02) -> float:
        """Seconds until a Sentinel names the replica as the primary (TimeoutError after)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.current_primary() == ("127.0.0.1", self.replica.port):
                return time.monotonic() - start
            time.sleep(interval_s)
        raise TimeoutError(f"no Sentinel promoted the replica within {timeout_s} s")


def _start(name: str, workdir: Path, *extra: str) -> Node:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [REDIS_SERVER, *extra, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    node = Node(name, port, proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if node.client(0.2).ping():
                return node
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server {name} exited with {proc.returncode}")
        time.sleep(0.05)
    node.kill()
    raise TimeoutError(f"redis-server {name} did not answer PING")


@contextlib.contextmanager
def redis_fleet() -> Iterator[RedisFleet]:
    """A primary, its replica (in sync) and three Sentinels watching them; all stopped after."""
    nodes: list[Node] = []
    with tempfile.TemporaryDirectory(prefix="kvroute-failover-") as tmp:
        root = Path(tmp)
        try:
            nodes.append(_start("primary", root / "primary"))
            primary = nodes[0]
            nodes.append(_start("replica", root / "replica", "--replicaof", "127.0.0.1",
                                str(primary.port)))
            for i in range(3):
                conf = root / f"sentinel{i}.conf"
                conf.write_text(sentinel_conf(primary.port))
                nodes.append(_start(f"sentinel{i}", root / f"s{i}", str(conf), "--sentinel"))
            fleet = RedisFleet(primary, nodes[1], nodes[2:])
            _wait_ready(fleet)
            yield fleet
        finally:
            for node in nodes:
                node.kill()


def _wait_ready(fleet: RedisFleet, timeout_s: float = 20.0) -> None:
    """The replica linked and every Sentinel seeing it: before that a kill has no failover."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            link = fleet.replica.client().info("replication").get("master_link_status")
            seen = [s.client().execute_command("SENTINEL", "replicas", fleet.master)
                    for s in fleet.sentinels]
            if link == "up" and all(seen):
                return
        time.sleep(0.1)
    raise TimeoutError("the replica or the Sentinels were not ready")
