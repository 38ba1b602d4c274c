"""OpenAI's and vLLM's logprobs shapes (``router.api.openai.logprobs``) from the engines'
records: chat entries, the completion object with its offsets and ``logprobs + 1`` map,
the echoed prompt first in a stream, vLLM's ``prompt_logprobs``, the -9999 floor."""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.api.openai import logprobs as lpx
from workers.protocol import Chunk, Final, TokenLogprob, TopLogprob, Usage, WorkerMessage


def entry(tid: int, token: str, lp: float, *tops: tuple[int, str, float]) -> TokenLogprob:
    return TokenLogprob(tid, token, lp, 1, tuple(TopLogprob(*t) for t in tops))


A = entry(7, " a", -0.1, (7, " a", -0.1), (8, " b", -2.5))
B = entry(9, "é", -3.0, (8, " b", -0.5), (10, " c", -1.0))  # sampled outside the top
P1 = entry(3, " x", float("-inf"), (4, " y", -0.2))


class FakeGen:
    """A generation's messages (a unit test of the tap alone)."""

    replica, final, prompt_tokens = "r0", None, 2

    def __init__(self, messages: list[WorkerMessage]) -> None:
        self._messages = messages

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        for m in self._messages:
            yield m

    def close(self) -> None:
        pass


async def test_chat_entries_have_bytes_and_the_asked_top() -> None:
    got = lpx.chat_logprobs([A, B], 1)["content"]
    assert got[0] == {"token": " a", "logprob": -0.1, "bytes": [32, 97],
                      "top_logprobs": [{"token": " a", "logprob": -0.1, "bytes": [32, 97]}]}
    assert got[1]["bytes"] == list("é".encode()) and len(got[1]["top_logprobs"]) == 1


def test_completion_block_offsets_and_top_map() -> None:
    block = lpx.CompletionLogprobs(1).block([None, P1, A, B], "<s>")
    assert block["tokens"] == ["<s>", " x", " a", "é"]
    assert block["token_logprobs"] == [None, -9999.0, -0.1, -3.0]  # -inf floored
    assert block["text_offset"] == [0, 3, 5, 7]
    assert block["top_logprobs"][0] is None
    assert block["top_logprobs"][2] == {" a": -0.1, " b": -2.5}  # own first, then the top
    assert block["top_logprobs"][3] == {"é": -3.0, " b": -0.5}  # logprobs + 1 entries


def test_vllm_prompt_logprobs() -> None:
    got = lpx.vllm_prompt_logprobs((P1,), 1)
    assert got == [None, {"3": {"logprob": -9999.0, "rank": 1, "decoded_token": " x"},
                          "4": {"logprob": -0.2, "rank": 1, "decoded_token": " y"}}]


async def test_streamed_echo_comes_first_with_the_prompts_logprobs() -> None:
    gen = FakeGen([Chunk("r0", " a", (7,), (A,), (P1,)), Chunk("r0", "é", (9,), (B,)),
                   Final("r0", Usage(2, 2, 0), "length")])
    tap = lpx.LogprobTap(gen)
    notes = lpx.Notes(tap, lpx.Asks(top=1, prompt=1, echo="<s> x", first_token="<s>"),
                      chat=False)
    pieces = []
    async for msg in tap.messages():
        if isinstance(msg, Chunk):
            pieces.append(notes.piece(msg.text))
    (text1, lp1), (text2, lp2) = pieces
    assert text1 == "<s> x a" and lp1 is not None and lp2 is not None
    assert lp1["tokens"] == ["<s>", " x", " a"] and lp1["text_offset"] == [0, 3, 5]
    assert lp2["tokens"] == ["é"] and lp2["text_offset"] == [7]
    assert notes.piece("") == ("", None)  # nothing left for the end
    whole_text, whole = lpx.Notes(tap, notes.asks, chat=False).whole(" aé")
    assert whole_text == "<s> x aé" and whole is not None
    assert whole["tokens"] == ["<s>", " x", " a", "é"]
    assert tap.prompt_tokens == 2  # the rest of the generation shows through
