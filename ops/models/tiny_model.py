"""Tiny random-weight Llama model for demos and tests.

``make_model(dir)`` writes a ~18 MB Llama-architecture checkpoint (float32, random weights)
with a byte-level BPE tokenizer trained on ``tiny_corpus.txt`` and a Qwen2.5-style ChatML
chat template with tool calling. The output is a plain Hugging Face folder that mlx-lm,
vLLM and transformers load. Output is byte-for-byte deterministic for a given seed.
``make_model(dir, family=F)`` swaps in family F's public chat template and special tokens
(``tiny_families.py``). ``ensure_model()`` builds a model once into a shared cache folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from ops.models.tiny_families import DEFAULT_FAMILY, FAMILIES, FAMILY_NAMES, Family

MODEL_NAME = "tiny-llama-v1"
VOCAB_SIZE = 4096
HIDDEN_SIZE = 256
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE_SIZE = 512
MAX_POSITIONS = 32768
INIT_STD = 0.02

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TOOL_TOKENS = (TOOL_CALL_START, TOOL_CALL_END)
# The BPE trainer puts its special tokens first, in order: these ids are fixed.
ENDOFTEXT_ID, IM_START_ID, IM_END_ID, TOOL_CALL_START_ID, TOOL_CALL_END_ID = range(5)

CORPUS_PATH = Path(__file__).with_name("tiny_corpus.txt")
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)

# Qwen2-style pre-tokenizer split: words with one leading symbol/space, single digits, etc.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = r"""{%- if messages and messages[0].role == 'system' %}
    {%- set system_message = messages[0].content or '' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = 'You are a helpful assistant.' %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system_message }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to help with the user query.' }}
    {{- '\n\nThe function signatures are listed within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a JSON object with the function name' }}
    {{- ' and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in loop_messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop_messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + (message.content or '') + '\n</tool_response>' }}
        {%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def model_config(vocab_size: int = VOCAB_SIZE, bos_id: int = ENDOFTEXT_ID,
                 eos_id: int | list[int] = IM_END_ID) -> dict[str, Any]:
    """The Hugging Face ``config.json`` contents."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def _weight_shapes(vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of every tensor, in the fixed order they are drawn from the RNG."""
    q_out, kv_out = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (vocab, HIDDEN_SIZE))
    ]
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.input_layernorm.weight", (HIDDEN_SIZE,)),
            (f"{p}.self_attn.q_proj.weight", (q_out, HIDDEN_SIZE)),
            (f"{p}.self_attn.k_proj.weight", (kv_out, HIDDEN_SIZE)),
            (f"{p}.self_attn.v_proj.weight", (kv_out, HIDDEN_SIZE)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN_SIZE, q_out)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN_SIZE,)),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE_SIZE, HIDDEN_SIZE)),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE_SIZE, HIDDEN_SIZE)),
            (f"{p}.mlp.down_proj.weight", (HIDDEN_SIZE, INTERMEDIATE_SIZE)),
        ]
    shapes += [("model.norm.weight", (HIDDEN_SIZE,)), ("lm_head.weight", (vocab, HIDDEN_SIZE))]
    return shapes


def make_weights(seed: int = 0, vocab_size: int = VOCAB_SIZE) -> dict[str, np.ndarray]:
    """Random float32 weights: matrices ~ N(0, 0.02), norm scales = 1."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in _weight_shapes(vocab_size):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
    return weights


def build_tokenizer(corpus: str | None = None) -> Tokenizer:
    """Train a byte-level BPE with exactly ``VOCAB_SIZE`` tokens (deterministic).

    The corpus is weighted 3:1 against an upper-cased copy so that ordinary text wins
    the merges and the upper-cased words supply enough pairs to fill the vocabulary.
    """
    text = CORPUS_PATH.read_text(encoding="utf-8") if corpus is None else corpus
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=0,
        special_tokens=[*SPECIAL_TOKENS, *TOOL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text, text, text, text.upper()], trainer=trainer)
    # Like Qwen2.5, the tool-call markers are added tokens but not "special" ones, so
    # decoding with skip_special_tokens=True keeps them for tool-call parsers.
    data = json.loads(tokenizer.to_str())
    for token in data["added_tokens"]:
        token["special"] = token["content"] in SPECIAL_TOKENS
    tokenizer = Tokenizer.from_str(json.dumps(data))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {size} tokens, expected {VOCAB_SIZE}: corpus too small")
    return tokenizer


def _added_token(content: str, special: bool) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def tokenizer_config() -> dict[str, Any]:
    """The ``tokenizer_config.json`` contents (Qwen2.5-like, no BOS token)."""
    ids = {ENDOFTEXT_ID: ENDOFTEXT, IM_START_ID: IM_START, IM_END_ID: IM_END}
    ids |= {TOOL_CALL_START_ID: TOOL_CALL_START, TOOL_CALL_END_ID: TOOL_CALL_END}
    return {
        "added_tokens_decoder": {
            str(i): _added_token(tok, tok in SPECIAL_TOKENS) for i, tok in sorted(ids.items())
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _special_tokens_map() -> dict[str, Any]:
    return {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": _added_token(IM_END, True),
        "pad_token": _added_token(ENDOFTEXT, True),
    }


def _generation_config() -> dict[str, Any]:
    return {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": IM_END_ID, "pad_token_id": ENDOFTEXT_ID}


def _family_tokenizer(fam: Family) -> Tokenizer:
    """The tiny BPE plus ``fam``'s tokens (each one id); control tokens are special."""
    tokenizer = build_tokenizer()
    new = [t for t in fam.tokens() if tokenizer.token_to_id(t) is None]
    plain = set(fam.markers)
    for t in new:  # one at a time so ids follow fam.tokens()' fixed order
        token = AddedToken(t, special=t not in plain, normalized=False)
        (tokenizer.add_tokens if t in plain else tokenizer.add_special_tokens)([token])
    return tokenizer


def _family_files(fam: Family, tokenizer: Tokenizer) -> dict[str, dict[str, Any]]:
    """``fam``'s JSON files: its template, bos/eos, and a vocab covering every added token."""
    data = json.loads(tokenizer.to_str())
    ids = tokenizer.token_to_id
    vocab = -(-tokenizer.get_vocab_size(with_added_tokens=True) // 64) * 64  # mlx-friendly
    eos: int | list[int] = [ids(t) for t in (fam.eos, *fam.stops)] if fam.stops else ids(fam.eos)
    bos = ids(fam.bos) if fam.bos else None
    extra = [t for t in (*fam.control, *fam.stops) if t not in (fam.eos, fam.bos)]
    tok_cfg = tokenizer_config() | {
        "added_tokens_decoder": {
            str(t["id"]): _added_token(t["content"], t["special"]) for t in data["added_tokens"]
        },
        "additional_special_tokens": extra,
        "bos_token": fam.bos,
        "chat_template": fam.template_text(),
        "eos_token": fam.eos,
    }
    bos_map = {"bos_token": _added_token(fam.bos, True)} if fam.bos else {}
    return {
        "tokenizer.json": data,
        "tokenizer_config.json": tok_cfg,
        "special_tokens_map.json": _special_tokens_map() | bos_map | {
            "additional_special_tokens": extra, "eos_token": _added_token(fam.eos, True)},
        "config.json": model_config(vocab, ENDOFTEXT_ID if bos is None else bos, eos),
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos,
                                   "pad_token_id": ENDOFTEXT_ID},
    }


def _default_files() -> dict[str, dict[str, Any]]:
    return {
        "tokenizer.json": json.loads(build_tokenizer().to_str()),
        "tokenizer_config.json": tokenizer_config(),
        "special_tokens_map.json": _special_tokens_map(),
        "config.json": model_config(),
        "generation_config.json": _generation_config(),
    }


def make_model(out_dir: str | Path, seed: int = 0, family: str | None = None) -> Path:
    """Write the tiny model (weights, config, tokenizer) into ``out_dir`` and return it.

    ``family`` (one of ``FAMILY_NAMES``; None is the default ChatML model) gives it that
    family's chat template and special tokens."""
    if family not in (None, DEFAULT_FAMILY, *FAMILIES):
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILY_NAMES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fam = FAMILIES.get(family or "")
    files = _family_files(fam, _family_tokenizer(fam)) if fam else _default_files()
    for name, data in files.items():
        _write_json(out / name, data)
    weights_path = out / "model.safetensors"
    vocab = files["config.json"]["vocab_size"]
    save_file(make_weights(seed, vocab), str(weights_path), metadata={"format": "pt"})
    os.chmod(weights_path, 0o644)  # safetensors creates it owner-only
    return out


def default_cache_dir() -> Path:
    """``$KVROUTE_CACHE_DIR`` if set, else ``~/.cache/kvroute``."""
    env = os.environ.get("KVROUTE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvroute"


def is_complete(model_dir: Path) -> bool:
    """True if ``model_dir`` holds every file ``make_model`` writes."""
    return all((model_dir / name).is_file() for name in MODEL_FILES)


def _publish(tmp: Path, final: Path) -> None:
    """Atomically rename ``tmp`` to ``final``; losing a race to another process is fine."""
    try:
        os.rename(tmp, final)
        return
    except OSError:
        if is_complete(final):
            return  # another process published first
    # ``final`` exists but is incomplete (e.g. hand-made): move it aside, then retry once.
    stale = final.with_name(f".{final.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(final, stale)
    except OSError:
        pass
    shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if not is_complete(final):
            raise


def ensure_model(cache_dir: Path | None = None, family: str | None = None) -> Path:
    """Return the demo model folder (``family``'s if given), generating it on first use.

    Generation happens in a private temp folder that is renamed into place, so
    concurrent callers (several processes or Ray workers) never see a partial model.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = MODEL_NAME if family in (None, DEFAULT_FAMILY) else f"{MODEL_NAME}-{family}"
    final = root / name
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        make_model(tmp, seed=0, family=family)
        os.chmod(tmp, 0o755)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def add_family_arg(parser: argparse.ArgumentParser) -> None:
    """The ``--family`` option (shared by this module's CLI and ``kvroute make-model``)."""
    parser.add_argument(
        "--family", choices=FAMILY_NAMES, default=DEFAULT_FAMILY,
        help="chat template and special tokens of this model family "
        f"(default {DEFAULT_FAMILY}: ChatML with hermes tool calls)",
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: ``make-model DIR [--seed N] [--family F]``."""
    parser = argparse.ArgumentParser(prog="make-model", description=__doc__.splitlines()[0])
    parser.add_argument("dir", metavar="DIR", type=Path, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="weight RNG seed (default 0)")
    add_family_arg(parser)
    args = parser.parse_args(argv)
    out = make_model(args.dir, seed=args.seed, family=args.family)
    total = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({total / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
