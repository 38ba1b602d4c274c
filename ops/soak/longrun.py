"""A long soak's analysis across faults: memory and fd slopes per process (a process killed
by a fault ends its series, its replacement starts one), their sum for the stack, each
extrapolated to 72 h against the 72-hour gate's bounds (docs/reliability.md), crashes
(processes that died without a fault killing them), and a PNG of the run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .probes import growth_per_hour

HOURS = 72.0
# The 72-hour gate's bounds (docs/reliability.md, "Commands"): RSS of all processes together
# in MB/h, open fds per hour, Redis used_memory in MB/h.
BOUNDS_72H = {"rss_mb": 32.0, "fds": 20.0, "redis_mb": 4.0}
# Processes whose death is a crash unless a fault killed them (Ray's short-lived task
# workers come and go on their own).
WATCHED = ("ServeReplica", "ServeController", "ProxyActor", "raylet", "gcs_server",
           "redis-server", "rotel")


def _series(samples: Sequence[dict], field: str, name: str) -> list[dict]:
    return [{"t_s": s["t_s"], "v": s[field][name]} for s in samples
            if name in s.get(field, {})]


def process_fits(samples: Sequence[dict], field: str, fit_from_s: float) -> dict[str, Any]:
    """Each process's slope per hour of ``field`` (``per_process`` RSS MB or
    ``per_process_fds``) over its samples after ``fit_from_s`` (all of a process born
    later, past its first sample), with its standard error and whether it was alive at
    the end."""
    names = {n for s in samples for n in s.get(field, {})}
    last = samples[-1].get(field, {}) if samples else {}
    out = {}
    for name in names:
        series = _series(samples, field, name)
        born = series[0]["t_s"]
        start = max(fit_from_s, born + 1e-6) if born > 0 else fit_from_s
        if fit := growth_per_hour(series, "v", start):
            out[name] = {**fit, "alive_at_end": name in last, "samples": len(series)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["per_h"]))


def stack_slope(fits: dict[str, Any]) -> dict[str, float] | None:
    """The stack's growth: the sum of the slopes of the processes alive at the end."""
    alive = [f for f in fits.values() if f["alive_at_end"]]
    if not alive:
        return None
    var = sum(f["stderr_per_h"] ** 2 for f in alive)
    return {"per_h": round(sum(f["per_h"] for f in alive), 3),
            "stderr_per_h": round(var ** 0.5, 3), "first": sum(f["first"] for f in alive),
            "last": sum(f["last"] for f in alive)}


def redis_slope(samples: Sequence[dict], fit_from_s: float, restarts: Sequence[float]
                ) -> dict[str, float] | None:
    """Redis memory's slope after its last restart (it comes back empty) and ``fit_from_s``."""
    start = max([fit_from_s, *(t + 1e-6 for t in restarts)])
    return growth_per_hour(list(samples), "redis_mb", start)


def extrapolate(growth: dict[str, dict[str, float] | None]) -> dict[str, Any]:
    """Each fitted slope over 72 h against its bound: growth in 72 h, what the bound allows."""
    out = {}
    for key, bound in BOUNDS_72H.items():
        fit = growth.get(key)
        if not fit:
            continue
        upper = fit["per_h"] - 2 * fit["stderr_per_h"]  # as the soak's verdict judges
        out[key] = {"per_h": fit["per_h"], "stderr_per_h": fit["stderr_per_h"],
                    "growth_72h": round(fit["per_h"] * HOURS, 1), "bound_per_h": bound,
                    "allowed_72h": bound * HOURS, "within": upper <= bound}
    return out


def crashes(samples: Sequence[dict], victims: set[int]) -> list[dict[str, Any]]:
    """Watched processes seen in one sample and gone in a later one, not killed by a fault."""
    gone: dict[int, dict[str, Any]] = {}
    seen: dict[int, str] = {}
    for s in samples:
        now = {int(k.split(" ", 1)[0]): k.split(" ", 1)[1] for k in s.get("per_process", {})}
        for pid, name in seen.items():
            if pid not in now and pid not in gone and pid not in victims \
                    and any(w in name for w in WATCHED):
                gone[pid] = {"pid": pid, "process": name, "gone_by_s": s["t_s"]}
        seen.update(now)
    return list(gone.values())


def plot(report: dict[str, Any], path: str) -> str | None:
    """A PNG of RSS per process, fds, Redis and TTFT over the run, faults marked; None when
    matplotlib is missing (the report says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    samples = report["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    names = sorted({n for s in samples for n in s.get("per_process", {})},
                   key=lambda n: -max(s.get("per_process", {}).get(n, 0) for s in samples))
    for name in names[:10]:
        pts = [(s["t_s"] / 60, s["per_process"][name]) for s in samples
               if name in s.get("per_process", {})]
        axes[0].plot(*zip(*pts, strict=True), label=name[:48])
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend(fontsize=6, loc="upper left")
    axes[1].plot(t, [s.get("fds", 0) for s in samples])
    axes[1].set_ylabel("open fds (all)")
    axes[2].plot(t, [s.get("redis_mb") for s in samples], label="Redis used_memory (MB)")
    axes[2].plot(t, [s.get("redis_keys") for s in samples], label="Redis keys")
    axes[2].plot(t, [s.get("index_blocks") for s in samples], label="index block entries")
    axes[2].legend(fontsize=7)
    for q in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"):
        axes[3].plot(t, [s.get(q) for s in samples], label=q)
    axes[3].set_ylabel("TTFT (ms)")
    axes[3].set_xlabel("minutes")
    axes[3].legend(fontsize=7)
    for ax in axes:
        for fault in report.get("faults", []):
            ax.axvline(fault["t_s"] / 60, color="red", alpha=0.3, linestyle="--")
    fig.suptitle(f"kvroute soak: {report['duration_s'] / 3600:.2f} h, faults dashed red")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
