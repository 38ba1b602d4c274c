"""ops.models.tiny_model: determinism, loaders (transformers, tokenizers, mlx-lm), cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from ops.models import tiny_model
from ops.models.tiny_model import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    MODEL_FILES,
    MODEL_NAME,
    TOOL_CALL_END_ID,
    TOOL_CALL_START_ID,
    ensure_model,
    main,
    make_model,
)

REPO_ROOT = Path(__file__).resolve().parents[3]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return make_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path) -> Any:
    import transformers
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def test_writes_expected_files(model_dir: Path) -> None:
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(MODEL_FILES)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 4096
    assert config["max_position_embeddings"] >= 32768
    assert config["eos_token_id"] == IM_END_ID
    assert config["tie_word_embeddings"] is False


def test_deterministic(model_dir: Path, tmp_path: Path) -> None:
    again = make_model(tmp_path / "again", seed=0)
    for name in MODEL_FILES:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    other = make_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_weights(model_dir: Path) -> None:
    from safetensors.numpy import load_file

    weights = load_file(str(model_dir / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (4096, 256)
    assert weights["lm_head.weight"].shape == (4096, 256)
    assert weights["model.layers.3.self_attn.k_proj.weight"].shape == (128, 256)
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (256, 512)
    assert (weights["model.norm.weight"] == 1).all()
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert str(q.dtype) == "float32" and abs(float(q.std()) - 0.02) < 0.002


def test_special_token_ids(model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 4096
    expected = {
        "<|endoftext|>": ENDOFTEXT_ID,
        "<|im_start|>": IM_START_ID,
        "<|im_end|>": IM_END_ID,
        "<tool_call>": TOOL_CALL_START_ID,
        "</tool_call>": TOOL_CALL_END_ID,
    }
    for token, token_id in expected.items():
        assert tok.token_to_id(token) == token_id
        assert tok.encode(f"a{token}b").ids[1] == token_id
    text = "Hello, world! def f(x): return x * 2  # café 日本語 🙂"
    assert tok.decode(tok.encode(text).ids) == text


def test_autoconfig(model_dir: Path) -> None:
    import transformers
    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    assert config.model_type == "llama"
    assert config.vocab_size == 4096
    assert config.num_key_value_heads == 2 and config.head_dim == 64
    assert config.eos_token_id == IM_END_ID


def test_hf_tokenizer_matches_tokenizers(model_dir: Path, hf_tokenizer: Any) -> None:
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert len(hf_tokenizer) == 4096 == raw.get_vocab_size()
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.eos_token_id == IM_END_ID
    assert hf_tokenizer.pad_token_id == ENDOFTEXT_ID
    corpus = tiny_model.CORPUS_PATH.read_text()
    for text in (corpus[:3000], "<|im_start|>user\nhi<|im_end|>\n", "naïve 12345 <tool_call>{}"):
        assert hf_tokenizer.encode(text, add_special_tokens=False) == raw.encode(text).ids
        assert hf_tokenizer.encode(text) == raw.encode(text).ids  # no BOS is added
    ids = raw.encode("<tool_call>x</tool_call><|im_end|>").ids
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_plain(hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    default = hf_tokenizer.apply_chat_template(messages[1:2], tokenize=False)
    assert default == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_chat_template_tools(hf_tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "tool", "content": '{"temp_c": 25}'},
    ]
    text = hf_tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
    )
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER_TOOL, ensure_ascii=False)}\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in system
    assert rest == (
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response>\n'
        '<tool_response>\n{"temp_c": 25}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    # <tool_call> appears twice in the system prompt and once per call, always as one token.
    assert hf_tokenizer.encode(text).count(TOOL_CALL_START_ID) == 4


def test_mlx_generate(model_dir: Path) -> None:
    import mlx_lm
    model, tokenizer = mlx_lm.load(str(model_dir))
    assert tokenizer.eos_token_ids == {IM_END_ID}
    assert tokenizer.has_tool_calling  # json_tools parser inferred from the template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True
    )
    responses = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=4))
    assert 1 <= len(responses) <= 4
    assert all(0 <= r.token < 4096 for r in responses)


@pytest.mark.slow  # a real mlx prefill of ~3000 tokens: 20 s of CPU
def test_mlx_long_prompt_prefill(model_dir: Path) -> None:
    """A ~3000-token prompt prefills past position 2048 (mlx-lm prefills 2048-token chunks)."""
    import mlx_lm
    model, tokenizer = mlx_lm.load(str(model_dir))
    corpus = tiny_model.CORPUS_PATH.read_text()
    messages = [{"role": "user", "content": corpus[:12000]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert 2500 <= len(prompt) <= 4000
    responses = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=1))
    assert len(responses) == 1 and responses[0].prompt_tokens == len(prompt)


def test_ensure_model_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVROUTE_CACHE_DIR", str(tmp_path))
    path = ensure_model()
    assert path == tmp_path / MODEL_NAME
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model(tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_NAME]


def test_ensure_model_replaces_incomplete(tmp_path: Path, model_dir: Path) -> None:
    broken = tmp_path / MODEL_NAME
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    path = ensure_model(tmp_path)
    assert (path / "config.json").read_bytes() == (model_dir / "config.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_NAME]


def test_publish_lost_race(tmp_path: Path, model_dir: Path) -> None:
    final = tmp_path / MODEL_NAME
    final.mkdir()
    for name in MODEL_FILES:
        (final / name).write_bytes((model_dir / name).read_bytes())
    inode = final.stat().st_ino
    loser = make_model(tmp_path / "loser")
    tiny_model._publish(loser, final)  # must not raise: another process already published
    assert final.stat().st_ino == inode


def test_ensure_model_concurrent(tmp_path: Path, model_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from ops.models.tiny_model import ensure_model; "
        "print(ensure_model(Path(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert set(outputs) == {str(tmp_path / MODEL_NAME)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_NAME]
    for name in MODEL_FILES:
        assert (tmp_path / MODEL_NAME / name).read_bytes() == (model_dir / name).read_bytes()


def test_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "cli"), "--seed", "3"]) == 0
    assert (tmp_path / "cli" / "model.safetensors").is_file()
    assert "wrote" in capsys.readouterr().out
