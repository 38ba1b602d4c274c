"""A bad sampling request on the real mlx engine (tiny model, CPU MLX): a job whose
sampling input the engine refuses fails alone, as an input error (a 400 at the worker
shim), while the sequences already decoding in the same batch run to their end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from workers.protocol import Finished, GenerateRequest, SamplingParams

pytestmark = pytest.mark.slow
BS = 16
VICTIM_TOKENS = 400


def _prompt(n: int, base: int) -> list[int]:
    return [5 + (base * 997 + i * 7) % 4000 for i in range(n)]


def _req(rid: str, base: int, **sampling: object) -> GenerateRequest:
    sp = SamplingParams(ignore_eos=True, **sampling)  # type: ignore[arg-type]
    return GenerateRequest(rid, _prompt(40, base), sp)


class Victim:
    """A stream that reports when it is in flight and how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished: Finished | None = None
        self.tokens = 0

    async def run(self, engine: object, request: GenerateRequest) -> None:
        async for item in engine.generate(request):  # type: ignore[attr-defined]
            if isinstance(item, Finished):
                self.finished = item
                return
            self.tokens += len(item.token_ids)
            self.started.set()


async def _bad_next_to_three(model_dir: Path, bad_seed: int) -> tuple[list[Victim], BaseException]:
    from workers.engines.mlx.engine import MlxEngine

    engine = MlxEngine(str(model_dir), "guard/model", "r0", BS)
    await engine.start()
    try:
        victims = [Victim() for _ in range(3)]
        samplings = [{}, {"temperature": 0.8, "seed": 7}, {"temperature": 0.8}]
        tasks = [asyncio.create_task(v.run(engine, _req(f"v{i}", i, max_tokens=VICTIM_TOKENS,
                                                        **samplings[i])))
                 for i, v in enumerate(victims)]
        await asyncio.wait_for(asyncio.gather(*(v.started.wait() for v in victims)), 120)
        bad = _req("bad", 9, max_tokens=8, temperature=0.7, seed=bad_seed)
        with pytest.raises(ValueError) as err:
            async for _ in engine.generate(bad):
                pass
        in_flight = [v.finished is None for v in victims]
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
        assert all(in_flight), "a victim ended before the bad job failed: the test proved nothing"
        return victims, err.value
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("bad_seed", [-1, 2**64])
def test_bad_seed_fails_alone_next_to_three_streams(tiny_model_dir: Path, bad_seed: int) -> None:
    from workers.engines.mlx.batch import SamplingError

    victims, err = asyncio.run(_bad_next_to_three(tiny_model_dir, bad_seed))
    assert isinstance(err, SamplingError) and "seed" in str(err)
    for v in victims:
        assert v.finished is not None and v.finished.finish_reason == "length"
        assert v.finished.usage.completion_tokens == VICTIM_TOKENS == v.tokens

