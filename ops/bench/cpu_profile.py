"""Where kvroute's router CPU per request goes (the peer comparison's CPU goal): the compare stack,
idle and under ``bench compare``'s kvroute run, with py-spy on Serve's proxy and the router.

    kvroute bench cpu-profile --duration 120 --idle 60 --out /tmp/prof

Deploys what ``bench compare`` deploys (the sim replicas, kvroute's router, Serve's proxy),
then, for each of the processes ``cpu_s_per_request`` counts (``lineup.kvroute_processes``):

1. idle: CPU seconds per thread over ``--idle`` s without traffic (the fixed cost);
2. run: the compare's kvroute run (agent workload) with ``py-spy record`` on each process
   (``--native``, blocking, at ``--rate`` Hz by default; ``--nonblocking`` otherwise) and
   CPU seconds per thread from psutil.

Threads that Ray's and gRPC's C++ cores name (``event_engine``, ``worker.io``, ...) are
invisible to py-spy: their CPU is reported by thread name. The Python threads' CPU (psutil)
is split in proportion to py-spy's busy samples (stacks of waiting threads, which
``--native`` also records, are dropped: ``idle``) into ``CATEGORIES``: the first frame
from the leaf that matches a rule decides. ``--classify --out DIR`` re-reads a run's stacks.
Figures and their reading: docs/benchmarks.md, "Where the time goes".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

# category -> substrings of a frame; app rules first (in this order), checked from the leaf up
_APP: dict[str, tuple[str, ...]] = {
    "garbage collection": ("gc_collect_main",),
    "tracing (OTel)": ("opentelemetry",),
    "metrics": ("prometheus_client", "ray/util/metrics", "/router/metrics", "ray::stats",
                "RouterMetricsManager", "queue_len_gauge"),
    "router telemetry middleware (spans, request metrics)": ("/router/telemetry",),
    "logging": ("logging/__init__", "serve/_private/logging"),
    "Ray/Serve background": ("serve/_private/metrics_utils", "long_poll", "autoscal",
                             "check_health", "PeriodicalRunner", "check_signals"),
    "prompt side": ("/router/tokeniz", "/router/prompt_cache", "chat_template", "jinja2",
                    "tokenizers", "transformers", "/cache_service/", "/router/client_specials",
                    "redis", "/router/core", "/router/request_router", "/router/index",
                    "/router/pipeline", "/router/normalize", "/router/openai_schema",
                    "/router/selection", "/router/decision", "pydantic"),
    "per-token streaming": ("/router/loopback_stream", "tool_parsers", "reasoning_parsers",
                            "/router/text_stream", "/router/generation", "/router/openai_api",
                            "/router/openai_routes", "/router/http_util", "/router/dispatch",
                            "/workers/protocol", "/router/tool_calls"),
    "router, other": ("/router/",),
    "HTTP/ASGI (uvicorn, starlette)": ("uvicorn", "starlette", "fastapi", "h11", "httptools",
                                       "llhttp", "UVStream", "serve/_private/proxy.py",
                                       "proxy_headers"),
    "Serve hops (gRPC, handle, replica)": ("grpc", "serve/", "_message.abi3", "cloudpickle"),
    "Ray core": ("_raylet", "ray/"),
}
APP_RULES = tuple((needle, cat) for cat, needles in _APP.items() for needle in needles)
LOOP_RULES: tuple[tuple[str, str], ...] = (
    ("asyncio", "event loop"), ("uvloop", "event loop"), ("loop.c", "event loop"),
    ("selectors", "event loop"), ("uv_run", "event loop"),
)
CATEGORIES = tuple(dict.fromkeys(c for _, c in APP_RULES + LOOP_RULES)) + (
    "native, no Python frame", "other")
# a thread blocked, not running: py-spy --native counts it as active
_WAITS = ("cond_wait", "cond_timedwait", "acquire_lock", "SimpleQueue_get",
          "condition_variable::wait", "sem_wait", "sem_timedwait", "nanosleep")


def idle(frames: list[str]) -> bool:
    """Whether a stack (root first) is a thread waiting: in epoll, or on a lock or
    condition (the leaf an unnamed libc address or a wait)."""
    leaf = frames[-1]
    if leaf.startswith(("epoll_wait", "epoll_pwait", "poll ", "select ")):
        return True
    return any(w in f for f in frames[-4:] for w in _WAITS) and (
        leaf.startswith("0x") or any(w in leaf for w in _WAITS))


def category(stack: str) -> str:
    """The category of one py-spy raw stack (frames root first, ``;``-separated)."""
    frames = stack.split(";")[::-1]
    for rules in (APP_RULES, LOOP_RULES):
        for frame in frames:
            for needle, cat in rules:
                if needle in frame:
                    return cat
    return "other" if any(".py:" in f for f in frames) else "native, no Python frame"


def classify(raw: str) -> Counter[str]:
    """Samples per category of a py-spy ``--format raw`` file's text."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and not idle(stack.split(";")):
            out[category(stack)] += int(count)
    return out


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """CPU seconds per thread name (``/proc/<pid>/task/<tid>/comm``); Python's threads
    share the process's name, Ray's C++ threads carry their own."""
    out: dict[str, float] = {}
    for t in proc.threads():
        try:
            name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(v - a.get(k, 0.0), 3) for k, v in b.items() if v - a.get(k, 0.0) > 0}


def _label(proc: psutil.Process) -> str:
    return "proxy" if "ProxyActor" in " ".join(proc.cmdline()) else f"router-{proc.pid}"


def _pyspy(pid: int, out: Path, rate: int, native: bool) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    mode = ["--native"] if native else ["--nonblocking"]
    cmd = [exe, "record", "-p", str(pid), "-r", str(rate), "--format", "raw", "-o", str(out),
           *mode]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)


def python_thread(name: str) -> bool:
    """Python's threads keep the ``ray::...`` title Ray gave the process when they started;
    Ray's and gRPC's C++ threads name themselves (``worker.io``, ``event_engine``, ...)."""
    return name.startswith("ray::")


def _report(out_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    """Python-thread CPU of each process split by its py-spy samples, in ms/request."""
    n = max(1, run["requests"])
    by_process: dict[str, Any] = {}
    for label, threads in run["threads_run_s"].items():
        py_s = sum(s for t, s in threads.items() if python_thread(t))
        raw = out_dir / f"{label}.txt"
        samples = classify(raw.read_text()) if raw.exists() else Counter()
        total = sum(samples.values()) or 1
        cats = {c: round(1000 * py_s * k / total / n, 2) for c, k in samples.most_common()}
        native = {t: round(1000 * s / n, 2) for t, s in sorted(threads.items(),
                                                              key=lambda x: -x[1])
                  if not python_thread(t)}
        idle = run["threads_idle_s"][label]
        by_process[label] = {
            "cpu_ms_per_request": round(1000 * sum(threads.values()) / n, 2),
            "python_threads_ms_per_request": round(1000 * py_s / n, 2),
            "system_ms_per_request": round(1000 * run.get("system_s_run", {}).get(label, 0) / n,
                                           2),
            "busy_samples": dict(samples.most_common()),
            "python_threads_by_category_ms_per_request": cats,
            "other_threads_ms_per_request": native,
            "idle_cpu_s_per_s": round(sum(idle.values()) / run["idle_s"], 4),
            "idle_ms_per_request_at_run_rate": round(
                1000 * sum(idle.values()) / run["idle_s"] * run["window_s"] / n, 2),
        }
    return by_process


async def _measure(url: str, spec: Any, args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.compare import bench as compare
    from ops.bench.harness import lineup

    procs = lineup.kvroute_processes()
    labels = {_label(p): p for p in procs}
    headers = await compare.direct_headers(url)
    await asyncio.sleep(args.settle)
    before = {k: thread_cpu(p) for k, p in labels.items()}
    await asyncio.sleep(args.idle)
    idle = {k: delta(before[k], thread_cpu(p)) for k, p in labels.items()}
    spies = {k: _pyspy(p.pid, args.out / f"{k}.txt", args.rate, not args.nonblocking)
             for k, p in labels.items()}
    start = {k: thread_cpu(p) for k, p in labels.items()}
    kernel = {k: p.cpu_times().system for k, p in labels.items()}
    records, bench = await compare.run_one("kvroute", url, spec, False, headers)
    threads = {k: delta(start[k], thread_cpu(p)) for k, p in labels.items()}
    kernel = {k: round(p.cpu_times().system - kernel[k], 3) for k, p in labels.items()}
    for spy in spies.values():
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for spy in spies.values():
        spy.wait(60)
    ok = [r for r in records if r.ok]
    return {
        "idle_s": args.idle, "threads_idle_s": idle, "threads_run_s": threads,
        "system_s_run": kernel,  # of the run's CPU, in the kernel (syscalls, wakeups)
        "requests": len(records), "errors": len(records) - len(ok),
        "window_s": bench["params"]["window_s"],
        "completion_tokens_per_request": sum(r.completion_tokens for r in ok) / max(1, len(ok)),
        "content_chunks_per_request": sum(r.content_chunks for r in ok) / max(1, len(ok)),
        "prompt_tokens_per_request": sum(r.prompt_tokens for r in ok) / max(1, len(ok)),
        "ttft_p50_s": bench["ttft_s"]["p50"], "cached_token_ratio": bench["cached_token_ratio"],
    }


def profile(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.compare import bench as compare
    from ops.bench.harness.client import LoadSpec
    from ops.bench.harness.procs import free_port
    from ops.bench.harness.stack import stack
    from ops.models.tiny_model import ensure_model

    spec = compare.CompareSpec(replicas=args.replicas, routers=("kvroute",),
                               load=LoadSpec(duration_s=args.duration, concurrency=20),
                               ingress=args.ingress)
    cfg = compare.build_config(spec, str(ensure_model()), free_port())
    with stack(cfg, num_cpus=max(4, args.replicas + 2)) as url:
        return asyncio.run(_measure(url, spec, args))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory for stacks and JSON")
    p.add_argument("--duration", type=float, default=120.0, help="the run's seconds")
    p.add_argument("--idle", type=float, default=60.0, help="idle seconds measured first")
    p.add_argument("--settle", type=float, default=15.0, help="seconds after deploying")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--ingress", choices=("auto", "proxy", "direct"), default="auto",
                   help="kvroute's server.ingress (direct: no Serve proxy in the path)")
    p.add_argument("--rate", type=int, default=20, help="py-spy samples per second")
    p.add_argument("--nonblocking", action="store_true", help="py-spy without --native")
    p.add_argument("--classify", action="store_true", help="re-read DIR's result.json")


def run(args: argparse.Namespace) -> int:
    from ops.bench.harness.args import command_line

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "result.json"
    if args.classify:
        result = json.loads(path.read_text())
    else:
        t0, load = time.time(), os.getloadavg()
        result = profile(args)
        result.update(command=command_line("cpu-profile"),
                      started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
                      loadavg_start=load, loadavg_end=os.getloadavg())
    result["by_process"] = _report(args.out, result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["by_process"], indent=2))
    return 0
