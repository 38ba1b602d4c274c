"""What every API hands the chat template: ``ChatPrompt``, with the system messages placed
where every template can take them and per-request volatile lines dropped, so turn N+1
renders turn N's prompt unchanged as its prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from router.prompt.tokenizer import TemplateOptions

_HEADER_LINE = re.compile(r"[ \t]*x-anthropic-[a-z0-9-]+:[^\n]*(\n|$)", re.IGNORECASE)


_BLANK_LINE = re.compile(r"[ \t]*\n")


def strip_volatile(text: str) -> str:
    """Drop leading ``x-anthropic-…: …`` header lines (per-request billing nonces),
    blank lines between them included, so stripping twice changes nothing more."""
    pos = 0
    while True:
        probe = pos
        while (blank := _BLANK_LINE.match(text, probe)) and blank.end() > probe:
            probe = blank.end()
        m = _HEADER_LINE.match(text, probe)
        if m is None or m.end() == probe:
            break
        pos = m.end()
    return text[pos:].lstrip("\n") if pos else text


def place_system(messages: list[dict[str, Any]], in_place: bool) -> list[dict[str, Any]]:
    """System messages where every template can take them, without moving the prefix.

    The leading ones become one system message (joined with a blank line). A later one
    (Claude Code's environment block, a Codex developer message) stays where it is when
    the template renders system messages in place (``in_place``); otherwise it becomes
    user text, merged into a neighbouring user message so roles still alternate. Either
    way turn N+1 renders turn N's prompt unchanged as its prefix.
    """
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    out: list[dict[str, Any]] = []
    if lead:
        texts = [str(m["content"]) for m in messages[:lead] if m["content"]]
        out.append({"role": "system", "content": "\n\n".join(texts)})
    for msg in messages[lead:]:
        if msg["role"] != "system" or in_place:
            out.append(msg)
        elif out and out[-1]["role"] == "user":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{msg['content']}"}
        else:
            out.append({"role": "user", "content": msg["content"]})
    return out


@dataclass(slots=True)
class ChatPrompt:
    """What the chat template gets: messages, tools, and an assistant prefill."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    prefill: str | None = None
    options: TemplateOptions = ()  # template variables (reasoning switches)
