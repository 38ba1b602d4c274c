"""Logprobs on every engine adapter (the contract suite's engines and helpers): one entry
per generated token, valid values, the top list sorted with the greedy token first, prompt
logprobs for every prompt token after the first, and no cache hit for a request that asks
for them. On mlx the values are mlx-lm's own for the same model and tokens."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.workers.engines import test_engine_contract as contract
from tests.workers.engines.test_engine_contract import EngineCase, ids, prompt, req, run, running
from workers.protocol import TokenChunk, TokenLogprob


@pytest.fixture(params=contract.PARAMS)
def case(request: pytest.FixtureRequest) -> EngineCase:
    return contract.ENGINES[request.param](request)


def logprobs(chunks: list[TokenChunk]) -> list[TokenLogprob]:
    return [x for c in chunks for x in c.logprobs]


def check_valid(entries: list[TokenLogprob], token_ids: list[int], top: int) -> None:
    assert [x.token_id for x in entries] == token_ids
    for x in entries:
        assert x.logprob <= 0 and x.rank >= 1 and isinstance(x.token, str)
        assert len(x.top) == top
        values = [t.logprob for t in x.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        if top:
            assert sum(math.exp(v) for v in values) <= 1 + 1e-3
            assert len({t.token_id for t in x.top}) == top


async def test_generated_tokens_carry_logprobs(case: EngineCase) -> None:
    async with running(case) as engine:
        chunks, fin = await run(engine, req("lp", prompt(24), max_tokens=6, logprobs=5))
        entries = logprobs(chunks)
        check_valid(entries, ids(chunks), 5)
        assert fin.usage.completion_tokens == 6
        for x in entries:  # greedy: the sampled token is the most likely one
            assert x.rank == 1 and x.top[0].token_id == x.token_id
            assert x.top[0].logprob == pytest.approx(x.logprob)


async def test_zero_top_gives_the_token_alone_and_off_gives_none(case: EngineCase) -> None:
    async with running(case) as engine:
        chunks, _ = await run(engine, req("z", prompt(20, 1), max_tokens=3, logprobs=0))
        check_valid(logprobs(chunks), ids(chunks), 0)
        chunks, _ = await run(engine, req("off", prompt(20, 1), max_tokens=3))
        assert not logprobs(chunks) and not any(c.prompt_logprobs for c in chunks)


async def test_prompt_logprobs_skip_the_cache(case: EngineCase) -> None:
    tokens = prompt(40, 2)
    async with running(case) as engine:
        await run(engine, req("warm", tokens, max_tokens=2))
        chunks, fin = await run(engine, req("p", tokens, max_tokens=2, prompt_logprobs=3))
        assert fin.usage.cached_tokens == 0  # a cached prefix holds no logits
        got = [x for c in chunks for x in c.prompt_logprobs]
        assert chunks[0].prompt_logprobs and not any(c.prompt_logprobs for c in chunks[1:])
        check_valid(got, tokens[1:], 3)
        chunks2, _ = await run(engine, req("p2", tokens, max_tokens=2, prompt_logprobs=3))
        assert [x.logprob for x in chunks2[0].prompt_logprobs] == pytest.approx(
            [x.logprob for x in got], abs=1e-4)  # repeatable


@pytest.mark.slow
async def test_mlx_logprobs_equal_mlx_lm_own(tiny_model_dir: Path,
                                             request: pytest.FixtureRequest) -> None:
    """The engine's logprobs (batched decode rows, and its own prompt pass) against one
    plain forward pass of mlx-lm's model over prompt + output."""
    import mlx.core as mx
    from mlx_lm import load

    model_case = contract.ENGINES["mlx"](request)
    tokens = prompt(30, 3)
    async with running(model_case) as engine:
        chunks, _ = await run(engine, req("eq", tokens, max_tokens=5, logprobs=4,
                                          prompt_logprobs=4))
    out = ids(chunks)
    model, _tok = load(str(tiny_model_dir))
    logits = model(mx.array(tokens + out)[None])[0]
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    full = tokens + out
    want = [lp[i - 1, full[i]].item() for i in range(1, len(full))]
    got = [x.logprob for x in chunks[0].prompt_logprobs] + [x.logprob for x in logprobs(chunks)]
    assert got == pytest.approx(want, abs=2e-3)
    for i, x in enumerate(logprobs(chunks)):  # the top 4 are mlx-lm's top 4
        row = lp[len(tokens) - 1 + i]
        best = mx.argsort(-row)[:4].tolist()
        assert [t.token_id for t in x.top] == best

