"""Scripted replies for the ``sim`` engine emulator, chosen from the prompt.

They let tests drive real agent CLIs (Claude Code, Codex) through a real stack: the
first reply is a tool call in the model's own format, the reply to the tool's result
is plain text. Configured with ``engine_kwargs: {script_path: <file>}``; the file is
JSON::

    {"segment_marker": "<|im_start|>user",
     "rules": [{"match": "<tool_response>", "reply": "All done."},
               {"match": "TOOLTEST", "reply": "<tool_call>\\n{...}\\n</tool_call>"}]}

For each request the prompt's token ids are decoded with the model's tokenizer
(``tokenizer.json`` under the ModelConfig's ``model_path``), special tokens kept. The
text after the LAST ``segment_marker`` (the whole prompt if the marker is absent from
it, or if ``segment_marker`` is null or left out) is searched (``re.search``) with each
rule's ``match`` in order, and the whole prompt with its ``requires`` (if any); the first
rule that matches gives the completion (its ``reply``). No match:
the emulator's usual deterministic tokens.

A reply is tokenized once, at load, without added special tokens; it must decode back
to itself. It is generated token by token with the emulator's timing and ends with
finish_reason "stop" (or "length" if ``max_tokens`` is smaller), also under
``ignore_eos``. Each token's text is precomputed by incremental decoding (the text of
``ids[:k+1]`` minus that of ``ids[:k]``; incomplete UTF-8 is held back to a later token).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tokenizers import Tokenizer

_INCOMPLETE = "\ufffd"  # what the decoder gives for a partial UTF-8 sequence


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: str = Field(description="Regex searched (re.search) in the prompt's last segment.")
    reply: str = Field(description="The completion text when it matches.")
    requires: str | None = Field(
        None, description="Regex that must also match somewhere in the whole prompt (a "
        "tool's definition, say: one rule per client's own tool name).")

    @field_validator("match", "requires")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"bad regex {v!r}: {e}") from e
        return v


class ScriptFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    segment_marker: str | None = Field(
        None, description="Only the text after its last occurrence is matched."
    )
    rules: list[ScriptRule] = Field(min_length=1, description="Checked in order.")


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]  # the text each token adds (the last one carries any rest)


def incremental_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[str, ...]:
    """Per-token text, as a streaming detokenizer gives it; joined, it is decode(ids)."""
    pieces: list[str] = []
    emitted = ""
    for k in range(len(ids)):
        full = tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=False)
        last = k == len(ids) - 1
        if (full.endswith(_INCOMPLETE) and not last) or not full.startswith(emitted):
            pieces.append("")  # wait for the rest of the character
            continue
        pieces.append(full[len(emitted):])
        emitted = full
    return tuple(pieces)


class SimScript:
    """A loaded script: compiled rules, their tokenized replies, and the tokenizer."""

    def __init__(self, spec: ScriptFile, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._marker = spec.segment_marker or None
        self._rules: list[tuple[re.Pattern[str], re.Pattern[str] | None, ScriptedReply]] = []
        for rule in spec.rules:
            ids = tokenizer.encode(rule.reply, add_special_tokens=False).ids
            reply = ScriptedReply(tuple(ids), incremental_pieces(tokenizer, ids))
            if "".join(reply.pieces) != rule.reply:
                raise ValueError(
                    f"reply {rule.reply!r} does not survive the tokenizer (decodes to "
                    f"{''.join(reply.pieces)!r})"
                )
            needs = re.compile(rule.requires) if rule.requires is not None else None
            self._rules.append((re.compile(rule.match), needs, reply))

    @classmethod
    def load(cls, path: str, model_path: str) -> SimScript:
        """The script at ``path`` with ``model_path``'s tokenizer; ValueError naming the file."""
        try:
            spec = ScriptFile.model_validate(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, ValidationError) as e:
            raise ValueError(f"sim script {path}: {e}") from e
        try:
            tok = Tokenizer.from_file(str(Path(model_path).expanduser() / "tokenizer.json"))
        except Exception as e:  # the tokenizers library raises bare Exceptions
            raise ValueError(f"sim script {path}: no tokenizer for {model_path!r}: {e}") from e
        try:
            return cls(spec, tok)
        except ValueError as e:
            raise ValueError(f"sim script {path}: {e}") from e

    def reply_for(self, prompt_ids: Sequence[int]) -> ScriptedReply | None:
        """The first matching rule's reply for this prompt, or None."""
        whole = text = self._tok.decode(list(prompt_ids), skip_special_tokens=False)
        if self._marker is not None:
            cut = text.rfind(self._marker)
            if cut >= 0:
                text = text[cut + len(self._marker):]
        return next((reply for pat, needs, reply in self._rules if pat.search(text)
                     and (needs is None or needs.search(whole))), None)
