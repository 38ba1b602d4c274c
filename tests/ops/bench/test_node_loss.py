"""The node-loss bench's figures from records: where each request in flight at the kill ran,
what was sent after it, and when a replacement answered."""

from __future__ import annotations

from ops.bench.harness.client import Record
from ops.bench.node_loss_figures import classify, new_replicas

KILL = 10.0
DEAD_W, DEAD_R = {"w-dead"}, {"r-dead"}


def _rec(start: float, end: float, router: str, replica: str, error: str | None = None
         ) -> Record:
    return Record("k", "s", start, ttft_s=None if error else 0.1, e2e_s=end - start,
                  router=router, replica=replica, error=error, end_s=end)


def test_in_flight_requests_are_grouped_by_where_they_ran() -> None:
    records = [
        _rec(1.0, 5.0, "r-live", "w-live"),  # done before the kill: in no group
        _rec(8.0, 12.0, "r-live", "w-live"),  # surviving, ok
        _rec(8.0, 13.5, "r-live", "w-dead"),  # resumed on the other worker
        _rec(9.0, 10.2, "r-dead", "w-live", error="ServerDisconnectedError"),
        _rec(9.5, 10.3, "", "", error="HTTP 500: actor died"),  # no router answered
    ]
    out = classify(records, KILL, DEAD_W, DEAD_R)["in_flight_at_kill"]
    assert out["surviving"]["count"] == 1 and out["surviving"]["errors"] == 0
    assert out["dead_worker"] == {**out["dead_worker"], "count": 1, "errors": 0, "migrated": 1}
    assert out["dead_worker"]["ended_within_s"] == 3.5
    assert out["dead_router"]["errors"] == 1 and out["no_headers"]["errors"] == 1


def test_errors_after_the_kill_count_against_the_surviving_node_unless_on_the_dead_router(
        ) -> None:
    records = [_rec(11.0, 12.0, "r-live", "w-live"),
               _rec(11.0, 11.5, "r-dead", "", error="ServerDisconnectedError"),
               _rec(12.0, 12.1, "", "", error="HTTP 503: no replica")]
    after = classify(records, KILL, DEAD_W, DEAD_R)["after_kill"]
    assert after["count"] == 3 and after["errors"] == 2
    assert after["dead_router_errors"] == 1
    assert after["surviving_errors"] == 1  # a failure no router answered is not excused
    assert after["error_samples"] == ["HTTP 503: no replica"]


def test_the_first_request_to_a_replacement() -> None:
    records = [_rec(20.0, 21.0, "r", "w-old"), _rec(26.0, 27.0, "r", "w-new"),
               _rec(30.0, 31.0, "r", "w-new")]
    out = new_replicas(records, readd_s=20.0, before={"w-old"})
    assert out == {"routed_new_s": 6.0, "requests_to_new": 2, "new_replicas": ["w-new"]}
    assert new_replicas(records, 20.0, {"w-old"}, probe_s=4.0)["routed_new_s"] == 4.0
    assert new_replicas(records[:1], 20.0, {"w-old"})["routed_new_s"] is None
