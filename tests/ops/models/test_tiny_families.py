"""``make-model --family F``: each family's tiny model loads offline (tokenizers,
transformers), renders through kvroute's template path, and encodes every family token as
one id; one family model runs on the real mlx engine (CPU)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from deploy.cli.main import build_parser
from ops.models.tiny_families import DEFAULT_FAMILY, FAMILIES, FAMILY_NAMES
from ops.models.tiny_model import ensure_model, make_model
from router.prompt.tokenizer import ChatTokenizer
from workers.protocol import Finished, GenerateRequest, SamplingParams

REPO = Path(__file__).resolve().parents[3]
PARSER_SOURCES = "\n".join(
    p.read_text(encoding="utf-8")
    for d in ("tool_parsers", "reasoning_parsers")
    for p in (REPO / "router" / "output" / d).glob("*.py")
)
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call0abcd", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call0abcd", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "Thanks"},
]


@pytest.fixture(scope="module")
def family_cache(tiny_model_dir: Path) -> Path:
    """The session's model cache, so the tool-parser stacks reuse these builds."""
    return tiny_model_dir.parent


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_model_loads_renders_and_encodes_its_tokens(family: str,
                                                           family_cache: Path) -> None:
    from transformers import AutoTokenizer

    folder = ensure_model(family_cache, family=family)
    fam = FAMILIES[family]
    cfg = json.loads((folder / "config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pad = json.loads((folder / "tokenizer_config.json").read_text())["pad_token"]
    assert tok.get_vocab_size(with_added_tokens=True) <= cfg["vocab_size"]
    for token in fam.tokens():
        # each token is the template's or a parser's (or bos/eos/pad), one id
        assert token in fam.template_text() or token in PARSER_SOURCES or token in (
            fam.bos, fam.eos, pad), token
        ids = tok.encode(token, add_special_tokens=False).ids
        assert ids == [tok.token_to_id(token)], (token, ids)
    eos_ids = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [
        gen["eos_token_id"]]
    assert [tok.id_to_token(i) for i in eos_ids] == [fam.eos, *fam.stops]

    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert hf.eos_token == fam.eos and hf.bos_token == fam.bos
    chat = ChatTokenizer(str(folder))
    text = chat.render(CHAT, tools=[TOOL])
    assert "Paris" in text and "sunny" in text and "get_weather" in text
    ids = chat.encode(text)
    present = [t for t in fam.tokens() if t in text]
    assert present, f"{family}: the rendered chat uses none of the family's tokens"
    for t in present:
        assert chat.token_id(t) in ids, t
    assert chat.decode(ids) == text


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown family 'llama9'"):
        make_model(tmp_path, family="llama9")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["make-model", str(tmp_path), "--family", "llama9"])


def test_cli_family_choices_are_the_one_list(tmp_path: Path) -> None:
    args = build_parser().parse_args(["make-model", str(tmp_path)])
    assert args.family == DEFAULT_FAMILY and FAMILY_NAMES[0] == DEFAULT_FAMILY
    assert set(FAMILY_NAMES) == {DEFAULT_FAMILY, *FAMILIES}


async def _generate(folder: Path, prompt: list[int]) -> Finished:
    from workers.engines.mlx.engine import MlxEngine

    engine = MlxEngine(str(folder), "fam/model", "r0", 2)
    await engine.start()
    try:
        sp = SamplingParams(max_tokens=4, ignore_eos=True)
        tokens = 0
        async for item in engine.generate(GenerateRequest("f0", prompt, sp)):
            if isinstance(item, Finished):
                assert tokens == 4
                return item
            tokens += len(item.token_ids)
        raise AssertionError("no Finished")
    finally:
        await engine.shutdown()


def test_mlx_engine_runs_a_family_model(family_cache: Path) -> None:
    folder = ensure_model(family_cache, family="gpt-oss")
    chat = ChatTokenizer(str(folder))
    prompt = chat.encode(chat.render([{"role": "user", "content": "Hi"}]))
    assert chat.token_id("<|start|>") in prompt
    done = asyncio.run(_generate(folder, prompt))
    assert done.finish_reason == "length" and done.usage.completion_tokens == 4
