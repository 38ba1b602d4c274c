"""``encode_prompt`` renders and tokenizes off the event loop (router.prompt.cache.off_loop).

No clocks: the tokenizer is made to wait for a coroutine on the same loop, which can only
run if the tokenizer is not holding the loop. Inline tokenization would deadlock; the wait
then gives up and the test fails.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from deploy.config import ModelConfig
from router.api.common.request import encode_prompt
from router.errors import ApiError
from router.prompt.cache import PromptCacheConfig
from router.prompt.template import ChatPrompt
from router.prompt.tokenizer import ChatTokenizer
from router.routing.target import Target


def _target(tok: ChatTokenizer) -> Target:
    """``tok`` as a request's resolved model (a 4,096-token window, no tenant)."""
    return Target("tiny", {"tiny": 1.0}, ModelConfig(name="tiny", model_path="."), tok, 4096,
                  256)


def _gated(tok: ChatTokenizer, gate: threading.Event, seen: list[bool],
           timeout_s: float = 10.0) -> None:
    real = tok.prompt_cache.encode

    def encode(text: str, *rest: Any) -> Any:
        seen.append(gate.wait(timeout=timeout_s))  # set by a coroutine on the event loop
        return real(text, *rest)

    tok.prompt_cache.encode = encode  # type: ignore[method-assign]


async def _encode_while_loop_sets(tok: ChatTokenizer, gate: threading.Event,
                                  prompt: ChatPrompt) -> list[int]:
    async def opener() -> None:
        await asyncio.sleep(0)
        gate.set()

    ids, _ = await asyncio.gather(encode_prompt(_target(tok), prompt), opener())
    return ids


def test_encode_prompt_leaves_the_loop_free(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig())
    gate, seen = threading.Event(), []
    _gated(tok, gate, seen)
    prompt = ChatPrompt([{"role": "user", "content": "a long cold prompt " * 2000}])
    ids = asyncio.run(_encode_while_loop_sets(tok, gate, prompt))
    assert seen == [True]  # the loop ran the opener while the tokenizer waited
    assert ids == tok.encode_full(tok.render(prompt.messages))


def test_inline_mode_holds_the_loop(tiny_model_dir: Path) -> None:
    """The control: with offloading off (the old behaviour) the same handshake fails."""
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(offload=False))
    gate, seen = threading.Event(), []
    _gated(tok, gate, seen, timeout_s=0.2)
    prompt = ChatPrompt([{"role": "user", "content": "hello"}])
    asyncio.run(_encode_while_loop_sets(tok, gate, prompt))
    assert seen == [False]  # the wait gave up: the loop could not run the opener


def test_template_errors_stay_400(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig())
    prompt = ChatPrompt([{"role": "user", "content": {"not": "text"}}])
    with pytest.raises(ApiError) as err:
        asyncio.run(encode_prompt(_target(tok), prompt))
    assert err.value.status == 400


def test_prefill_is_appended_after_the_template(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig())
    msgs = [{"role": "user", "content": "hi"}]
    ids = asyncio.run(encode_prompt(_target(tok), ChatPrompt(msgs, None, "Sure:")))
    assert ids == tok.encode_full(tok.render(msgs) + "Sure:")
