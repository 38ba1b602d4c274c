import pytest

from router.context import Candidate, RequestContext
from router.pipeline import Pipeline, validate_weights


def _ctx(*cands: Candidate, prompt: int = 1000) -> RequestContext:
    return RequestContext("r", {"m": prompt}, {"m": []}, 64, list(cands))


def test_cache_holder_wins_when_idle() -> None:
    ranked = Pipeline().rank(_ctx(Candidate("m", "a"), Candidate("m", "b", matched_tokens=900)))
    assert [c.replica for c in ranked] == ["b", "a"]


def test_busy_cache_holder_loses_to_idle_replica() -> None:
    holder = Candidate("m", "b", matched_tokens=900, queued_prefill_tokens=20000)
    ranked = Pipeline().rank(_ctx(Candidate("m", "a"), holder))
    assert ranked[0].replica == "a"


def test_ties_spread_by_routed_count() -> None:
    ranked = Pipeline().rank(_ctx(Candidate("m", "a", routed=3), Candidate("m", "b", routed=1)))
    assert ranked[0].replica == "b"


def test_full_replicas_are_filtered_unless_all_are_full() -> None:
    full = Candidate("m", "a", matched_tokens=1000, ongoing=4, max_ongoing=4)
    assert [c.replica for c in Pipeline().rank(_ctx(full, Candidate("m", "b")))] == ["b"]
    assert Pipeline().rank(_ctx(full))[0].replica == "a"


def test_weights_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown routing plugins"):
        validate_weights({"no-such-scorer": 1.0})
    with pytest.raises(ValueError, match="weights"):
        validate_weights({"prefix-cache-scorer": -1.0})


def test_scores_lie_in_unit_interval() -> None:
    from router.plugins import PLUGINS

    ctx = _ctx(Candidate("m", "a", ongoing=3, queued_prefill_tokens=500),
               Candidate("m", "b", matched_tokens=640))
    for cls in PLUGINS.values():
        assert all(0.0 <= s <= 1.0 for s in cls().score(ctx)), cls
