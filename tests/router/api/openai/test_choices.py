"""OpenAI's choices: a choice's chunks byte for byte the dict path's, with its index;
``continuous_usage_stats``' usage on every chunk; batched prompts split one per prompt;
``best_of`` and too many choices refused naming the field."""

from __future__ import annotations

import json

import pytest

from router.api.openai import choices as ch
from router.api.openai.encode import chat_chunk, sse, text_chunk
from router.api.openai.schema import CompletionRequest
from router.errors import ApiError


@pytest.mark.parametrize("chat", [True, False])
def test_a_choices_text_chunk_is_the_dict_paths_with_its_index(chat: bool) -> None:
    enc = ch.ChoiceEncoder("cmpl-1", "m", chat, "fp_1", index=3)
    want = chat_chunk("cmpl-1", "m", {"content": "a\"b"}, None, enc.created, "fp_1") if chat \
        else text_chunk("cmpl-1", "m", "a\"b", None, enc.created, "fp_1")
    want["choices"][0]["index"] = 3
    assert enc.text("a\"b") == sse(want)
    end = json.loads(enc.delta({}, "stop").decode().removeprefix("data: "))
    assert end["choices"][0]["index"] == 3 and end["choices"][0]["finish_reason"] == "stop"


def test_continuous_usage_rides_on_every_chunk() -> None:
    done = [0]
    enc = ch.ChoiceEncoder("chatcmpl-1", "m", True, None, live=lambda: (5, done[0]))
    first = json.loads(enc.delta({"role": "assistant", "content": ""}).decode()[6:])
    done[0] = 2
    second = json.loads(enc.text("hi").decode()[6:])
    assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    assert second["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert second["choices"][0]["delta"] == {"content": "hi"}


@pytest.mark.parametrize(("prompt", "split"), [
    ("hi", ["hi"]), ([1, 2], [[1, 2]]), (["a", "b"], ["a", "b"]),
    ([[1], [2, 3]], [[1], [2, 3]]), ([[4, 5]], [[4, 5]]),
])
def test_a_batched_prompt_is_one_request_per_prompt(prompt: object, split: list) -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": prompt, "n": 2})
    parts = ch.one_per_prompt(req)
    assert [p.prompt for p in parts] == split
    assert all(p.copies() == 2 and p.model == "m" for p in parts)


def test_n_null_is_one() -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": None}).copies() == 1


@pytest.mark.parametrize(("body", "param"), [
    ({"best_of": 2}, "best_of"), ({"best_of": 3, "n": 2}, "best_of"),
    ({"prompt": ["a"] * 43, "n": 3}, "prompt"),
])
def test_choices_kvroute_does_not_serve_are_a_400_naming_the_field(body: dict, param: str
                                                                     ) -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", **body})
    with pytest.raises(ApiError) as e:
        ch.check_choices(req)
    assert e.value.status == 400 and e.value.param == param


def test_best_of_equal_to_n_is_served() -> None:
    ch.check_choices(CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "n": 2, "best_of": 2}))
