"""Every sampling control on the real mlx engine (tiny random-weight model, CPU MLX): each
one changes the output the way it should, against the same prompt's plain greedy output.

One engine serves the module, on an event loop of its own in a thread (loading the model
is the slow part)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.protocol import Finished, GenerateRequest, SamplingParams

pytestmark = pytest.mark.slow
PROMPT = [5 + i * 7 % 400 for i in range(30)]
N = 12


class _Served:
    def __init__(self, model_dir: Path) -> None:
        from workers.engines.mlx.engine import MlxEngine

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine = MlxEngine(str(model_dir), "controls/model", "r0", 16)
        self.call(self.engine.start())
        self.count = 0

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(300)

    def run(self, **sampling: Any) -> tuple[list[int], Finished]:
        sampling.setdefault("max_tokens", N)
        self.count += 1
        return self.call(self._run(GenerateRequest(f"r{self.count}", PROMPT,
                                                   SamplingParams(**sampling))))

    async def _run(self, req: GenerateRequest) -> tuple[list[int], Finished]:
        ids: list[int] = []
        async for item in self.engine.generate(req):
            if isinstance(item, Finished):
                return ids, item
            ids += item.token_ids
        raise AssertionError("no Finished")

    def close(self) -> None:
        self.call(self.engine.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def mlx(tiny_model_dir: Path) -> Iterator[_Served]:
    served = _Served(tiny_model_dir)
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def greedy(mlx: _Served) -> list[int]:
    ids, fin = mlx.run(ignore_eos=True)
    assert len(ids) == N and fin.finish_reason == "length"
    assert len(set(ids)) < N, "the plain output repeats no token: the penalty tests prove nothing"
    return ids


def _eos(model_dir: Path) -> int:
    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def test_logit_bias_makes_one_token_the_output(mlx: _Served, greedy: list[int]) -> None:
    token = next(t for t in range(50, 500) if t not in greedy)
    ids, _ = mlx.run(ignore_eos=True, logit_bias=((token, 100.0),))
    assert ids == [token] * N


def test_min_tokens_holds_off_eos(mlx: _Served, tiny_model_dir: Path) -> None:
    eos = _eos(tiny_model_dir)
    ids, fin = mlx.run(logit_bias=((eos, 100.0),))  # EOS first: nothing comes out
    assert ids == [] and fin.finish_reason == "stop"
    ids, fin = mlx.run(logit_bias=((eos, 100.0),), min_tokens=5)
    assert len(ids) == 5 and eos not in ids and fin.finish_reason == "stop"


def test_stop_token_ids_end_the_output(mlx: _Served, greedy: list[int]) -> None:
    stop = greedy[2]
    ids, fin = mlx.run(ignore_eos=True, stop_token_ids=(stop,))  # stops with ignore_eos too
    assert ids == greedy[:greedy.index(stop)] and fin.finish_reason == "stop"
    assert fin.usage.completion_tokens == len(ids)


def test_min_tokens_holds_off_stop_token_ids(mlx: _Served, greedy: list[int]) -> None:
    stop = greedy[0]
    ids, fin = mlx.run(ignore_eos=True, stop_token_ids=(stop,), min_tokens=4)
    assert len(ids) >= 4 and stop not in ids[:4]


@pytest.mark.parametrize("penalty", [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                                     {"repetition_penalty": 2.0}])
def test_penalties_stop_the_repeats(mlx: _Served, greedy: list[int],
                                    penalty: dict[str, float]) -> None:
    ids, _ = mlx.run(ignore_eos=True, **penalty)
    assert len(ids) == N and len(set(ids)) == N and ids != greedy


def test_bad_words_never_appear(mlx: _Served, greedy: list[int]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(mlx.engine._cfg.model_path) / "tokenizer.json"))
    token = next(t for t in range(50, 500) if t not in greedy
                 and len(tok.decode([t]).strip()) > 1
                 and tok.encode(tok.decode([t]).strip(), add_special_tokens=False).ids == [t])
    word = tok.decode([token]).strip()
    ids, _ = mlx.run(ignore_eos=True, logit_bias=((token, 100.0),))
    assert ids == [token] * N  # the bias alone makes it the output ...
    ids, _ = mlx.run(ignore_eos=True, logit_bias=((token, 100.0),), bad_words=(word,))
    assert token not in ids and len(ids) == N  # ... and bad_words keeps it out


@pytest.mark.parametrize("control", [{"top_k": 1}, {"min_p": 1.0}])
def test_top_k_1_and_min_p_1_sample_the_argmax(mlx: _Served, greedy: list[int],
                                                control: dict[str, Any]) -> None:
    free, _ = mlx.run(ignore_eos=True, temperature=1.0, seed=3)
    assert free != greedy, "sampling at temperature 1 gave the argmax: the test proves nothing"
    ids, _ = mlx.run(ignore_eos=True, temperature=1.0, seed=3, **control)
    assert ids == greedy


def test_seed_repeats_a_draw(mlx: _Served) -> None:
    a, _ = mlx.run(ignore_eos=True, temperature=1.0, seed=11)
    b, _ = mlx.run(ignore_eos=True, temperature=1.0, seed=11)
    c, _ = mlx.run(ignore_eos=True, temperature=1.0, seed=12)
    assert a == b != c



def test_stop_strings_wait_for_min_tokens(mlx: _Served, greedy: list[int]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(mlx.engine._cfg.model_path) / "tokenizer.json"))
    stop = tok.decode(greedy[1:2])
    assert stop.strip(), "the second token has no text: the test proves nothing"
    ids, fin = mlx.run(ignore_eos=True, stop=(stop,))
    assert len(ids) <= 2 and fin.finish_reason == "stop"
    ids, _ = mlx.run(ignore_eos=True, stop=(stop,), min_tokens=6)
    assert ids[:6] == greedy[:6]  # passed over until 6 tokens are out, as vLLM does
