"""``ops.bench``: the workloads are deterministic, trace replay keeps prefix sharing,
the bench JSON validates against the schema, and the client measures a real stream
(against ``DirectHttp`` with a fake engine)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ops.bench.harness import report
from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver, trace_driver
from ops.bench.harness.workloads import (
    MIN_TOKEN_ID,
    TOP_RESERVED,
    AgentParams,
    AgentWorkload,
    Call,
    Spawn,
    flatten,
    trace_requests,
)
from workers.protocol import Chunk, Final, Usage, WorkerMessage, WorkRequest

MOONCAKE = Path(__file__).resolve().parents[5] / "shared" / "traces" / "mooncake_trace_1000.jsonl"
SMALL = AgentParams(system_tokens=300, tools=4, subagent_system_tokens=100, repo_tokens=200,
                    tool_result_tokens=150, reply_tokens=8, final_tokens=12, tool_time_s=0.01,
                    user_time_s=0.02, turns_mean=3, subagent_prob=0.3, compact_tokens=3000,
                    summary_tokens=100)


def _script(w: AgentWorkload, i: int) -> str:
    def enc(steps: Any) -> Any:
        return [{"think": s.think_s, "key": s.request.key, "body": s.request.body}
                if isinstance(s, Call) else [enc(a) for a in s.agents] for s in steps]

    return json.dumps(enc(w.session(i)), sort_keys=True)


# -- agent workload ----------------------------------------------------------------------
def test_agent_workload_is_deterministic() -> None:
    a, b = AgentWorkload(AgentParams(seed=7)), AgentWorkload(AgentParams(seed=7))
    for i in (0, 1, 5):
        assert _script(a, i) == _script(b, i)
    assert _script(a, 1) == _script(a, 1)  # no hidden state between calls
    assert _script(a, 0) != _script(a, 1)
    assert _script(a, 0) != _script(AgentWorkload(AgentParams(seed=8)), 0)


def test_agent_sessions_share_system_prompt_and_tools_and_grow() -> None:
    w = AgentWorkload(SMALL)
    sessions = [w.session(i) for i in range(12)]
    calls = [c for s in sessions for c in flatten(s)]
    main = [c for c in calls if ".a" not in c.request.key]
    assert all(c.request.body["messages"][0]["content"] == w.system for c in main)
    assert all(c.request.body["tools"] == w.tools for c in main)
    subs = [c for c in calls if ".a" in c.request.key]
    assert subs and any(isinstance(step, Spawn) for s in sessions for step in s)
    assert all(c.request.body["messages"][0]["content"] == w.sub_system for c in subs)
    compactions = 0
    for s in sessions:
        own = [c.request.body["messages"] for c in flatten(s) if ".a" not in c.request.key]
        for prev, nxt in zip(own, own[1:], strict=False):
            if nxt[: len(prev)] == prev:
                assert len(nxt) > len(prev)  # the history grew
            else:
                compactions += 1  # a compaction restarts the history from a summary
                # (the summary request itself may drop old turns to fit the window)
                assert any(m[-1]["content"].startswith("Summarize") for m in (prev, nxt))
    assert compactions > 0
    assert all(c.think_s >= 0 for c in calls) and calls[0].think_s == 0


def test_salt_isolates_runs_but_keeps_the_workload() -> None:
    plain, salted = AgentWorkload(SMALL), AgentWorkload(SMALL, salt="kvroute")
    assert salted.system == "[kvroute] " + plain.system
    a, b = flatten(plain.session(3)), flatten(salted.session(3))
    assert [c.request.key for c in a] == [c.request.key for c in b]
    assert [c.request.body["max_tokens"] for c in a] == [c.request.body["max_tokens"] for c in b]
    assert a[0].request.body["messages"][1] == b[0].request.body["messages"][1]


# -- trace replay ------------------------------------------------------------------------
def _write_trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_prefix_sharing_is_exact(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1400, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 10, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 4]},
        {"timestamp": 20, "input_length": 600, "output_length": 1, "hash_ids": [9, 2]},
    ])
    (t0, a), (t1, b), (_, c) = trace_requests(trace, vocab_size=4096)
    pa, pb, pc = a.body["prompt"], b.body["prompt"], c.body["prompt"]
    assert (t0, t1) == (0.0, 0.01) and a.body["max_tokens"] == 5
    assert (len(pa), len(pb), len(pc)) == (1400, 1100, 600)  # the last block is partial
    assert pa[:1024] == pb[:1024]  # same leading hash ids: identical leading tokens
    assert pa[1024:1100] != pb[1024:1100]  # then they part
    assert pc[:512] != pa[:512] and pc[512:600] == pa[512:600]  # a block is its id's
    assert all(MIN_TOKEN_ID <= t < 4096 - TOP_RESERVED for t in pa + pb + pc)
    again = trace_requests(trace, vocab_size=4096)
    assert [r.body for _, r in again] == [a.body, b.body, c.body]
    salted = trace_requests(trace, vocab_size=4096, salt="x")
    assert salted[0][1].body["prompt"][:1024] == salted[1][1].body["prompt"][:1024]
    assert salted[0][1].body["prompt"][:512] != pa[:512]


def test_mooncake_replay_keeps_shared_prefixes() -> None:
    items = trace_requests(MOONCAKE, vocab_size=4096, max_requests=200)
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:200]]
    by_first: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_first.setdefault(row["hash_ids"][0], []).append(i)
    i, j = next(v[:2] for v in by_first.values() if len(v) >= 2)
    hi, hj = rows[i]["hash_ids"], rows[j]["hash_ids"]
    common = next((k for k, (x, y) in enumerate(zip(hi, hj, strict=False)) if x != y),
                  min(len(hi), len(hj)))
    n = min(common * 512, rows[i]["input_length"], rows[j]["input_length"])
    assert n > 0
    assert items[i][1].body["prompt"][:n] == items[j][1].body["prompt"][:n]


# -- bench JSON --------------------------------------------------------------------------
def _records() -> list[Record]:
    return [Record(f"k{i}", "s0", i * 0.5, ttft_s=0.1 + 0.01 * i, e2e_s=1.0, tpot_s=0.02,
                   prompt_tokens=1000, completion_tokens=10, cached_tokens=800,
                   predicted_cached_tokens=768, replica=f"r{i % 2}") for i in range(20)]


def test_bench_json_validates_against_the_schema(tmp_path: Path) -> None:
    records = [*_records(), Record("bad", "s1", 3.0, error="HTTP 503: overloaded")]
    bench = report.bench_json(records, workload="agent", policy="kvroute", replicas=2,
                              params={"seed": 0}, prefill_tok_s=4000.0)
    report.validate(bench)
    json.loads(json.dumps(bench))  # plain JSON
    assert bench["requests"] == 21 and bench["errors"] == 1
    assert bench["cached_token_ratio"] == pytest.approx(0.8)
    assert bench["predicted_cached_token_ratio"] == pytest.approx(0.768)
    assert bench["per_replica_requests"] == {"r0": 10, "r1": 10}
    assert bench["params"]["prefill_busy"] == pytest.approx(20 * 200 / (4000 * 2 * 10.5))
    assert set(bench["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    for broken in ({k: v for k, v in bench.items() if k != "ttft_s"},
                   {**bench, "errors": -1}, {**bench, "tpot_s": {"mean": 0.1}}):
        with pytest.raises(jsonschema.ValidationError):
            report.validate(broken)
    empty = report.bench_json([], workload="trace", policy="x", replicas=0, params={})
    report.validate(empty)
    assert "| kvroute |" in report.markdown_table({"kvroute": bench})
    runs = {"kvroute": records, "other": _records()[:5]}
    assert report.plot_ttft_cdf(runs, tmp_path / "cdf.png", "t").stat().st_size > 0
    assert report.plot_cached_ratio(runs, tmp_path / "hit.png", "t").stat().st_size > 0


# -- the client against a real stream ----------------------------------------------------
class _Engine:
    async def generate(self, request: WorkRequest,
                       kvroute_rank: list[str] | None = None) -> AsyncIterator[WorkerMessage]:
        n = request.sampling.max_tokens
        await asyncio.sleep(0.02)  # "prefill"
        for i in range(n):
            yield Chunk("r-9", " w", (i,))
            await asyncio.sleep(0.005)
        prompt = len(request.token_ids)
        yield Final("r-9", Usage(prompt, n, prompt // 2), "length")


async def test_client_measures_streams_closed_and_open_loop(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    from router.app.replica_endpoint import DirectHttp

    direct = DirectHttp("tiny-llama", str(tiny_model_dir), _Engine().generate)
    await direct.start()
    try:
        url = f"http://{direct.address}"
        spec = LoadSpec(duration_s=1.0, concurrency=2, ramp_s=0.1, drain_timeout_s=30)
        async with Client(url, "tiny-llama") as client:
            agent = await Runner(client, spec, "t", show=False).run(
                agent_driver(AgentWorkload(SMALL), spec))
            trace = _write_trace(tmp_path / "t.jsonl", [
                {"timestamp": 100 * i, "input_length": 700, "output_length": 3,
                 "hash_ids": [1, 2]} for i in range(5)])
            timed = LoadSpec(duration_s=5.0, speedup=2.0)
            replay = await Runner(client, timed, "t", show=False).run(
                trace_driver(trace_requests(trace, 4096), timed))
    finally:
        await direct.stop()
    assert agent and all(r.ok for r in agent)
    assert all(r.replica == "r-9" and r.ttft_s >= 0.02 for r in agent)  # type: ignore[operator]
    assert all(r.cached_tokens == r.prompt_tokens // 2 > 0 for r in agent)
    assert all(r.tpot_s is not None for r in agent if r.completion_tokens > 1)
    assert [r.key for r in replay] == [f"trace.{i}" for i in range(5)]
    assert all(abs(r.start_s - 0.05 * i) < 0.04 for i, r in enumerate(replay))  # ts / 2
    assert all(r.prompt_tokens == 700 and r.completion_tokens == 3 for r in replay)
