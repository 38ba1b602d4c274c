from pathlib import Path

import pytest

from router.prompt.tokenizer import ChatTokenizer, TemplateRenderError


def test_matches_transformers_chat_template(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ours = ChatTokenizer(str(tiny_model_dir))
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    for msgs, t in [
        ([{"role": "user", "content": "hi"}], None),
        ([{"role": "system", "content": "sys"}, {"role": "user", "content": "x"},
          {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}], tools),
    ]:
        expected = hf.apply_chat_template(msgs, tools=t, tokenize=False,
                                          add_generation_prompt=True)
        assert ours.render(msgs, tools=t) == expected
        assert ours.encode(expected) == hf.encode(expected, add_special_tokens=False)


def test_template_errors_are_typed(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir))
    with pytest.raises(TemplateRenderError):
        tok.render([{"role": "user", "content": {"not": "text"}}])  # type: ignore[dict-item]
