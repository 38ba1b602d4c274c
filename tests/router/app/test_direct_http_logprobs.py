"""``DirectHttp`` (a replica's own endpoint) passes the logprobs asks on to the engine and
answers in OpenAI's shapes, with a fake engine that returns logprobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from tests.router.app.test_direct_http import MODEL, serving, sse
from workers.protocol import (
    Chunk,
    Final,
    TokenLogprob,
    TopLogprob,
    Usage,
    WorkerMessage,
    WorkRequest,
)


def _lp(tid: int, token: str, value: float) -> TokenLogprob:
    return TokenLogprob(tid, token, value, 1, (TopLogprob(tid, token, value),
                                               TopLogprob(tid + 1, "?", value - 1)))


class LogprobEngine:
    def __init__(self) -> None:
        self.requests: list[WorkRequest] = []
        self.closed = 0

    async def generate(self, request: WorkRequest,
                       kvroute_rank: list[str] | None = None) -> AsyncIterator[WorkerMessage]:
        self.requests.append(request)
        prompt = tuple(_lp(t, f"p{t}", -0.5) for t in request.token_ids[1:]) \
            if request.sampling.prompt_logprobs is not None else ()
        lps = request.sampling.logprobs is not None
        yield Chunk("r-1", " hello", (7,), (_lp(7, " hello", -0.25),) if lps else (), prompt)
        yield Chunk("r-1", " world", (8,), (_lp(8, " world", -0.75),) if lps else ())
        yield Final("r-1", Usage(len(request.token_ids), 2, 0), "length")


async def test_chat_and_completion_logprobs(tiny_model_dir: Path) -> None:
    engine = LogprobEngine()
    async with serving(tiny_model_dir, engine) as c:
        chat = (await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True, "top_logprobs": 2})).json()
        assert (engine.requests[-1].sampling.logprobs,
                engine.requests[-1].sampling.prompt_logprobs) == (2, None)
        content = chat["choices"][0]["logprobs"]["content"]
        assert [x["token"] for x in content] == [" hello", " world"]
        assert [len(x["top_logprobs"]) for x in content] == [2, 2]
        r = await c.post("/v1/completions", json={
            "model": MODEL, "prompt": [[5, 6, 9]], "echo": True, "logprobs": 1,
            "stream": True})
        chunks = [x for x in sse(r.text) if x != "[DONE]" and x["choices"]]
        assert engine.requests[-1].sampling.prompt_logprobs == 1
        first = chunks[0]["choices"][0]["logprobs"]
        assert first["token_logprobs"] == [None, -0.5, -0.5, -0.25]
        assert first["tokens"][1:] == ["p6", "p9", " hello"]
        assert chunks[1]["choices"][0]["logprobs"]["tokens"] == [" world"]
