"""Chat templating and tokenization, done once in the router.

Renders the model's own Jinja chat template (from ``tokenizer_config.json``) in
a sandbox, the way transformers' ``apply_chat_template`` does, then encodes with
the fast ``tokenizers`` library. Only token ids travel on to the workers.

``encode`` reuses the ids of the longest cached prefix that ends at an exact boundary
(``router.prompt_cache``; shared between router replicas in Redis by ``router.token_store``
when the index has a Redis URL); ``encode_chat`` / ``aencode`` do the work in a bounded thread
pool, off the event loop.
"""

from __future__ import annotations

import functools
import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from router.prompt_cache import IncrementalEncoder, PromptCacheConfig, boundary_tokens
from router.tokenize_setup import TokenCache, off_loop, with_env
from router.tool_parsers.mistral import ID_RULE, with_nine_char_ids

# Template variables beyond messages and tools, as (name, value) pairs (hashable, typed):
# the reasoning switches some templates read (``router.reasoning_parsers.controls``).
TemplateOptions = tuple[tuple[str, bool | str], ...]

# Conversations rendered once at load, to see which added tokens the template emits.
_PROBE_CHATS: tuple[list[dict[str, Any]], ...] = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
     {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}],
    [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "v"}],
)


class TemplateRenderError(ValueError):
    """The conversation cannot be rendered with this model's chat template."""


def _raise(message: str) -> None:
    raise TemplateRenderError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def resolve_model_dir(model_path: str) -> Path:
    """A local folder as is; a hub id from the local Hugging Face cache only."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path, allow_patterns=["*.json", "*.jinja", "*.txt"]))


# Below this much text (~2k tokens, ~3 ms cold) a conversation is encoded on the event loop.
INLINE_CHARS = 8192


def _rough_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A cheap upper-ish estimate of the rendered size: message texts plus ~2k per tool."""
    size = sum(len(c) if isinstance(c := m.get("content"), str) else INLINE_CHARS
               for m in messages)
    return size + 2048 * len(tools or ())


class ChatTokenizer:
    def __init__(self, model_path: str, cache: PromptCacheConfig | TokenCache | None = None
                 ) -> None:
        folder = resolve_model_dir(model_path)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        if not template:
            raise ValueError(f"{folder} has no chat template")
        # As transformers' apply_chat_template: loop controls ({% break %}: Kimi-K2-Thinking).
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template_source: str = template
        self._nine_char_ids = ID_RULE in template
        self._template = env.from_string(template)
        self._specials = {
            "bos_token": _token_text(cfg.get("bos_token")) or "",
            "eos_token": _token_text(cfg.get("eos_token")) or "",
        }
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.vocab_fingerprint = hashlib.sha256(
            (folder / "tokenizer.json").read_bytes()).hexdigest()
        setup = cache if isinstance(cache, TokenCache) else TokenCache(cache or with_env())
        self.cache_config = setup.config
        self.prompt_cache = IncrementalEncoder(
            self._tok, self._boundaries() if self.cache_config.enabled else (),
            self.cache_config.max_bytes, setup.store, self.vocab_fingerprint)

    def _boundaries(self) -> tuple[str, ...]:
        rendered = []
        for chat in _PROBE_CHATS:
            try:
                rendered.append(self.render(chat))
            except TemplateRenderError:
                continue
        return boundary_tokens(self._tok, rendered)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        options: TemplateOptions | None = None,
    ) -> str:
        """``options``: variables some templates read (``enable_thinking``, ...)."""
        if self._nine_char_ids:  # Mistral's templates raise on other ids (clients send any)
            messages = with_nine_char_ids(messages)
        try:
            return self._template.render(
                messages=messages, tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **dict(options or ()), **self._specials,
            )
        except TemplateRenderError:
            raise
        except (TemplateError, TypeError, KeyError, ValueError) as e:
            raise TemplateRenderError(f"cannot render the conversation: {e}") from e

    @functools.cached_property
    def system_in_place(self) -> bool:
        """Whether the template renders a system message after the first turn where it
        stands (Qwen, Llama 3 do; some templates raise or drop it)."""
        first, probe = "\x1fkvroute-first\x1f", "\x1fkvroute-probe\x1f"
        try:
            text = self.render([{"role": "user", "content": first},
                                {"role": "system", "content": probe},
                                {"role": "user", "content": "b"}])
        except TemplateRenderError:
            return False
        return probe in text and text.index(probe) > text.index(first)

    def encode(self, text: str) -> list[int]:
        # The template already placed every special token it wants.
        if not self.prompt_cache.active:
            return self.encode_full(text)
        return self.prompt_cache.encode(text)

    def encode_full(self, text: str) -> list[int]:
        """Whole-text tokenization, no cache (the reference ``encode`` must equal)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def render_encode(self, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None, suffix: str = "",
                      options: TemplateOptions | None = None) -> list[int]:
        return self.encode(self.render(messages, tools=tools, options=options) + suffix)

    async def encode_chat(self, messages: list[dict[str, Any]],
                          tools: list[dict[str, Any]] | None = None, suffix: str = "",
                          options: TemplateOptions | None = None) -> list[int]:
        """Render and tokenize, in the tokenize pool unless the conversation is small (a
        pool hop costs more than a short prompt's whole encoding); raises
        ``TemplateRenderError``."""
        if _rough_chars(messages, tools) < INLINE_CHARS:
            return self.render_encode(messages, tools, suffix, options)
        return await off_loop(self.cache_config, self.render_encode, messages, tools, suffix,
                              options)

    async def aencode(self, text: str) -> list[int]:
        return await off_loop(self.cache_config, self.encode, text)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_id(self, text: str) -> int | None:
        """The id of a token of the vocabulary (added tokens included), or None."""
        return self._tok.token_to_id(text)
