"""The per-request rows and TTFT-tail split of ``bench compare`` (``ops.bench.harness.tail``), on
records made by a FIFO replica model whose queue waits are known."""

from __future__ import annotations

import json

import pytest

from ops.bench.harness.client import Record
from ops.bench.harness.report import json_text
from ops.bench.harness.tail import COLUMNS, request_rows, tail_fields, tail_summary

P = 1000.0  # prefill tokens per second
HOP = 0.01  # the router's time, added to every TTFT


def fifo_records(sends: list[tuple[float, str, int, int]]) -> tuple[list[Record], list[float]]:
    """(sent at, replica, prompt, cached) -> records as a FIFO prefill queue per replica
    would produce them, and each request's true queue wait."""
    free: dict[str, float] = {}
    records, waits = [], []
    for i, (t, replica, prompt, cached) in enumerate(sends):
        begin = max(t, free.get(replica, 0.0))
        free[replica] = begin + (prompt - cached) / P
        waits.append(begin - t)
        records.append(Record(f"k{i}", f"s{i}", t, ttft_s=free[replica] - t + HOP,
                              e2e_s=free[replica] - t + 1.0, prompt_tokens=prompt,
                              cached_tokens=cached, completion_tokens=5, replica=replica))
    return records, waits


SENDS = [(0.0, "a", 2000, 0), (0.5, "a", 1000, 500), (0.6, "b", 300, 0),
         (1.0, "a", 4000, 3000), (3.0, "b", 8000, 0), (3.1, "a", 200, 100)]


def test_queue_wait_and_prefill_are_recovered() -> None:
    records, waits = fifo_records(SENDS)
    rows = request_rows(records, P)
    for row, wait, (_, _, prompt, cached) in zip(rows, waits, SENDS, strict=True):
        assert row.prefill_s == pytest.approx((prompt - cached) / P)
        # the previous request's first token carries the hop too: the wait reads HOP more
        assert row.queue_wait_s == pytest.approx(wait + HOP if wait else 0.0, abs=1e-9)
        assert row.queue_wait_s + row.prefill_s + row.other_s == pytest.approx(row.ttft_s)
    # request 3 waited on replica a while b was free
    assert rows[3].queue_wait_s > 0.5 and rows[3].best_other_wait_s == 0.0


def test_tail_is_the_slowest_and_split() -> None:
    records, _ = fifo_records(SENDS)
    tail = tail_summary(request_rows(records, P), share=0.34)  # 2 of 6
    slowest = sorted(r.ttft_s for r in records)[-2:]
    assert tail["requests"] == 2 and tail["ttft_s"] == pytest.approx(sum(slowest) / 2)
    assert tail["queue_wait_s"] + tail["prefill_s"] + tail["other_s"] == \
        pytest.approx(tail["ttft_s"])


def test_no_split_without_replica_or_rate() -> None:
    records, _ = fifo_records(SENDS)
    assert all(r.queue_wait_s is None for r in request_rows(records, None))
    for r in records:
        r.replica = ""
    tail = tail_summary(request_rows(records, P))
    assert "queue_wait_s" not in tail and tail["requests"] == 1


def test_rows_round_trip_through_the_json_text() -> None:
    records, _ = fifo_records(SENDS)
    records.append(Record("bad", "s9", 4.0, error="HTTP 500: boom"))
    out = json.loads(json_text({"routers": {"x": tail_fields(records, P)}}))
    per = out["routers"]["x"]["per_request"]
    assert per["columns"] == list(COLUMNS) and len(per["rows"]) == 7
    assert dict(zip(COLUMNS, per["rows"][-1], strict=True))["error"] == "HTTP 500: boom"
    assert len(json_text(per).splitlines()) == 12  # braces, columns, "rows": [, 7 rows, ]


def test_affinity_is_per_session() -> None:
    records, _ = fifo_records(SENDS)
    for r, s in zip(records, ["x", "x", "y", "x", "z", "y"], strict=True):
        r.session = s
    rows = request_rows(records, P)
    assert [r.same_replica_as_last_turn for r in rows] == [None, True, None, True, None, False]
    tail = tail_summary(rows, share=0.34)  # requests 3 (x's third turn) and 4 (z's first)
    assert tail["first_turn_share"] == 0.5 and tail["same_replica_share"] == 1.0
