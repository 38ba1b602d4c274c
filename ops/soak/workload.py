"""The soak's load: seeded closed-loop clients over both APIs, and reply checks."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

WORDS = ("cache", "prefix", "router", "replica", "token", "block", "stream", "model", "index",
         "agent", "turn", "reply", "shard", "queue", "batch", "decode", "prefill", "latency")


@dataclass(slots=True)
class Stats:
    """Request outcomes: totals, and latencies since the last sample."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)

    def record(self, kind: str, e2e: float, ttft: float | None, error: str | None) -> None:
        self.requests[kind] += 1
        if error is not None:
            self.errors[kind] += 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{kind}: {error}"[:300])
            return
        self.window.append(e2e)
        if ttft is not None:
            self.ttft.append(ttft)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}
Session = tuple[str, list[dict[str, str]]]  # (session id, turns so far)


class Workload:
    """The mixed requests. A conversation is used by one request at a time (taken, given back)."""

    def __init__(self, model: str, max_tokens: int, seed: int) -> None:
        self.model, self.max_tokens = model, max_tokens
        self.rng = random.Random(seed)
        self.system = "You are the soak-test assistant. " + _text(random.Random(seed), 300)
        self.idle: list[Session] = []

    def take(self) -> Session:
        if not self.idle or self.rng.random() < 0.1:
            return f"soak-{self.rng.getrandbits(48):x}", []
        return self.idle.pop(self.rng.randrange(len(self.idle)))

    def give_back(self, session: Session) -> None:
        if len(session[1]) < 12 and len(self.idle) < 64:  # at most 6 turns, 64 conversations
            self.idle.append(session)

    def request(self) -> tuple[str, dict[str, Any], Session | None]:
        """(kind, body, the conversation it continues, if any)."""
        kind = self.rng.choice(("chat", "chat", "completions", "messages", "messages",
                                "count_tokens"))
        stream = kind != "count_tokens" and self.rng.random() < 0.5
        session, body = None, {"model": self.model}
        if kind == "completions":
            body["prompt"] = (_text(self.rng, 40) if self.rng.random() < 0.5
                              else [self.rng.randrange(10, 1000) for _ in range(60)])
        else:
            if self.rng.random() < 0.5:  # shared prefix: system prompt + earlier turns
                session = self.take()
                session[1].append({"role": "user", "content": _text(self.rng, 20)})
            turns = session[1] if session else [{"role": "user",
                                                 "content": _text(self.rng, 60)}]
            if kind == "chat":
                body["messages"] = [{"role": "system", "content": self.system}, *turns]
            else:
                body.update(system=self.system, messages=list(turns))
        if kind != "count_tokens":
            body.update(max_tokens=self.max_tokens, stream=stream)
        if stream and kind != "messages":
            body["stream_options"] = {"include_usage": True}
        return kind + ("-stream" if stream else ""), body, session


def check_reply(kind: str, data: Any) -> str:
    """The reply's text; raises ValueError when it is not the expected shape."""
    if kind == "chat":
        return data["choices"][0]["message"]["content"] or ""
    if kind == "completions":
        return data["choices"][0]["text"]
    if kind == "messages":
        if data.get("type") != "message":
            raise ValueError(f"not a message: {str(data)[:200]}")
        return "".join(b.get("text", "") for b in data["content"])
    if not isinstance(data.get("input_tokens"), int):
        raise ValueError(f"no input_tokens: {data}")
    return ""


async def _read_stream(resp: httpx.Response, kind: str, start: float) -> tuple[str, float]:
    """(text, ttft) of an SSE reply; ValueError on an error event or a cut stream."""
    text, ttft, done = [], None, False
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        event = json.loads(payload)
        if "error" in event and event.get("type") in (None, "error"):
            raise ValueError(f"error event: {payload[:200]}")
        piece = (event.get("delta", {}).get("text", "") if kind.startswith("messages")
                 else "".join((c.get("delta") or {}).get("content") or c.get("text") or ""
                              for c in event.get("choices", [])))
        done = done or event.get("type") == "message_stop"
        if piece and ttft is None:
            ttft = time.monotonic() - start
        text.append(piece)
    if not done:
        raise ValueError("stream ended without [DONE] / message_stop")
    return "".join(text), ttft if ttft is not None else time.monotonic() - start


async def one_request(client: httpx.AsyncClient, work: Workload, stats: Stats) -> None:
    kind, body, session = work.request()
    start, ttft, error, text = time.monotonic(), None, None, ""
    headers = {"x-session-id": session[0]} if session else {}
    try:
        async with client.stream("POST", PATHS[kind.removesuffix("-stream")], json=body,
                                 headers=headers) as resp:
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            if kind.endswith("-stream"):
                text, ttft = await _read_stream(resp, kind, start)
            else:
                text = check_reply(kind, json.loads(await resp.aread()))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        error = f"{type(e).__name__}: {e}"
    stats.record(kind, time.monotonic() - start, ttft, error)
    if session is not None:
        if error is None:
            session[1].append({"role": "assistant", "content": text or "ok"})
        else:
            session[1].pop()  # keep the conversation well-formed (user, assistant, ...)
        work.give_back(session)


# --- sampling ---------------------------------------------------------------------------
