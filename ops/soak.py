"""``kvroute soak``: a long mixed workload against a running kvroute, watching for leaks.

Load: ``--concurrency`` closed-loop httpx workers (seeded) send OpenAI chat and
completions and Anthropic messages, streamed and not, and count_tokens; half of them
continue shared-prefix conversations (``x-session-id``), the rest are fresh prompts.
A non-200, a transport error, an error event or a malformed reply is an error.

Every ``--interval`` it samples the Ray processes serving ``--url`` (the raylet above
the process listening on its port, everything under it, the cluster's daemons; or
``--pids``): summed RSS, open fds, per-process RSS; Redis ``used_memory`` and keys;
the interval's latency percentiles. Growth per hour is the least-squares slope after
``--fit-from`` of the run (default: the second half, past warm-up); a bound fails
when the slope minus two standard errors is over it, so noise cannot fail a short
run and a leak does. Bounds and their reasons: docs/reliability.md. Exit code 1 on
errors over ``--max-error-rate`` (default 0: any), growth over a bound, or no
request done. Ctrl-C stops early and still reports; ``--out`` writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

WORDS = ("cache", "prefix", "router", "replica", "token", "block", "stream", "model", "index",
         "agent", "turn", "reply", "shard", "queue", "batch", "decode", "prefill", "latency")
RAY_DAEMONS = ("gcs_server", "raylet", "ray/_private", "ray/dashboard", "ray/autoscaler", "ray::")


@dataclass(slots=True)
class Stats:
    """Request outcomes: totals, and latencies since the last sample."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)

    def record(self, kind: str, e2e: float, ttft: float | None, error: str | None) -> None:
        self.requests[kind] += 1
        if error is not None:
            self.errors[kind] += 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{kind}: {error}"[:300])
            return
        self.window.append(e2e)
        if ttft is not None:
            self.ttft.append(ttft)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}
Session = tuple[str, list[dict[str, str]]]  # (session id, turns so far)


class Workload:
    """The mixed requests. A conversation is used by one request at a time (taken, given back)."""

    def __init__(self, model: str, max_tokens: int, seed: int) -> None:
        self.model, self.max_tokens = model, max_tokens
        self.rng = random.Random(seed)
        self.system = "You are the soak-test assistant. " + _text(random.Random(seed), 300)
        self.idle: list[Session] = []

    def take(self) -> Session:
        if not self.idle or self.rng.random() < 0.1:
            return f"soak-{self.rng.getrandbits(48):x}", []
        return self.idle.pop(self.rng.randrange(len(self.idle)))

    def give_back(self, session: Session) -> None:
        if len(session[1]) < 12 and len(self.idle) < 64:  # at most 6 turns, 64 conversations
            self.idle.append(session)

    def request(self) -> tuple[str, dict[str, Any], Session | None]:
        """(kind, body, the conversation it continues, if any)."""
        kind = self.rng.choice(("chat", "chat", "completions", "messages", "messages",
                                "count_tokens"))
        stream = kind != "count_tokens" and self.rng.random() < 0.5
        session, body = None, {"model": self.model}
        if kind == "completions":
            body["prompt"] = (_text(self.rng, 40) if self.rng.random() < 0.5
                              else [self.rng.randrange(10, 1000) for _ in range(60)])
        else:
            if self.rng.random() < 0.5:  # shared prefix: system prompt + earlier turns
                session = self.take()
                session[1].append({"role": "user", "content": _text(self.rng, 20)})
            turns = session[1] if session else [{"role": "user",
                                                 "content": _text(self.rng, 60)}]
            if kind == "chat":
                body["messages"] = [{"role": "system", "content": self.system}, *turns]
            else:
                body.update(system=self.system, messages=list(turns))
        if kind != "count_tokens":
            body.update(max_tokens=self.max_tokens, stream=stream)
        if stream and kind != "messages":
            body["stream_options"] = {"include_usage": True}
        return kind + ("-stream" if stream else ""), body, session


def check_reply(kind: str, data: Any) -> str:
    """The reply's text; raises ValueError when it is not the expected shape."""
    if kind == "chat":
        return data["choices"][0]["message"]["content"] or ""
    if kind == "completions":
        return data["choices"][0]["text"]
    if kind == "messages":
        if data.get("type") != "message":
            raise ValueError(f"not a message: {str(data)[:200]}")
        return "".join(b.get("text", "") for b in data["content"])
    if not isinstance(data.get("input_tokens"), int):
        raise ValueError(f"no input_tokens: {data}")
    return ""


async def _read_stream(resp: httpx.Response, kind: str, start: float) -> tuple[str, float]:
    """(text, ttft) of an SSE reply; ValueError on an error event or a cut stream."""
    text, ttft, done = [], None, False
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        event = json.loads(payload)
        if "error" in event and event.get("type") in (None, "error"):
            raise ValueError(f"error event: {payload[:200]}")
        piece = (event.get("delta", {}).get("text", "") if kind.startswith("messages")
                 else "".join((c.get("delta") or {}).get("content") or c.get("text") or ""
                              for c in event.get("choices", [])))
        done = done or event.get("type") == "message_stop"
        if piece and ttft is None:
            ttft = time.monotonic() - start
        text.append(piece)
    if not done:
        raise ValueError("stream ended without [DONE] / message_stop")
    return "".join(text), ttft if ttft is not None else time.monotonic() - start


async def one_request(client: httpx.AsyncClient, work: Workload, stats: Stats) -> None:
    kind, body, session = work.request()
    start, ttft, error, text = time.monotonic(), None, None, ""
    headers = {"x-session-id": session[0]} if session else {}
    try:
        async with client.stream("POST", PATHS[kind.removesuffix("-stream")], json=body,
                                 headers=headers) as resp:
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            if kind.endswith("-stream"):
                text, ttft = await _read_stream(resp, kind, start)
            else:
                text = check_reply(kind, json.loads(await resp.aread()))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        error = f"{type(e).__name__}: {e}"
    stats.record(kind, time.monotonic() - start, ttft, error)
    if session is not None:
        if error is None:
            session[1].append({"role": "assistant", "content": text or "ok"})
        else:
            session[1].pop()  # keep the conversation well-formed (user, assistant, ...)
        work.give_back(session)


# --- sampling ---------------------------------------------------------------------------

def _psutil() -> Any:
    try:
        import psutil
    except ImportError as e:
        raise SystemExit("kvroute soak samples processes with psutil: pip install psutil") from e
    return psutil


def find_ray_processes(port: int) -> list[int]:
    """Pids of the Ray cluster listening on ``port``: its raylet, all below it, daemons."""
    ps = _psutil()
    listener = next((c.pid for c in ps.net_connections("tcp") if c.pid and c.laddr
                     and c.laddr.port == port and c.status == ps.CONN_LISTEN), None)
    if listener is None:
        return []
    raylet = next((p for p in [ps.Process(listener), *ps.Process(listener).parents()]
                   if p.name() == "raylet"), None)
    if raylet is None:
        return [listener]
    mine = {os.getpid(), *(p.pid for p in ps.Process().parents())}  # not the driver, not us
    daemons = [p.pid for p in (raylet.parent().children() if raylet.parent() else [])
               if p.pid not in mine and any(tag in " ".join(p.cmdline()) for tag in RAY_DAEMONS)]
    return [raylet.pid, *(p.pid for p in raylet.children(recursive=True)), *daemons]


def _label(cmdline: list[str]) -> str:
    """A stable name: ``ray::ServeReplica:app:dep`` (no task suffix), else the program."""
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split(".")[0].split(" ")[0]
    progs = [os.path.basename(a) for a in cmdline[:2] if not a.startswith("-")]
    return " ".join(progs)[:60]


def sample_processes(pids: list[int], port: int | None) -> dict[str, Any]:
    """Summed RSS (MB) and fds, and per-process RSS, of ``pids`` or of the cluster on ``port``."""
    ps = _psutil()
    found = pids or (find_ray_processes(port) if port else [])
    rss, fds, per = 0.0, 0, {}
    for pid in found:
        try:
            p = ps.Process(pid)
            mb = p.memory_info().rss / 2**20
            fds += p.num_fds()
            name = _label(p.cmdline()) or p.name()
        except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
            continue
        rss += mb
        per[f"{pid} {name}"] = round(mb, 2)
    return {"rss_mb": round(rss, 2), "fds": fds, "procs": len(per), "per_process": per}


async def sample_redis(client: Any) -> dict[str, Any]:
    if client is None:
        return {}
    try:
        used = (await client.info("memory"))["used_memory"]
        return {"redis_mb": round(used / 2**20, 3), "redis_keys": await client.dbsize()}
    except Exception as e:  # a Redis outage is reported, not fatal to the soak
        return {"redis_error": str(e)[:200]}


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


async def take_sample(t0: float, stats: Stats, opts: argparse.Namespace, redis: Any) -> dict:
    procs = sample_processes(opts.pid_list, opts.port)  # a few ms: no thread needed
    sample = {"t_s": round(time.monotonic() - t0, 2), **procs, **await sample_redis(redis),
              "requests": sum(stats.requests.values()), "errors": sum(stats.errors.values()),
              "p50_ms": _pct(stats.window, 50), "p99_ms": _pct(stats.window, 99),
              "ttft_p50_ms": _pct(stats.ttft, 50)}
    stats.window.clear()
    stats.ttft.clear()
    return sample


# --- analysis ---------------------------------------------------------------------------

def growth_per_hour(samples: list[dict], key: str, fit_from_s: float) -> dict[str, float] | None:
    """Least-squares slope of ``key`` per hour after ``fit_from_s``, with its standard error."""
    pts = [(s["t_s"], s[key]) for s in samples if s["t_s"] >= fit_from_s and s.get(key) is not None]
    if len(pts) < 3:
        return None
    t, y = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
    if np.ptp(t) <= 0:
        return None
    slope, icpt = np.polyfit(t, y, 1)
    resid = y - (slope * t + icpt)
    stderr = float(np.sqrt(resid @ resid / (len(t) - 2) / ((t - t.mean()) @ (t - t.mean()))))
    return {"per_h": round(float(slope) * 3600, 3), "stderr_per_h": round(stderr * 3600, 3),
            "first": pts[0][1], "last": pts[-1][1]}


def per_process_growth(samples: list[dict], fit_from_s: float, top: int = 5) -> dict[str, Any]:
    names = {n for s in samples for n in s.get("per_process", {})}
    out = {}
    for name in names:
        series = [{"t_s": s["t_s"], "mb": s["per_process"].get(name)} for s in samples]
        if fit := growth_per_hour(series, "mb", fit_from_s):
            out[name] = fit
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["per_h"])[:top])


BOUNDS = {"rss_mb": "max_rss_growth_mb_per_h", "fds": "max_fd_growth_per_h",
          "redis_mb": "max_redis_growth_mb_per_h"}


def verdicts(report: dict[str, Any], opts: argparse.Namespace) -> list[str]:
    """The reasons the run fails (empty: it passed)."""
    out = []
    if report["requests"] == 0:
        out.append("no request completed")
    if report["error_rate"] > opts.max_error_rate:
        out.append(f"error rate {report['error_rate']:.4%} > {opts.max_error_rate:.4%}")
    for key, bound_name in BOUNDS.items():
        bound, fit = getattr(opts, bound_name), report["growth"].get(key)
        if bound is not None and fit and fit["per_h"] - 2 * fit["stderr_per_h"] > bound:
            out.append(f"{key} grows {fit['per_h']:+.1f} ± {2 * fit['stderr_per_h']:.1f}/h "
                       f"> {bound}/h")
    return out


def summarize(samples: list[dict], stats: Stats, opts: argparse.Namespace, t: float) -> dict:
    fit_from = t * opts.fit_from
    total, errors = sum(stats.requests.values()), sum(stats.errors.values())
    report: dict[str, Any] = {
        "url": opts.url, "model": opts.model, "duration_s": round(t, 1),
        "concurrency": opts.concurrency, "interval_s": opts.interval, "fit_from_s": fit_from,
        "requests": total, "requests_per_s": round(total / t, 2) if t > 0 else 0.0,
        "errors": errors, "error_rate": errors / total if total else 0.0,
        "requests_by_kind": dict(stats.requests), "errors_by_kind": dict(stats.errors),
        "error_samples": stats.error_samples,
        "growth": {k: g for k in ("rss_mb", "fds", "redis_mb", "redis_keys", "p50_ms", "p99_ms")
                   if (g := growth_per_hour(samples, k, fit_from))},
        "process_growth_top": per_process_growth(samples, fit_from),
        "bounds": {b: getattr(opts, b) for b in (*BOUNDS.values(), "max_error_rate")},
        "samples": samples,
    }
    report["violations"] = verdicts(report, opts)
    report["passed"] = not report["violations"]
    return report


def print_summary(report: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"kvroute soak: {report['duration_s']} s at concurrency {report['concurrency']}, "
              f"{report['requests']} requests ({report['requests_per_s']}/s), "
              f"{report['errors']} errors ({report['error_rate']:.3%})\n")
    out.write(f"{'metric':<12}{'first':>12}{'last':>12}{'growth/h':>14}{'±2σ':>10}"
              f"{'bound/h':>10}\n")
    bound_of = {k: report["bounds"][v] for k, v in BOUNDS.items()}
    for key, fit in report["growth"].items():
        bound = bound_of.get(key)
        out.write(f"{key:<12}{fit['first']:>12.1f}{fit['last']:>12.1f}{fit['per_h']:>+14.1f}"
                  f"{2 * fit['stderr_per_h']:>10.1f}{'-' if bound is None else bound:>10}\n")
    for name, fit in report["process_growth_top"].items():
        out.write(f"  rss {name}: {fit['last']:.0f} MB, {fit['per_h']:+.1f} MB/h\n")
    if not report["growth"].get("rss_mb"):
        out.write("  no process sampled: run on the Ray head's host, or pass --pids\n")
    for line in report["error_samples"][:5]:
        out.write(f"  error {line}\n")
    out.write(("PASS" if report["passed"] else "FAIL: " + "; ".join(report["violations"]))
              + "\n")
    out.flush()


# --- the run ----------------------------------------------------------------------------

async def _worker(client: httpx.AsyncClient, work: Workload, stats: Stats,
                  stop: asyncio.Event) -> None:
    while not stop.is_set():
        await one_request(client, work, stats)


async def _sampler(t0: float, stats: Stats, opts: argparse.Namespace, redis: Any,
                   samples: list[dict], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append(await take_sample(t0, stats, opts, redis))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.interval)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {opts.api_key}", "x-api-key": opts.api_key} \
        if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.concurrency * 2)
    async with httpx.AsyncClient(base_url=opts.url, timeout=opts.timeout, limits=limits,
                                 headers=headers) as client:
        if not opts.model:
            opts.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        work, stats = Workload(opts.model, opts.max_tokens, opts.seed), Stats()
        samples: list[dict] = []
        stop = asyncio.Event()
        redis = None
        if opts.redis_url:
            import redis.asyncio as aioredis
            redis = aioredis.Redis.from_url(opts.redis_url, socket_timeout=2.0)
        loop, t0 = asyncio.get_running_loop(), time.monotonic()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: stop and report
        loop.call_later(opts.duration, stop.set)
        tasks = [asyncio.create_task(_worker(client, work, stats, stop))
                 for _ in range(opts.concurrency)]
        await _sampler(t0, stats, opts, redis, samples, stop)
        await asyncio.gather(*tasks)  # in-flight requests finish (bounded by --timeout)
        samples.append(await take_sample(t0, stats, opts, redis))
        if redis is not None:
            await redis.aclose()
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)
    return summarize(samples, stats, opts, time.monotonic() - t0)


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``3m``, ``24h`` or ``3d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:].lower())
    return float(text[:-1]) * scale if scale else float(text)


def cmd_soak(args: argparse.Namespace) -> int:
    args.pid_list = [int(p) for p in args.pids.split(",") if p] if args.pids else []
    url = httpx.URL(args.url)
    local = url.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
    args.port = (url.port or 80) if local and not args.pid_list else None
    report = asyncio.run(run(args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print_summary(report)
    return 0 if report["passed"] else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("soak", help="long mixed workload; fails on errors or leaks",
                              description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="a running kvroute")
    p.add_argument("--duration", type=duration, default=600.0, help="e.g. 180, 3m, 24h")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--model", help="model to call (default: the first of /v1/models)")
    p.add_argument("--max-tokens", type=int, default=16, help="output limit per request")
    p.add_argument("--redis-url", default=os.environ.get("KVROUTE_REDIS_URL"),
                   help="sample this Redis' INFO memory (default: KVROUTE_REDIS_URL)")
    p.add_argument("--pids", help="comma-separated pids to sample (default: the local Ray "
                   "cluster serving --url)")
    p.add_argument("--interval", type=duration, default=5.0, help="seconds between samples")
    p.add_argument("--fit-from", type=float, default=0.5,
                   help="fit growth after this fraction of the run (warm-up before)")
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--max-rss-growth-mb-per-h", type=float, default=64.0)
    p.add_argument("--max-fd-growth-per-h", type=float, default=20.0)
    p.add_argument("--max-redis-growth-mb-per-h", type=float, default=None)
    p.add_argument("--max-error-rate", type=float, default=0.0, help="0: any error fails")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", help="when the server has API keys")
    p.set_defaults(func=cmd_soak)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.soak")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["soak", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
