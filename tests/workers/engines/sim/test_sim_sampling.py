"""The sampling controls the sim emulator honours (min_tokens, stop_token_ids, ignore_eos,
max_tokens, seed) and the ones it takes with no effect on its synthetic text."""

from __future__ import annotations

from tests.workers.engines.sim.test_sim_engine import BS, make_engine, prompt, run
from workers.engines.sim.core import SimParams
from workers.protocol import Finished, TokenChunk

EOS4 = SimParams(block_size=BS, prefill_tok_s=1e7, tpot_s=0.001, eos_every=4)


def ids(chunks: list[TokenChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def test_min_tokens_holds_eos_back() -> None:
    engine = await make_engine(EOS4)
    _, fin = await run(engine, prompt(30), max_tokens=20)
    assert fin.finish_reason == "stop" and fin.usage.completion_tokens == 3
    chunks, fin = await run(engine, prompt(30), "b", max_tokens=20, min_tokens=9)
    assert fin.finish_reason == "stop" and fin.usage.completion_tokens == 9 == len(ids(chunks))
    await engine.shutdown()


async def test_stop_token_ids_end_the_output_even_with_ignore_eos() -> None:
    engine = await make_engine()
    full, _ = await run(engine, prompt(30), max_tokens=12)
    out = ids(full)
    stop = out[5]
    chunks, fin = await run(engine, prompt(30), "b", max_tokens=12, ignore_eos=True,
                            stop_token_ids=(stop,))
    assert ids(chunks) == out[:out.index(stop)] and fin.finish_reason == "stop"
    assert fin.usage.completion_tokens == out.index(stop)
    chunks, _ = await run(engine, prompt(30), "c", max_tokens=12, stop_token_ids=(stop,),
                          min_tokens=out.index(stop) + 1)  # held back past its place
    assert ids(chunks)[:out.index(stop) + 1] == out[:out.index(stop) + 1]
    await engine.shutdown()


async def test_seed_changes_the_tokens_and_the_other_controls_do_not() -> None:
    engine = await make_engine()
    base, _ = await run(engine, prompt(30), max_tokens=8, seed=1)
    other, _ = await run(engine, prompt(30), "b", max_tokens=8, seed=2)
    assert ids(base) != ids(other)
    same, fin = await run(engine, prompt(30), "c", max_tokens=8, seed=1, temperature=0.3,
                          top_k=3, min_p=0.2, presence_penalty=1.0, frequency_penalty=1.0,
                          repetition_penalty=1.5, logit_bias=((5, 100.0),),
                          bad_words=("w1",))
    assert ids(same) == ids(base) and isinstance(fin, Finished)
    await engine.shutdown()


async def test_stop_strings_wait_for_min_tokens() -> None:
    from workers.engines.sim.engine import token_text

    engine = await make_engine()
    full, _ = await run(engine, prompt(30), max_tokens=12)
    out = ids(full)
    stop = token_text(out[1])
    chunks, fin = await run(engine, prompt(30), "b", max_tokens=12, stop=(stop,))
    assert ids(chunks) == out[:2] and fin.finish_reason == "stop"
    chunks, _ = await run(engine, prompt(30), "c", max_tokens=12, stop=(stop,), min_tokens=6)
    assert ids(chunks)[:6] == out[:6]  # the early stop string is passed over, as vLLM does
    await engine.shutdown()
