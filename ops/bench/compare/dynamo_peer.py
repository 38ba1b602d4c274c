"""NVIDIA Dynamo 1.6.1's KV router (``--router-mode kv``) over the same sim replicas.

Dynamo routes only to Dynamo endpoints, and its ZMQ event-plane sockets bind
``tcp://0.0.0.0`` (no setting changes that), so it runs in a network namespace of its own
that has only loopback (``unshare -n``, root): its frontend (OpenAI HTTP, tokenizer, chat
template, KV router) and one worker shim per replica (``children.dynamo_shim``: registers
a token-in model, forwards each request to the replica's own endpoint, relays the replica's
vLLM-format KV events). Unix sockets (files) cross the namespace, byte relays
(``ops.bench.compare.children.sock_relay``) carry TCP over them:

    client -> 127.0.0.1:P (host relay) -> front.sock -> (namespace relay) -> frontend :8000
    shim -> rI.sock -> (host relay) -> replica I's direct endpoint
    shim's KvEventPublisher SUB -> ipc://eI.sock -> (host relay) -> replica I's ZMQ PUB

Inside the namespace nothing else listens, so its ports are fixed. ``cpu_s_by_process``
counts the frontend and the shims (Dynamo's processes: a real deployment runs the
worker-side handler inside each engine process); the relays are the namespace's price, not
Dynamo's, and are reported apart (``bridge_cpu_s_per_request``). Both relays add a hop
each way to every request: ``added_latency_s`` includes them.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from ops.bench.compare import peers
from ops.bench.harness.procs import Subprocess, free_port

FRONT_PORT = 8000  # inside the namespace: nothing else is there
ENDPOINT = "dyn://kvroute.backend.generate"
HERE = Path(__file__).parent / "children"  # run by path, in the peers' venv


def flags(block_size: int) -> peers.Flags:
    """Every flag that changes Dynamo's routing, at 1.6.1's defaults but set explicitly:
    deterministic choice (temperature 0), device overlap credited 1:1, prefill load scale 1,
    active blocks tracked, no output-block tracking, one router (no replica sync)."""
    return {"--router-mode": "kv", "--kv-cache-block-size": block_size,
            "--router-kv-events": None, "--router-temperature": 0.0,
            "--router-kv-overlap-score-credit": 1.0, "--router-prefill-load-scale": 1.0,
            "--router-track-active-blocks": None, "--no-router-track-output-blocks": None,
            "--router-assume-kv-reuse": None, "--no-router-replica-sync": None}


def dyn_env(kv_dir: Path, token: str) -> dict[str, str]:
    return {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv_dir),
            "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq",
            "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE_HOST": "127.0.0.1", "HF_HUB_OFFLINE": "1",
            "DYN_LOG": "warn", "KVROUTE_DIRECT_TOKEN": token}


class DynamoRun(Subprocess):
    """The namespace (frontend + shims + its relay) and the host relay, as one server."""

    def __init__(self, name: str, endpoints: list[str], events: list[str | None],
                 model_path: str, model_name: str, block_size: int, token: str,
                 engine: dict[str, int] | None = None) -> None:
        """``engine``: ``total_kv_blocks`` (in ``block_size`` blocks) and ``max_num_seqs`` of
        each replica, registered as Dynamo's vLLM worker does."""
        if any(e is None for e in events):
            raise RuntimeError("dynamo needs every replica's KV events (vllm_kv_events)")
        self.dir = Path(tempfile.mkdtemp(prefix="kvroute-dyn-"))
        self.flags = flags(block_size)
        self.n, self.endpoints = len(endpoints), endpoints
        self.pids: set[int] = set()
        py = str(peers.ensure_venv("dynamo") / "python")
        front = [py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                 "--http-port", str(FRONT_PORT), "--discovery-backend", "file",
                 "--request-plane", "tcp", "--event-plane", "zmq",
                 *peers._argv(self.flags)]
        self.frontend_cmd = front
        host_pairs = [f"tcp:127.0.0.1:{(port := free_port())}=unix:{self.dir / 'front.sock'}"]
        script = ["ip link set lo up || exit 1",
                  f"{py} {HERE / 'sock_relay.py'} unix:{self.dir / 'front.sock'}="
                  f"tcp:127.0.0.1:{FRONT_PORT} &"]
        for i, (http, ev) in enumerate(zip(endpoints, events, strict=True)):
            host_pairs += [f"unix:{self.dir / f'r{i}.sock'}=tcp:{http.split('://', 1)[1]}",
                           f"unix:{self.dir / f'e{i}.sock'}=tcp:{str(ev).split('://', 1)[1]}"]
            shim = [py, str(HERE / "dynamo_shim.py"), "--replica-socket",
                    str(self.dir / f"r{i}.sock"), "--events", f"ipc://{self.dir / f'e{i}.sock'}",
                    "--model-path", model_path, "--model-name", model_name,
                    "--block-size", str(block_size), "--endpoint", ENDPOINT,
                    "--served-file", str(self.dir / f"served{i}"),
                    *(a for k, v in (engine or {}).items()
                      for a in (f"--{k.replace('_', '-')}", str(v)))]
            script.append(f"{shlex.join(shim)} > {self.dir / f'shim{i}.log'} 2>&1 &")
        # Not exec'd: the frontend, the shims and the relay are siblings, metered apart.
        script += [f"{shlex.join(front)} &", "wait"]
        self.relay = Subprocess(f"{name}-relay", [sys.executable, str(HERE / "sock_relay.py"),
                                                  *host_pairs], "")
        (self.dir / "kv").mkdir()
        # As root a plain network namespace; otherwise a user namespace maps us to its root
        # (unprivileged user namespaces: untested here, where the benchmarks run as root).
        unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-r", "-n"]
        super().__init__(name, [*unshare, "--", "sh", "-c", "\n".join(script)],
                         f"http://127.0.0.1:{port}/v1/models",
                         env=dyn_env(self.dir / "kv", token), ready_timeout_s=120.0)

    def start(self) -> None:
        self.relay.start()
        super().start()

    async def __aenter__(self) -> DynamoRun:
        self.start()
        try:
            await self._wait_ready(self.ready_timeout_s)
            await self._wait_model(self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_model(self, timeout_s: float) -> None:
        """Until every shim is registered (their instances in the file store) and the model
        is listed: the frontend lists it after the first worker."""
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                async with s.get(self.ready_url) as r:
                    listed = r.status == 200 and bool((await r.json()).get("data"))
                if listed and self.workers_registered() >= self.n:
                    return
                assert self.proc is not None
                if self.proc.poll() is not None or len(self.processes()) < self.n + 1:
                    break  # the namespace, the frontend or a shim exited
                await asyncio.sleep(0.25)
        raise TimeoutError(f"dynamo: {self.workers_registered()} of {self.n} workers; "
                           f"{self.tail()} {self.shim_logs()}")

    def workers_registered(self) -> int:
        """Generate-endpoint instances in the file store (one per registered shim)."""
        kv = self.dir / "kv"
        return sum(1 for p in kv.rglob("*") if p.is_file() and "generate" in str(p)
                   and "instances" in str(p))

    async def router_metrics(self) -> dict[str, Any]:
        """From the frontend's Prometheus text: ``router_predicted_hit_rate``, its mean
        predicted KV hit rate at routing time (``..._kv_hit_rate`` histogram, sum / count;
        near the replicas' cached ratio when it routes on their events), and
        ``router_kv_events_applied``, the replicas' events its indexer applied, by
        ``type/status`` (``stored/parent_block_not_found``: a batch it dropped)."""
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{self.base_url}/metrics") as r:
                text = await r.text() if r.status == 200 else ""
        except aiohttp.ClientError:
            text = ""
        hit: dict[str, float] = {}
        applied: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#"):  # HELP / TYPE
                continue
            name, _, value = line.rpartition(" ")
            metric = name.split("{")[0]
            for part in ("sum", "count"):
                if metric.endswith(f"kv_hit_rate_{part}"):
                    hit[part] = hit.get(part, 0.0) + float(value)
            if metric.endswith("kv_cache_events_applied") and float(value):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', name))
                key = f"{labels.get('event_type')}/{labels.get('status')}"
                applied[key] = applied.get(key, 0.0) + float(value)
        return {"router_predicted_hit_rate": hit["sum"] / hit["count"]
                if hit.get("count") else None, "router_kv_events_applied": applied}

    def per_replica_requests(self) -> dict[str, int]:
        """Requests each shim forwarded, by replica endpoint (the frontend does not pass
        the replica's ``x-kvroute-replica`` header on)."""
        files = [self.dir / f"served{i}" for i in range(self.n)]
        return {e: int(f.read_text() or 0) if f.exists() else 0
                for e, f in zip(self.endpoints, files, strict=True)}

    def shim_logs(self) -> str:
        return " ".join(p.read_text(errors="replace")[-800:] for p in self.dir.glob("shim*.log"))

    def processes(self) -> list[psutil.Process]:
        """The frontend and the shims (children of the namespace's shell)."""
        return [p for p in self._children() if "sock_relay" not in " ".join(_cmdline(p))]

    def bridge_processes(self) -> list[psutil.Process]:
        """The relays on both sides of the namespace (and its idle shell)."""
        own = [p for p in self._children() if "sock_relay" in " ".join(_cmdline(p))]
        return own + self.relay.processes()

    def _children(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []

    def stop(self) -> None:
        """The namespace's whole process group (its shell's SIGTERM reaches every one),
        waited for, then the host relay; ``pids`` keeps who was stopped."""
        children = self._children()
        relay = {self.relay.proc.pid} if self.relay.proc else set()
        self.pids |= {p.pid for p in children} | relay
        super().stop()
        _, alive = psutil.wait_procs(children, timeout=10)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=5)
        self.relay.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
