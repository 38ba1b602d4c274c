"""Developer tool, not a user command: renders ops/grafana/kvroute-dashboard.json to a PNG.

It draws the PNG from real ``/metrics`` scrapes; the committed
``ops/grafana/kvroute-dashboard.png`` (docs/observability.md) comes from it.

No Grafana runs here, so this draws the dashboard's own panels at their own grid
positions, evaluating each panel's PromQL with a small evaluator for the subset the
dashboard uses (selectors with matchers, ``rate``, ``sum``/``count``/``avg``/``max``/``min``
``by``, ``histogram_quantile``, ``vector``, ``or``, arithmetic). Samples come from a
series of ``/metrics`` scrapes of a running kvroute; ``rate(x[5m])`` is evaluated
over the recorded scrapes ``--window`` seconds apart (a short run has no 5 minutes).

  python -m ops.dev.render_dashboard --url http://127.0.0.1:8000 --seconds 40 --every 2 \\
      --save /tmp/scrapes.json --out ops/grafana/kvroute-dashboard.png
  python -m ops.dev.render_dashboard --scrapes /tmp/scrapes.json --out dash.png

The PNG says in its title that it is this script's rendering, not a Grafana screenshot.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.commands.status import Samples, histogram_quantile, parse_metrics

DASHBOARD = Path(__file__).parents[1] / "grafana" / "kvroute-dashboard.json"
Key = tuple[tuple[str, str], ...]
Vector = dict[Key, float]
Value = float | Vector
Series = dict[Key, list[tuple[float, float]]]
_TOKEN = re.compile(
    r'\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?![\w:])|(?P<dur>\[\d+[smhd]\])'
    r'|(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>=~|!~|!=|[(){},=/*+-])|(?P<id>[A-Za-z_:][\w:]*))'
)
_AGGS = {"sum": sum, "count": len, "avg": lambda v: sum(v) / len(v), "max": max, "min": min}
_PREC = {"or": 1, "+": 2, "-": 2, "*": 3, "/": 3}


# ---------------------------------------------------------------- PromQL subset

def tokenize(expr: str) -> list[tuple[str, str]]:
    out, pos, expr = [], 0, expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot parse {expr[pos:]!r} in {expr!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class Parser:
    """Precedence climbing over the tokens; the AST is nested tuples."""

    def __init__(self, expr: str) -> None:
        self.toks, self.i = tokenize(expr), 0

    def peek(self) -> str:
        return self.toks[self.i][1] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise ValueError(f"expected {want!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple[Any, ...]:
        node = self.expr(0)
        if self.i != len(self.toks):
            raise ValueError(f"trailing {self.peek()!r}")
        return node

    def expr(self, min_prec: int) -> tuple[Any, ...]:
        left = self.unary()
        while self.peek() in _PREC and _PREC[self.peek()] > min_prec:
            op = self.take()[1]
            left = ("bin", op, left, self.expr(_PREC[op]))
        return left

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take()[1])
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return tuple(names)

    def unary(self) -> tuple[Any, ...]:
        kind, val = self.take()
        if kind == "num":
            return ("num", float(val))
        if val == "(":
            node = self.expr(0)
            self.take(")")
            return node
        if val in _AGGS:
            by = None
            if self.peek() == "by":
                self.take()
                by = self.labels()
            self.take("(")
            inner = self.expr(0)
            self.take(")")
            if by is None and self.peek() == "by":
                self.take()
                by = self.labels()
            return ("agg", val, by, inner)
        if self.peek() == "(":
            self.take("(")
            args = [self.expr(0)]
            while self.peek() == ",":
                self.take(",")
                args.append(self.expr(0))
            self.take(")")
            return ("call", val, args)
        return self.selector(val)

    def selector(self, name: str) -> tuple[Any, ...]:
        matchers = []
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label, op, raw = self.take()[1], self.take()[1], self.take()[1]
                matchers.append((label, op, json.loads(raw)))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        ranged = self.i < len(self.toks) and self.toks[self.i][0] == "dur"
        return ("sel", name, tuple(matchers), self.take()[1] if ranged else None)


@dataclass(frozen=True, slots=True)
class Scope:
    cur: Samples
    prev: Samples
    dt: float


def _matches(labels: dict[str, str], matchers: tuple[tuple[str, str, str], ...]) -> bool:
    for label, op, want in matchers:
        have = labels.get(label, "")
        ok = {"=": have == want, "!=": have != want}.get(op)
        if ok is None:
            ok = bool(re.fullmatch(want, have)) == (op == "=~")
        if not ok:
            return False
    return True


def _select(samples: Samples, name: str, matchers: Any) -> Vector:
    return {tuple(sorted(s.labels.items())): s.value for s in samples.get(name, [])
            if _matches(s.labels, matchers)}


def _binop(op: str, a: Value, b: Value) -> Value:
    fn: Callable[[float, float], float] = {
        "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "/": lambda x, y: x / y if y else math.nan}[op]
    if isinstance(a, float) and isinstance(b, float):
        return fn(a, b)
    if isinstance(a, float):
        return {k: fn(a, v) for k, v in b.items()}  # type: ignore[union-attr]
    if isinstance(b, float):
        return {k: fn(v, b) for k, v in a.items()}
    return {k: fn(v, b[k]) for k, v in a.items() if k in b}


def _aggregate(op: str, by: tuple[str, ...] | None, vec: Vector) -> Vector:
    groups: dict[Key, list[float]] = defaultdict(list)
    for key, v in vec.items():
        groups[tuple(kv for kv in key if by is not None and kv[0] in by)].append(v)
    return {k: float(_AGGS[op](vs)) for k, vs in groups.items()}


def _quantile(q: float, vec: Vector) -> Vector:
    groups: dict[Key, list[tuple[float, float]]] = defaultdict(list)
    for key, v in vec.items():
        le = dict(key).get("le")
        if le is not None:
            groups[tuple(kv for kv in key if kv[0] != "le")].append((float(le), v))
    out = {k: histogram_quantile(q, b) for k, b in groups.items()}
    return {k: v for k, v in out.items() if v is not None}


def evaluate(node: tuple[Any, ...], scope: Scope) -> Value:
    kind = node[0]
    if kind == "num":
        return float(node[1])
    if kind == "sel":
        _, name, matchers, rng = node
        cur = _select(scope.cur, name, matchers)
        if rng is None:
            return cur
        prev = _select(scope.prev, name, matchers)
        return {k: (v - prev.get(k, 0.0) if v >= prev.get(k, 0.0) else v) / scope.dt
                for k, v in cur.items()}
    if kind == "agg":
        inner = evaluate(node[3], scope)
        return _aggregate(node[1], node[2], inner if isinstance(inner, dict) else {(): inner})
    if kind == "bin":
        a, b = evaluate(node[2], scope), evaluate(node[3], scope)
        if node[1] == "or":
            assert isinstance(a, dict) and isinstance(b, dict), "or needs two vectors"
            return {**b, **a}
        return _binop(node[1], a, b)
    name, args = node[1], node[2]
    if name == "rate":
        return evaluate(args[0], scope)
    if name == "vector":
        return {(): float(evaluate(args[0], scope))}  # type: ignore[arg-type]
    if name == "histogram_quantile":
        vec = evaluate(args[1], scope)
        return _quantile(float(evaluate(args[0], scope)), vec)  # type: ignore[arg-type]
    raise ValueError(f"unsupported function {name!r}")


def series_over_time(expr: str, scrapes: list[tuple[float, Samples]], window: float,
                     variables: dict[str, str] | None = None) -> Series:
    """Evaluates ``expr`` at each scrape with a rate window of ``window`` seconds."""
    for var, value in (variables or {"model": ".*"}).items():
        expr = expr.replace(f"${var}", value)
    ast, out = Parser(expr).parse(), defaultdict(list)
    t0 = scrapes[0][0] if scrapes else 0.0
    for t, cur in scrapes:
        earlier = [(tp, s) for tp, s in scrapes if tp <= t - window]
        if not earlier:
            continue
        tp, prev = earlier[-1]
        value = evaluate(ast, Scope(cur, prev, t - tp))
        for key, v in (value.items() if isinstance(value, dict) else [((), value)]):
            if not math.isnan(v):
                out[key].append((t - t0, v))
    return dict(out)


# ---------------------------------------------------------------- scraping

def record(url: str, seconds: float, every: float) -> list[tuple[float, str]]:
    """Scrapes ``url``/metrics every ``every`` s for ``seconds`` s: ``[(unix time, text)]``."""
    import httpx

    out, end = [], time.monotonic() + seconds
    while True:
        out.append((time.time(), httpx.get(f"{url.rstrip('/')}/metrics", timeout=10).text))
        if time.monotonic() >= end:
            return out
        time.sleep(every)


def load_scrapes(path: Path) -> list[tuple[float, Samples]]:
    return [(float(t), parse_metrics(text)) for t, text in json.loads(path.read_text())]


# ---------------------------------------------------------------- drawing

_BG, _PANEL, _TEXT, _GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
_PALETTE = ["#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9",
            "#705DA0", "#37872D", "#FADE2A"]
_GRID_H = 0.3125  # inches per Grafana grid row (30 px at 80 px per column)


def _fmt(unit: str, v: float) -> str:
    if unit == "s":
        return f"{v * 1e3:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if unit == "percentunit":
        return f"{100 * v:.1f}%"
    suffix = {"reqps": " req/s", "ops": "/s"}.get(unit, "")
    return (f"{v / 1e3:.3g}k" if abs(v) >= 1e3 else f"{v:.3g}") + suffix


def _legend(fmt: str, key: Key, fallback: str) -> str:
    labels = dict(key)
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return text or fallback


def _panel_data(panel: dict[str, Any], scrapes: list[tuple[float, Samples]],
                window: float) -> list[tuple[str, list[tuple[float, float]], str]]:
    lines = []
    for i, target in enumerate(panel.get("targets", [])):
        series = series_over_time(target["expr"], scrapes, window)
        for key, points in sorted(series.items()):
            legend = _legend(target.get("legendFormat", ""), key, target["refId"])
            lines.append((legend, points, ("-", "--", ":")[i % 3]))
    return lines


def _draw_timeseries(ax: Any, panel: dict[str, Any], lines: list[Any]) -> None:
    from matplotlib.ticker import FuncFormatter

    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    for i, (label, pts, style) in enumerate(lines):  # later targets dashed, so overlaps show
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, lw=1.6, ls=style,
                color=_PALETTE[i % len(_PALETTE)])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt(unit, v)))
    top = max((p[1] for _, pts, _ in lines for p in pts), default=0.0)
    ax.set_ylim(0, top * 1.35 if top > 0 else 1)  # headroom for the legend
    ax.grid(color=_GRID, lw=0.6)
    ax.tick_params(colors=_TEXT, labelsize=7)
    ax.set_xlabel("seconds into the recording", color=_TEXT, fontsize=7)
    for side in ax.spines.values():
        side.set_color(_GRID)
    if lines:
        ax.legend(fontsize=6.5, loc="upper left", ncol=min(3, len(lines)), frameon=False,
                  labelcolor=_TEXT)


def _draw_stat(ax: Any, panel: dict[str, Any], lines: list[Any]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    ax.axis("off")
    last = [(label, pts[-1][1]) for label, pts, _ in lines if pts]
    for i, (label, v) in enumerate(last):
        y = 0.45 if len(last) == 1 else 0.8 - i * 0.6 / max(1, len(last) - 1)
        size = 22 if len(last) == 1 else 12
        text = _fmt(unit, v) if len(last) == 1 else f"{label}: {_fmt(unit, v)}"
        ax.text(0.5, y, text, ha="center", va="center", color=_PALETTE[0], fontsize=size,
                fontweight="bold", transform=ax.transAxes)


_W_IN, _TOP_IN = 20.0, 1.0  # figure width; header above the grid


def _rect(fig_h: float, pos: dict[str, int], pad: tuple[float, ...] = (0, 0, 0, 0)) -> list[float]:
    """Figure fraction of a grid position, shrunk by (left, bottom, right, top) inches."""
    left, bottom, right, top = pad
    x0 = pos["x"] / 24 * _W_IN + left
    y0 = _TOP_IN + pos["y"] * _GRID_H + top
    y1 = _TOP_IN + (pos["y"] + pos["h"]) * _GRID_H - bottom - 0.05
    w = pos["w"] / 24 * _W_IN - left - right - 0.05
    return [x0 / _W_IN, 1 - y1 / fig_h, w / _W_IN, (y1 - y0) / fig_h]


def _draw_panel(fig: Any, panel: dict[str, Any], lines: list[Any], fig_h: float) -> None:
    pos = panel["gridPos"]
    if panel["type"] == "row":
        fig.text(*_rect(fig_h, pos)[:2], panel["title"], color=_TEXT, fontsize=12,
                 fontweight="bold")
        return
    frame = fig.add_axes(_rect(fig_h, pos))
    frame.set_facecolor(_PANEL)
    frame.set_xticks([])
    frame.set_yticks([])
    for side in frame.spines.values():
        side.set_color(_GRID)
    frame.text(0.01, 0.97, panel["title"], color=_TEXT, fontsize=9, fontweight="bold",
               va="top", transform=frame.transAxes)
    is_ts = panel["type"] == "timeseries"
    ax = fig.add_axes(_rect(fig_h, pos, (0.65, 0.45, 0.15, 0.35) if is_ts else
                            (0.1, 0.1, 0.1, 0.35)))
    ax.set_facecolor(_PANEL)
    if not any(pts for _, pts, _ in lines):
        ax.axis("off")
        no_value = panel["fieldConfig"]["defaults"].get("noValue")
        ax.text(0.5, 0.5, no_value or "No data", ha="center", va="center", fontsize=10
                if no_value is None else 22, color="#8e8e8e" if no_value is None else _PALETTE[0],
                fontweight="normal" if no_value is None else "bold", transform=ax.transAxes)
    elif is_ts:
        _draw_timeseries(ax, panel, lines)
    else:
        _draw_stat(ax, panel, lines)


def render(dashboard: dict[str, Any], scrapes: list[tuple[float, Samples]], out: Path,
           window: float, note: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig_h = _TOP_IN + rows * _GRID_H + 0.2
    fig = plt.figure(figsize=(_W_IN, fig_h), facecolor=_BG)
    span = scrapes[-1][0] - scrapes[0][0] if scrapes else 0.0
    fig.text(0.005, 1 - 0.3 / fig_h, f"Grafana dashboard \u201c{dashboard['title']}\u201d "
             "(ops/grafana/kvroute-dashboard.json)", color=_TEXT, fontsize=15,
             fontweight="bold")
    fig.text(0.005, 1 - 0.65 / fig_h,
             "Rendered by kvroute's ops/dev/render_dashboard.py, NOT a Grafana screenshot: each "
             f"panel's PromQL evaluated on {len(scrapes)} real /metrics scrapes over "
             f"{span:.0f} s; rate(...[5m]) computed over {window:.0f} s. {note}",
             color="#8e8e8e", fontsize=9)
    for panel in panels:
        lines = [] if panel["type"] == "row" else _panel_data(panel, scrapes, window)
        _draw_panel(fig, panel, lines, fig_h)
    fig.savefig(out, dpi=100, facecolor=_BG)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dashboard", type=Path, default=DASHBOARD)
    p.add_argument("--scrapes", type=Path, help="JSON [[unix time, metrics text], ...]")
    p.add_argument("--url", help="record scrapes from this kvroute instead")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--save", type=Path, help="write the recorded scrapes here")
    p.add_argument("--window", type=float, default=10.0, help="rate window in seconds")
    p.add_argument("--note", default="", help="appended to the subtitle")
    p.add_argument("--out", type=Path, default=DASHBOARD.with_suffix(".png"))
    args = p.parse_args(argv)
    if args.url:
        raw = record(args.url, args.seconds, args.every)
        if args.save:
            args.save.write_text(json.dumps(raw))
        scrapes = [(t, parse_metrics(text)) for t, text in raw]
    elif args.scrapes:
        scrapes = load_scrapes(args.scrapes)
    else:
        p.error("give --scrapes FILE or --url URL")
    render(json.loads(args.dashboard.read_text()), scrapes, args.out, args.window, args.note)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
