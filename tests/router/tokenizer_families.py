"""Tokenizers shaped like other model families, built offline from the tiny corpus.

No real checkpoints of other families are on this machine (and tests download nothing),
so these reproduce the parts of their tokenizer.json files that decide whether a cut after
a special token is exact: Llama 3's pre-tokenizer regex, special tokens and chat template;
a SentencePiece-style Metaspace with ``prepend_scheme: first`` (Llama 2 / Mistral
conversions); an extra added token that overlaps a boundary marker.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from ops.models.tiny_model import CORPUS_PATH

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|python_tag|>"]
# Meta's Llama 3 Instruct template (without the tool-calling branch).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    text = CORPUS_PATH.read_text(encoding="utf-8")
    return [text, text.upper()]


def llama3_like_dir(tmp: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=LLAMA3_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    out = tmp / "llama3-like"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "chat_template": LLAMA3_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def metaspace_first(tmp: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["[INST]", "[/INST]"],
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def with_added(model_dir: Path, content: str) -> Tokenizer:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(content, normalized=False, special=True)])
    return tok
