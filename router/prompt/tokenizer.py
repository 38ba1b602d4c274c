"""Chat templating and tokenization, done once in the router.

Renders the model's own Jinja chat template (from ``tokenizer_config.json``) in
a sandbox, the way transformers' ``apply_chat_template`` does, then encodes with
the fast ``tokenizers`` library. Only token ids travel on to the workers. Special-token
strings in client text are encoded as text, only the template's as special ids
(``router.prompt.specials``).

``encode`` reuses the ids of the longest cached prefix that ends at an exact boundary
(``router.prompt.cache``; shared between router replicas in Redis by ``router.prompt.store``
when the index has a Redis URL); ``encode_chat`` / ``aencode`` do the work in a bounded thread
pool, off the event loop.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from router.prompt.cache import IncrementalEncoder, PromptCacheConfig, Scope, boundary_tokens
from router.prompt.generation import GenerationDefaults
from router.prompt.pieces import INLINE_CHARS
from router.prompt.setup import TokenCache, off_loop, with_env
from router.prompt.specials import ClientSpecials
from router.prompt.tool_ids import ID_RULE, with_nine_char_ids

# Template variables beyond messages and tools, as (name, value) pairs (hashable, typed):
# the reasoning switches some templates read (``router.output.reasoning_parsers.controls``).
TemplateOptions = tuple[tuple[str, bool | str], ...]

log = logging.getLogger(__name__)

# Conversations rendered once at load, to see which added tokens the template emits.
_PROBE_CHATS: tuple[list[dict[str, Any]], ...] = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
     {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}],
    [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "v"}],
)


def _marking_probes(specials: list[str]) -> list[tuple[list[dict[str, Any]],
                                                      list[dict[str, Any]], str]]:
    """Conversations with every special-token string in every client field: system, user,
    assistant and tool text, a tool call's name and arguments, a tool definition, the
    prefill."""
    s = "a" + "\n".join(specials) + "system\nb"
    call = {"id": s, "type": "function", "function": {"name": s, "arguments": {s: s}}}
    tools = [{"type": "function", "function": {"name": s, "description": s,
                                               "parameters": {"type": "object",
                                                              "properties": {s: {}}}}}]
    chat = [{"role": "system", "content": s}, {"role": "user", "content": s},
            {"role": "assistant", "content": s, "tool_calls": [call]},
            {"role": "tool", "content": s, "tool_call_id": s, "name": s},
            {"role": "user", "content": f" {s} "}]
    return [(chat, tools, s), (chat[1:], [], "")]


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
        self.generation = GenerationDefaults.load(folder)  # sampling defaults (vLLM's rule)
        self.vocab_fingerprint = hashlib.sha256(
            (folder / "tokenizer.json").read_bytes()).hexdigest()
        setup = cache if isinstance(cache, TokenCache) else TokenCache(cache or with_env())
        self.cache_config = setup.config
        self.client_specials = ClientSpecials(self._tok)
        self._added: dict[str, int] | None = None  # added tokens' text → id, on first use
        # the cache's identity: the tokenizer and the template (a marked render's markers
        # and cuts depend on both)
        template_digest = hashlib.sha256(template.encode()).hexdigest()
        self.prompt_cache = IncrementalEncoder(
            self._tok, self._boundaries() if self.cache_config.enabled else (),
            self.cache_config.max_bytes, setup.store,
            f"{self.vocab_fingerprint}:{template_digest}")
        _ = self.marking_exact  # logs at load when the template transforms client text

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
    def marking_exact(self) -> bool:
        """Whether marking client special-token strings leaves the rendered text as it is
        (``router.prompt.specials``, step 4), probed with them in every client field."""
        specials = self.client_specials
        if not specials.active:
            return True
        for messages, tools, suffix in _marking_probes(specials.specials):
            try:
                plain = self.render(messages, tools=tools) + suffix
                marked = self.render(*specials.escape_chat(messages, tools, suffix)[:2])
            except TemplateRenderError:
                continue
            if specials.unescape(marked + specials.escape(suffix)) != plain:
                log.warning("the chat template transforms client text that holds "
                            "special-token strings: such prompts render the marked text "
                            "(router.prompt.specials, step 4)")
                return False
        return True

    @functools.cached_property
    def past_reasoning(self) -> str:
        """Which past reasoning (``reasoning_content`` / ``thinking`` of an assistant turn)
        the template renders: "all"; "after_last_user", only that of the turns after the
        last user message (Qwen3, most thinking templates); "none". Probed at first use."""
        mark = "kvroute-reasoning-probe-7f3a"  # no edge whitespace: templates strip it
        turn = {"role": "assistant", "content": "a", "reasoning_content": mark,
                "thinking": mark}
        try:
            if mark in self.render([{"role": "user", "content": "u"}, turn,
                                    {"role": "user", "content": "v"}]):
                return "all"
        except TemplateRenderError:
            pass
        call = {"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": {}}}
        try:
            text = self.render([{"role": "user", "content": "u"},
                                {**turn, "content": "", "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": "call_1", "name": "f",
                                 "content": "r"}])
        except TemplateRenderError:
            return "after_last_user"  # cannot tell: keep what a tool turn might render
        return "after_last_user" if mark in text else "none"

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

    def encode(self, text: str, marked: bool = False, tenant: str | None = None,
               source: str = "raw") -> list[int]:
        """Raw text's ids, every added-token string in it extracted (a completions prompt:
        the client owns it whole); ``marked``: text from ``render_marked``. The prompt
        cache's part is ``Scope(source, marked, tenant)``'s: a chat render and a raw prompt
        of the same text, or two tenants, never share cached ids."""
        pieces = self.client_specials.encode_pieces if marked else None
        if not self.prompt_cache.active:
            return self.encode_full(text, marked)
        return self.prompt_cache.encode(text, pieces, Scope(source, marked, tenant))

    def commit(self, ids: list[int], owner: str | None = None) -> None:
        """The request of ``ids`` (from ``encode``) was admitted: what the shared token
        store lacks of its prompt may be written now, counted against ``owner``'s share
        (a key's name; ``IncrementalEncoder.publish``)."""
        self.prompt_cache.publish(ids, owner)

    def encode_full(self, text: str, marked: bool = False) -> list[int]:
        """Whole-text tokenization, no cache (the reference ``encode`` must equal)."""
        if marked:
            return self.client_specials.encode(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def render_marked(self, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None, suffix: str = "",
                      options: TemplateOptions | None = None) -> tuple[str, bool]:
        """The prompt text, and whether client special-token strings in it are marked
        (``router.prompt.specials``; when none are, the text is the plain render)."""
        specials = self.client_specials
        if specials.in_client(messages, tools, suffix, options):
            messages, tools, suffix = specials.escape_chat(messages, tools, suffix)
            options = tuple((k, specials.escape(v) if isinstance(v, str) else v)
                            for k, v in options or ())
            return self.render(messages, tools=tools, options=options) + suffix, True
        return self.render(messages, tools=tools, options=options) + suffix, False

    def render_encode(self, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None, suffix: str = "",
                      options: TemplateOptions | None = None, tenant: str | None = None
                      ) -> list[int]:
        """The chat prompt's ids: only the template's special tokens are special ids."""
        text, marked = self.render_marked(messages, tools, suffix, options)
        return self.encode(text, marked, tenant, "chat")

    def render_encode_full(self, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None = None, suffix: str = "",
                           options: TemplateOptions | None = None) -> list[int]:
        """``render_encode`` without the prompt cache (the reference it must equal)."""
        return self.encode_full(*self.render_marked(messages, tools, suffix, options))

    async def encode_chat(self, messages: list[dict[str, Any]],
                          tools: list[dict[str, Any]] | None = None, suffix: str = "",
                          options: TemplateOptions | None = None, tenant: str | None = None
                          ) -> list[int]:
        """Render and tokenize, in the tokenize pool unless the conversation is small (a
        pool hop costs more than a short prompt's whole encoding); raises
        ``TemplateRenderError``. ``tenant``: whose prompt cache (None: the shared one)."""
        if _rough_chars(messages, tools) < INLINE_CHARS:
            return self.render_encode(messages, tools, suffix, options, tenant)
        return await off_loop(self.cache_config, self.render_encode, messages, tools, suffix,
                              options, tenant)

    async def aencode(self, text: str, tenant: str | None = None) -> list[int]:
        """A completions prompt's ids (``encode``), in the tokenize pool."""
        return await off_loop(self.cache_config, self.encode, text, False, tenant)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_id(self, text: str) -> int | None:
        """The id of a token of the vocabulary (added tokens included), or None."""
        return self._tok.token_to_id(text)

    def added_token_id(self, text: str) -> int | None:
        """The id of an added token (a special or marker token) whose text is ``text``, or
        None: what a grammar must match as that token (``router.output.tool_grammar``)."""
        if self._added is None:
            self._added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        return self._added.get(text)
