"""Model folders for each tool-call family: the tiny model with that family's public chat
template in its tokenizer_config.json; its tokenizer (byte-level BPE) writes any family's
markup, so a sim engine can reply in it. The templates ``make-model --family`` ships are in
ops/chat_templates; the test-only ones (Llama 3.1's licence, V3.2, ...) in tests/chat_templates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ops.models.tiny_families import FAMILIES, TEMPLATES_DIR
from ops.models.tiny_model import ensure_model

TEST_TEMPLATES = Path(__file__).parents[3] / "chat_templates"
# Parser family → the make-model family built for it (``ops/models/tiny_families.py``): the
# same names, but Qwen3's tool calls are the hermes parser's.
BUILT_AS = {("hermes" if name == "qwen3" else name): name for name in FAMILIES}
# family → its template file (the first of a family's templates in test_detection); the
# built families' come from ops/models/tiny_families, the rest are test-only templates.
TEMPLATE_OF = {family: FAMILIES[built].template for family, built in BUILT_AS.items()} | {
    "deepseek-v3.2": "deepseek-ai-DeepSeek-V3.2.jinja",
    "llama3-json": "meta-llama-Llama-3.1-8B-Instruct.jinja",
}


def template_path(name: str) -> Path:
    """A template file by name: shipped with make-model, else test-only."""
    shipped = TEMPLATES_DIR / name
    return shipped if shipped.is_file() else TEST_TEMPLATES / name


def family_model_dir(tiny: Path, family: str, dest: Path) -> Path:
    """A model folder with ``family``'s chat template: ``make-model --family``'s (with the
    family's special tokens; cached beside ``tiny``), else a copy of ``tiny`` at ``dest``
    with the test-only template swapped in."""
    if family in BUILT_AS:
        return ensure_model(tiny.parent, family=BUILT_AS[family])
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
