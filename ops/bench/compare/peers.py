"""Peer routers for ``kvroute bench compare``: their venvs and launch commands.

Each peer gets a venv of its own, installed on first use by pip (by package name, pinned
version) under ``~/.cache/kvroute/peers/<package>-<version>`` (``KVROUTE_PEER_CACHE``
overrides the folder), so a rerun starts at once. Installs take a file lock: two
benchmarks starting at once install once.

Every flag that changes routing is set explicitly (a peer's defaults change between
releases) and returned beside the command, for the JSON. Both peers bind 0.0.0.0 by
default (their HTTP and Prometheus ports): every address is given as 127.0.0.1.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.bench.harness.procs import Ready, Subprocess, free_port

VERSIONS = {"smg": "1.13.0", "vllm-router": "0.1.17", "dynamo": "1.6.1"}
FlagValue = str | int | float
Flags = dict[str, FlagValue | None]  # --flag -> value; None: a switch without a value

# smg cache_aware and vllm-router cache_aware: the approximate text tree's thresholds, at
# their documented defaults (the same values as sglang-router 0.3.2's run).
CACHE_AWARE: Flags = {"--cache-threshold": 0.3, "--balance-abs-threshold": 64,
                      "--balance-rel-threshold": 1.5}
# smg: warm-up diversion (on by default: for 60 s after a worker becomes routable every 8th
# request goes to it) is for workers that join a running fleet; the benchmark's replicas are
# all there from the start, so it is off. Overload protection and retries: smg's defaults.
SMG_FLAGS: Flags = {**CACHE_AWARE, "--worker-warmup-secs": 0,
                    "--worker-overload-waiting-requests": 8,
                    "--worker-overload-token-usage": 0.8, "--retry-max-retries": 5}
# vllm-router kv_aware: deterministic choice (temperature 0: the lowest cost), no session
# affinity (not set: off), KV-tier credits at their defaults (the sim has one tier).
KV_AWARE: Flags = {"--router-temperature": 0.0, "--kv-penalty-host": 0.8,
                   "--kv-penalty-external": 0.6, "--kv-penalty-disk": 0.3}


def peer_cache() -> Path:
    return Path(os.environ.get("KVROUTE_PEER_CACHE", "~/.cache/kvroute/peers")).expanduser()


def venv_dir(package: str) -> Path:
    return peer_cache() / f"{package}-{VERSIONS[package]}"


def ensure_venv(package: str) -> Path:
    """The peer's venv (its ``bin``), installed first if missing; returns its bin dir."""
    return install_venv(venv_dir(package), package, install_cmds(package))


def install_venv(venv: Path, name: str, cmds: list[list[str]]) -> Path:
    """``venv`` made by ``cmds`` (after ``python -m venv``) unless its marker says it is;
    under a file lock beside it, its log and the install's seconds in the marker."""
    marker, cache = venv / ".kvroute-installed", venv.parent
    if marker.exists():
        return venv / "bin"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            start = time.monotonic()
            base = getattr(sys, "_base_executable", sys.executable)
            log = cache / f"{name}.install.log"
            with log.open("wb") as out:
                for cmd in [[base, "-m", "venv", "--clear", str(venv)], *cmds]:
                    if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                        raise RuntimeError(f"installing {name} failed; see {log}")
            marker.write_text(f"{time.monotonic() - start:.1f}\n")  # install seconds
    return venv / "bin"


# ai-dynamo 1.6.1 requires ``aisimulate``, which no index serves: its runtime wheel and the
# runtime's own dependencies are installed, then the ai-dynamo wheel without dependencies
# (the frontend, the KV router and the worker API do not import aisimulate).
DYNAMO_DEPS = ("aiohttp", "certifi", "kubernetes", "msgspec", "prometheus-client", "pyzmq",
               "redis", "tqdm", "transformers", "typing-extensions", "zstandard")


def install_cmds(package: str) -> list[list[str]]:
    """pip commands that install ``package`` into its (just created) venv."""
    venv, version = venv_dir(package), VERSIONS[package]
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    if package != "dynamo":
        return [[*pip, f"{package}=={version}"]]
    wheels = str(venv / "wheels")
    return [[str(venv / "bin" / "pip"), "download", "-q", "--no-deps", "-d", wheels,
             f"ai-dynamo=={version}", f"ai-dynamo-runtime=={version}"],
            [*pip, "--find-links", wheels, f"ai-dynamo-runtime=={version}", *DYNAMO_DEPS],
            [*pip, "--no-deps", "--find-links", wheels, f"ai-dynamo=={version}"]]


def install_seconds(package: str) -> float | None:
    """How long the cached install took (None: not installed)."""
    marker = venv_dir(package) / ".kvroute-installed"
    return float(marker.read_text()) if marker.exists() else None


@dataclass(frozen=True, slots=True)
class RouterLaunch:
    """One peer router run: its command, the flags that change routing, where it listens."""

    name: str
    cmd: list[str]
    flags: Flags
    port: int
    workers: int | None = None  # smg: not ready before ``GET /workers`` has this many

    def process(self) -> Subprocess:
        base = f"http://127.0.0.1:{self.port}"
        when = None if self.workers is None else (f"{base}/workers",
                                                  healthy_workers(self.workers))
        return Subprocess(self.name, self.cmd, f"{base}/v1/models", ready_when=when)


def healthy_workers(n: int) -> Ready:
    """A test of ``GET /workers`` (sglang-router, smg): these answer ``/v1/models`` once
    the first worker is registered, each worker being a job of their own; a run that
    starts then sends its first requests to that worker alone. (vllm-router serves only
    once every worker is healthy.)"""
    def test(body: Any) -> bool:
        workers = body.get("workers", []) if isinstance(body, dict) else []
        return sum(1 for w in workers if isinstance(w, dict) and w.get("is_healthy")) >= n
    return test


def _argv(flags: Flags) -> list[str]:
    out: list[str] = []
    for k, v in flags.items():
        out += [k] if v is None else [k, str(v)]
    return out


def smg(name: str, endpoints: list[str], model_path: str, policy: str) -> RouterLaunch:
    """smg 1.13 (SGLang's router): ``cache_aware`` over HTTP workers is its text tree."""
    port = free_port()
    flags: Flags = {"--policy": policy, **(SMG_FLAGS if policy == "cache_aware" else {})}
    cmd = [str(ensure_venv("smg") / "smg"), "launch", "--host", "127.0.0.1",
           "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--worker-urls", *endpoints,
           "--model-path", model_path, "--log-level", "warn", *_argv(flags)]
    return RouterLaunch(name, cmd, flags, port, len(endpoints))


def vllm_router(name: str, endpoints: list[str], events: list[str | None], model_path: str,
                policy: str, block_size: int) -> RouterLaunch:
    """vllm-router 0.1.17: ``kv_aware`` indexes the replicas' vLLM-format KV events
    (``workers.engines.sim.vllm_wire``); ``cache_aware`` is its text tree."""
    port = free_port()
    flags: Flags
    if policy == "kv_aware":
        if any(e is None for e in events):
            raise RuntimeError("kv_aware needs every replica's KV events (vllm_kv_events)")
        flags = {"--policy": policy, **KV_AWARE, "--kv-event-block-size": block_size}
        sources = [a for w, e in zip(endpoints, events, strict=True)
                   for a in ("--kv-event-source", f"{w}={e}")]
        extra = [*sources, "--kv-event-model", model_path]
    else:
        flags, extra = {"--policy": policy, **CACHE_AWARE}, []
    cmd = [str(ensure_venv("vllm-router") / "vllm-router"), "--host", "127.0.0.1",
           "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--worker-urls", *endpoints,
           "--log-level", "warning", *_argv(flags), *extra]
    return RouterLaunch(name, cmd, flags, port)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options: every peer of ``VERSIONS`` is installed."""


def run(args: argparse.Namespace) -> int:
    """Install every peer's venv (``make peers``) and print how long each install took."""
    for package in VERSIONS:
        start = time.monotonic()
        ensure_venv(package)
        print(f"{package} {VERSIONS[package]}: {venv_dir(package)} "
              f"(install {install_seconds(package)} s; this call {time.monotonic() - start:.1f} s)")
    return 0
