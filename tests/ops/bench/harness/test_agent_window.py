"""The agent workload plans its requests below the server's context window."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ops.bench.harness.workloads import (
    AgentParams,
    AgentWorkload,
    Call,
    _tokens,
    flatten,
    prompt_limit,
    with_context,
)
from router.prompt.cache import PromptCacheConfig
from router.prompt.tokenizer import ChatTokenizer

# Long sessions with big tool results: they overflow a small window without compaction.
LONG = AgentParams(seed=3, tasks_mean=3.0, turns_mean=12.0, tool_result_tokens=3000,
                   compact_tokens=60000)
WINDOW = 32768  # the demo's (deploy.config ModelConfig.context_window)


def test_estimate_counts_tools_and_tool_calls() -> None:
    msgs = [{"role": "user", "content": "x" * 400}]
    assert _tokens(msgs, 4) == 110 and _tokens(msgs, 2) == 220
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {}}]}
    assert _tokens([*msgs, call], 2) > _tokens([*msgs, {"role": "assistant"}], 2)
    tools = [{"type": "function", "function": {"name": "Read", "description": "y" * 200}}]
    assert _tokens(msgs, 2, tools) > _tokens(msgs, 2) + 100


def test_limit_follows_the_window_when_the_server_reports_one() -> None:
    assert prompt_limit(AgentParams(compact_tokens=40000)) > 40000  # + the tools
    small = with_context(AgentParams(compact_tokens=40000), 16384)
    assert small.context_tokens == 16384 and prompt_limit(small) < 16384
    # an explicit --agent context_tokens=... wins over the server's report
    assert with_context(replace(small, context_tokens=9000), 32768).context_tokens == 9000
    assert with_context(AgentParams(), None).context_tokens == 0


def test_every_request_fits_the_window_by_estimate() -> None:
    params = with_context(LONG, WINDOW)
    w = AgentWorkload(params)
    calls = [c for i in range(6) for c in flatten(w.session(i))]
    sizes = [_tokens(c.request.body["messages"], params.chars_per_token, c.request.body["tools"])
             + c.request.body["max_tokens"] for c in calls]
    assert max(sizes) <= WINDOW
    summaries = [c for c in calls if c.request.body["messages"][-1]["content"].startswith(
        "Summarize")]
    assert summaries  # the small window made the sessions compact
    # without the window the same sessions pass it: the test can fail
    loose = [c for i in range(6) for c in flatten(AgentWorkload(LONG).session(i))]
    assert max(_tokens(c.request.body["messages"], 2.0, c.request.body["tools"])
               for c in loose) > WINDOW


def test_compacted_prompts_fit_the_tiny_models_window(tiny_model_dir: Path) -> None:
    """The real tokenizer (the demo's) agrees: prompt + max_tokens stay under the window."""
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(enabled=False))
    params = with_context(LONG, WINDOW)
    calls = flatten(AgentWorkload(params).session(0))

    def est(c: Call) -> int:
        return _tokens(c.request.body["messages"], params.chars_per_token, c.request.body["tools"])

    biggest = sorted(calls, key=est)[-4:]  # rendering all of them costs seconds
    worst = max(len(tok.render_encode(c.request.body["messages"], c.request.body["tools"]))
                + c.request.body["max_tokens"] for c in biggest)
    assert WINDOW / 2 < worst <= WINDOW
