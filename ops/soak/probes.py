"""What the soak samples (the stack's processes, Redis) and how it fits growth."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

RAY_DAEMONS = ("gcs_server", "raylet", "ray/_private", "ray/dashboard", "ray/autoscaler", "ray::")


def _psutil() -> Any:
    try:
        import psutil
    except ImportError as e:
        raise SystemExit("kvroute soak samples processes with psutil: pip install psutil") from e
    return psutil


def find_ray_processes(port: int) -> list[int]:
    """Pids of the Ray cluster listening on ``port``: its raylet, all below it, daemons."""
    ps = _psutil()
    listener = _listener(ps, port)
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


def _listener(ps: Any, port: int) -> int | None:
    """The pid listening on ``port``; per process where the system-wide list needs root."""
    def listens(conns: list[Any]) -> bool:
        return any(c.laddr and c.laddr.port == port and c.status == ps.CONN_LISTEN
                   for c in conns)
    try:
        return next((c.pid for c in ps.net_connections("tcp") if c.pid and listens([c])), None)
    except ps.AccessDenied:  # macOS: only our own processes, one by one
        for proc in ps.process_iter():
            with contextlib.suppress(ps.Error):
                if listens(proc.net_connections("tcp")):
                    return proc.pid
    return None


def _label(cmdline: list[str]) -> str:
    """A stable name: ``ray::ServeReplica:app:dep`` (no task suffix), else the program."""
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split(".")[0].split(" ")[0]
    progs = [os.path.basename(a) for a in cmdline[:2] if not a.startswith("-")]
    return " ".join(progs)[:60]


def sample_processes(pids: list[int], port: int | None) -> dict[str, Any]:
    """Summed RSS (MB) and fds, and per-process RSS and fds, of the cluster on ``port`` (if
    given) and ``pids``."""
    ps = _psutil()
    found = [*(find_ray_processes(port) if port else []), *pids]
    rss, fds, per, per_fds = 0.0, 0, {}, {}
    for pid in dict.fromkeys(found):
        try:
            p = ps.Process(pid)
            mb, n, name = p.memory_info().rss / 2**20, p.num_fds(), _label(p.cmdline()) or p.name()
        except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
            continue
        rss, fds = rss + mb, fds + n
        per[f"{pid} {name}"] = round(mb, 2)
        per_fds[f"{pid} {name}"] = n
    return {"rss_mb": round(rss, 2), "fds": fds, "procs": len(per), "per_process": per,
            "per_process_fds": per_fds}


async def sample_redis(client: Any, namespace: str = "kvroute") -> dict[str, Any]:
    """Redis ``used_memory``, its key count and the prefix index's size (block holdings:
    the fields of its per-replica hashes, ``{ns}:r:*``)."""
    if client is None:
        return {}
    try:
        used = (await client.info("memory"))["used_memory"]
        blocks = 0
        async for key in client.scan_iter(match="{" + namespace + "}:r:*", count=500):
            blocks += await client.hlen(key)
        return {"redis_mb": round(used / 2**20, 3), "redis_keys": await client.dbsize(),
                "index_blocks": blocks}
    except Exception as e:  # a Redis outage is reported, not fatal to the soak
        return {"redis_error": str(e)[:200]}


def percentile_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None  # ms


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
