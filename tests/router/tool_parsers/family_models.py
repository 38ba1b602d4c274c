"""Model folders for each tool-call family: the tiny model with that family's public chat
template in its tokenizer_config.json; its tokenizer (byte-level BPE) writes any family's
markup, so a sim engine can reply in it. The templates ``make-model --family`` ships are in
ops/chat_templates; the test-only ones (Llama 3.1's licence, V3.2, ...) in tests/chat_templates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ops.tiny_families import TEMPLATES_DIR

TEST_TEMPLATES = Path(__file__).parents[2] / "chat_templates"
# family → its template file (the first of a family's templates in test_detection).
TEMPLATE_OF = {
    "hermes": "Qwen-Qwen3-0.6B.jinja",
    "qwen3-coder": "Qwen3-Coder.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
    "deepseek-v3.1": "deepseek-ai-DeepSeek-V3.1.jinja",
    "deepseek-v3.2": "deepseek-ai-DeepSeek-V3.2.jinja",
    "glm-4.5": "GLM-4.6.jinja",
    "kimi-k2": "moonshotai-Kimi-K2.jinja",
    "minimax-m2": "MiniMax-M2.jinja",
    "mistral": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "llama3-json": "meta-llama-Llama-3.1-8B-Instruct.jinja",
}


def template_path(name: str) -> Path:
    """A template file by name: shipped with make-model, else test-only."""
    shipped = TEMPLATES_DIR / name
    return shipped if shipped.is_file() else TEST_TEMPLATES / name


def family_model_dir(tiny: Path, family: str, dest: Path) -> Path:
    """A copy of the tiny model folder at ``dest`` whose chat template is ``family``'s."""
    return template_model_dir(tiny, TEMPLATE_OF[family], dest)


def template_model_dir(tiny: Path, template: str, dest: Path) -> Path:
    """A copy of the tiny model folder at ``dest`` with ``template`` (a file here)."""
    if not (dest / "tokenizer_config.json").exists():
        shutil.copytree(tiny, dest, dirs_exist_ok=True)
        cfg_path = dest / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = template_path(template).read_text()
        cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2))
    return dest
