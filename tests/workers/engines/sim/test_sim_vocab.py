"""The emulator's words tokenize back to its ids (``workers.engines.sim.vocab``): a client that
counts tokens itself counts what the server counted."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from deploy.config import ModelConfig
from workers.engines import make_engine
from workers.engines.sim.vocab import SimVocab
from workers.protocol import Finished, GenerateRequest, SamplingParams, TokenChunk


def test_the_words_of_the_tiny_model_round_trip(tiny_model_dir: Path) -> None:
    vocab = SimVocab.of_model(str(tiny_model_dir))
    assert vocab is not None and len(vocab.ids) >= 100
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = [vocab.ids[(i * 7919) % len(vocab.ids)] for i in range(400)]
    assert tok.encode("".join(vocab.text(i) for i in ids), add_special_tokens=False).ids == ids


def test_no_tokenizer_no_vocab(tmp_path: Path) -> None:
    assert SimVocab.of_model(str(tmp_path)) is None


async def test_a_sim_replica_of_a_real_model_streams_text_that_is_its_ids(
        tiny_model_dir: Path) -> None:
    cfg = ModelConfig.model_validate({"name": "sim", "engine": "sim",
                                      "model_path": str(tiny_model_dir),
                                      "engine_kwargs": {"tpot_s": 0.0001}})
    engine = make_engine(cfg, "r0", 64)
    await engine.start()
    text, ids, usage = "", [], None
    try:
        request = GenerateRequest("a", list(range(100, 200)),
                                  SamplingParams(max_tokens=48, ignore_eos=True))
        async for item in engine.generate(request):
            if isinstance(item, TokenChunk):
                text, ids = text + item.text, ids + list(item.token_ids)
            elif isinstance(item, Finished):
                usage = item.usage
    finally:
        await engine.shutdown()
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert usage is not None and usage.completion_tokens == len(ids) == 48
    assert tok.encode(text, add_special_tokens=False).ids == ids
