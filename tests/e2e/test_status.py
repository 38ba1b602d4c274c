"""``kvroute status`` and the ops files (collector, Prometheus, Grafana dashboard).

Unit tests run on a /metrics text recorded from a 2-replica sim-engine stack (trimmed);
the slow test deploys a real stack and reads it over HTTP.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ops.commands import status
from ops.dev.render_dashboard import Parser, series_over_time
from tests.conftest import free_port
from tests.stacks import deployed, sim_model, stack_config

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "ops" / "grafana" / "kvroute-dashboard.json"
HEALTH = {"status": "ok", "replicas": {"sim-tiny": 2}}
RECORDED = """\
# HELP kvroute_cached_tokens Prompt tokens the engine served from cache
# TYPE kvroute_cached_tokens counter
kvroute_cached_tokens_total{model="sim-tiny"} 541632.0
# HELP kvroute_index_lookup_seconds Prefix index lookup
# TYPE kvroute_index_lookup_seconds histogram
kvroute_index_lookup_seconds_bucket{le="+Inf"} 1009.0
kvroute_index_lookup_seconds_bucket{le="0.0001"} 34.0
kvroute_index_lookup_seconds_bucket{le="0.00025"} 866.0
kvroute_index_lookup_seconds_bucket{le="0.0005"} 935.0
kvroute_index_lookup_seconds_bucket{le="0.001"} 965.0
kvroute_index_lookup_seconds_bucket{le="0.0025"} 992.0
kvroute_index_lookup_seconds_bucket{le="0.005"} 1003.0
kvroute_index_lookup_seconds_bucket{le="0.01"} 1007.0
kvroute_index_lookup_seconds_bucket{le="0.025"} 1009.0
kvroute_index_lookup_seconds_bucket{le="0.05"} 1009.0
kvroute_index_lookup_seconds_bucket{le="0.1"} 1009.0
kvroute_index_lookup_seconds_bucket{le="0.25"} 1009.0
kvroute_index_lookup_seconds_count 1009.0
kvroute_index_lookup_seconds_sum 0.29800414900046235
# HELP kvroute_predicted_cached_tokens Prompt tokens the router predicted cached
# TYPE kvroute_predicted_cached_tokens counter
kvroute_predicted_cached_tokens_total{model="sim-tiny"} 541632.0
# HELP kvroute_prompt_tokens Prompt tokens
# TYPE kvroute_prompt_tokens counter
kvroute_prompt_tokens_total{model="sim-tiny"} 668848.0
# HELP kvroute_replica_ongoing_requests Requests in flight per replica
# TYPE kvroute_replica_ongoing_requests gauge
kvroute_replica_ongoing_requests{model="sim-tiny",replica="a8cozaje"} 1.0
kvroute_replica_ongoing_requests{model="sim-tiny",replica="d0xsxk52"} 0.0
# HELP kvroute_replica_queued_prefill_tokens Prefill tokens queued per replica
# TYPE kvroute_replica_queued_prefill_tokens gauge
kvroute_replica_queued_prefill_tokens{model="sim-tiny",replica="a8cozaje"} 0.0
kvroute_replica_queued_prefill_tokens{model="sim-tiny",replica="d0xsxk52"} 0.0
# HELP kvroute_requests Routed requests by outcome
# TYPE kvroute_requests counter
kvroute_requests_total{model="sim-tiny",status="ok"} 1009.0
# HELP kvroute_retries Dispatches retried on another replica
# TYPE kvroute_retries counter
# HELP kvroute_ttft_seconds Time to first token
# TYPE kvroute_ttft_seconds histogram
kvroute_ttft_seconds_bucket{le="+Inf",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="0.005",model="sim-tiny"} 0.0
kvroute_ttft_seconds_bucket{le="0.01",model="sim-tiny"} 0.0
kvroute_ttft_seconds_bucket{le="0.025",model="sim-tiny"} 0.0
kvroute_ttft_seconds_bucket{le="0.05",model="sim-tiny"} 160.0
kvroute_ttft_seconds_bucket{le="0.1",model="sim-tiny"} 866.0
kvroute_ttft_seconds_bucket{le="0.25",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="0.5",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="1.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="10.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="120.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="2.5",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="30.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="5.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_bucket{le="60.0",model="sim-tiny"} 1009.0
kvroute_ttft_seconds_count{model="sim-tiny"} 1009.0
kvroute_ttft_seconds_sum{model="sim-tiny"} 75.48430682599019
"""


# ---------------------------------------------------------------- parsing and aggregation

def test_summarize_recorded_metrics() -> None:
    data = status.summarize(HEALTH, RECORDED)
    assert data["status"] == "ok" and list(data["models"]) == ["sim-tiny"]
    m = data["models"]["sim-tiny"]
    assert m["ready_replicas"] == 2
    assert m["requests"] == {"ok": 1009.0} and m["requests_total"] == 1009.0
    assert m["retries"] == 0.0
    assert m["cached_ratio"] == pytest.approx(541632 / 668848)
    assert m["predicted_cached_ratio"] == pytest.approx(541632 / 668848)
    assert m["prediction_accuracy"] == pytest.approx(1.0)
    assert m["replicas"] == {
        "a8cozaje": {"ongoing_requests": 1.0, "queued_prefill_tokens": 0.0},
        "d0xsxk52": {"ongoing_requests": 0.0, "queued_prefill_tokens": 0.0},
    }
    # Prometheus' interpolation: p50 rank 504.5 falls in (0.05, 0.1] holding 160..866.
    assert m["ttft_p50_s"] == pytest.approx(0.05 + 0.05 * (504.5 - 160) / 706)
    assert m["ttft_p99_s"] == pytest.approx(0.1 + 0.15 * (0.99 * 1009 - 866) / 143)
    ix = data["index"]
    assert ix["lookups"] == 1009.0 and ix["errors"] == {}
    assert 0.0001 < ix["lookup_p50_s"] < 0.00025
    assert ix["entries"] is None and status.INDEX_ENTRIES_METRIC in ix["entries_note"]


def test_histogram_quantile_edges() -> None:
    assert status.histogram_quantile(0.5, []) is None
    assert status.histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert status.histogram_quantile(0.5, [(0.1, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.05)
    # Everything above the last finite bound: Prometheus answers that bound.
    assert status.histogram_quantile(0.9, [(0.1, 0.0), (1.0, 0.0), (float("inf"), 5.0)]) == 1.0


def test_unready_model_and_errors_and_index_size() -> None:
    text = RECORDED + (
        "# TYPE kvroute_index_errors counter\n"
        'kvroute_index_errors_total{op="lookup"} 3.0\n'
        'kvroute_index_errors_total{op="record_routed"} 1.0\n'
        f"# TYPE {status.INDEX_ENTRIES_METRIC} gauge\n{status.INDEX_ENTRIES_METRIC} 42.0\n"
    )
    health = {"status": "unavailable", "replicas": {"sim-tiny": 2, "idle": 0}}
    data = status.summarize(health, text)
    assert data["status"] == "unavailable"
    idle = data["models"]["idle"]
    assert idle["ready_replicas"] == 0 and idle["requests_total"] == 0
    assert idle["cached_ratio"] is None and idle["ttft_p50_s"] is None
    assert data["index"]["errors"] == {"lookup": 3.0, "record_routed": 1.0}
    assert data["index"]["entries"] == 42.0 and data["index"]["entries_note"] is None


# ---------------------------------------------------------------- the CLI over HTTP

@pytest.fixture()
def fake_kvroute() -> Iterator[str]:
    """A loopback HTTP server answering /health and /metrics with the recording."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pages = {"/health": (json.dumps(HEALTH), "application/json"),
                     "/metrics": (RECORDED, "text/plain")}
            body, ctype = pages.get(self.path, ("not found", "text/plain"))
            self.send_response(200 if self.path in pages else 404)
            self.send_header("content-type", ctype)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvroute")
    status.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_table_and_json(fake_kvroute: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["status", "--url", fake_kvroute]) == 0
    out = capsys.readouterr().out
    for text in ("sim-tiny", "a8cozaje", "81.0%", "1,009 ok", "not exported"):
        assert text in out, text
    assert _run(["status", "--url", fake_kvroute, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["url"] == fake_kvroute and data["models"]["sim-tiny"]["ready_replicas"] == 2


def test_cli_server_down(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["status", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2"]) == 1
    captured = capsys.readouterr()
    assert "cannot reach kvroute" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


# ---------------------------------------------------------------- ops files

def test_collector_config_is_consistent() -> None:
    cfg = yaml.safe_load((ROOT / "ops" / "otel-collector.yaml").read_text())
    traces = cfg["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for name in traces[kind]:
            assert name in cfg[kind], f"{kind}: {name} used but not defined"
    assert traces["processors"][0] == "memory_limiter" and traces["processors"][-1] == "batch"
    assert {"grpc", "http"} <= set(cfg["receivers"]["otlp"]["protocols"])
    assert "debug" in traces["exporters"] and any(e.startswith("otlp") for e in
                                                  traces["exporters"])
    assert set(cfg["service"]["extensions"]) <= set(cfg["extensions"])


def test_prometheus_config() -> None:
    path = ROOT / "ops" / "prometheus.yml"
    cfg = yaml.safe_load(path.read_text())
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "kvroute")
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]
    if shutil.which("promtool"):
        subprocess.run(["promtool", "check", "config", str(path)], check=True,
                       capture_output=True)


def _metric_names() -> set[str]:
    from router.metrics import REGISTRY

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    return {fam.name + sfx for fam in REGISTRY.collect() for sfx in suffixes[fam.type]}


def _exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["title"]
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "model"}


def test_dashboard_queries_use_only_defined_metrics() -> None:
    known = _metric_names()
    exprs = _exprs()
    assert len(exprs) >= 20
    used = {name for e in exprs for name in re.findall(r"\bkvroute_\w+", e)}
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    for stem in ("kvroute_ttft_seconds_bucket", "kvroute_tpot_seconds_bucket",
                 "kvroute_e2e_seconds_bucket", "kvroute_index_errors_total",
                 "kvroute_retries_total", "kvroute_plugin_seconds_bucket",
                 "kvroute_replica_queued_prefill_tokens", "kvroute_predicted_cached_tokens_total"):
        assert stem in used, stem


def test_dashboard_queries_parse_and_evaluate(tmp_path: Path) -> None:
    for e in _exprs():
        Parser(e.replace("$model", ".*")).parse()
    before, after = status.parse_metrics(""), status.parse_metrics(RECORDED)
    scrapes = [(0.0, before), (10.0, after)]
    ratio = next(e for e in _exprs()
                 if e.startswith("sum by (model) (rate(kvroute_cached") and " / " in e)
    assert series_over_time(ratio, scrapes, 10.0) == {
        (("model", "sim-tiny"),): [(10.0, pytest.approx(541632 / 668848))]}
    if shutil.which("promtool"):  # the real PromQL parser agrees
        rules = {"groups": [{"name": "dash", "rules": [
            {"record": f"r{i}", "expr": e.replace("$model", ".*")}
            for i, e in enumerate(_exprs())]}]}
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
        subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], check=True,
                       capture_output=True)


def test_render_png(tmp_path: Path) -> None:
    from ops.dev.render_dashboard import render

    scrapes = [(0.0, status.parse_metrics("")), (10.0, status.parse_metrics(RECORDED))]
    out = tmp_path / "dash.png"
    render(json.loads(DASHBOARD.read_text()), scrapes, out, 10.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- a real stack

MODEL = "sim-status"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    with deployed(stack_config(serve_port, sim_model(MODEL, tiny_model_dir, replicas=2))) as url:
        yield url


@pytest.mark.slow
def test_status_on_real_stack(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = "status check " + "a long shared prompt " * 60  # several blocks, cacheable
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    for _ in range(4):
        assert httpx.post(f"{stack}/v1/chat/completions", json=body, timeout=30).status_code == 200
    deadline, data = time.monotonic() + 20, {}
    while time.monotonic() < deadline:  # replica gauges are refreshed once a second
        data = status.status_data(stack)
        if len(data["models"].get(MODEL, {}).get("replicas", {})) == 2:
            break
        time.sleep(0.5)
    m = data["models"][MODEL]
    assert data["status"] == "ok" and m["ready_replicas"] == 2
    assert len(m["replicas"]) == 2
    assert m["requests"].get("ok", 0) >= 4 and m["prompt_tokens"] > 0
    assert m["cached_ratio"] and m["cached_ratio"] > 0  # the same prompt, repeated
    assert m["predicted_cached_ratio"] is not None and m["ttft_p50_s"] is not None
    assert data["index"]["lookups"] >= 4
    assert _run(["status", "--url", stack]) == 0
    assert MODEL in capsys.readouterr().out
