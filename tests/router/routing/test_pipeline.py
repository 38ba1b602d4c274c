import pytest

from deploy.config.routing import profile
from router.routing.context import Candidate, RequestContext
from router.routing.pipeline import Pipeline, PipelineConfig, PluginRef
from router.routing.plugins import PLUGINS, make_plugin
from router.routing.plugins.base import register


def _ctx(*cands: Candidate, prompt: int = 1000) -> RequestContext:
    return RequestContext("r", {"m": prompt}, {"m": []}, 64, list(cands))


def _rank(*cands: Candidate) -> list[str]:
    return [c.replica for c in Pipeline(profile("kvroute")).rank(_ctx(*cands))]


def test_cache_holder_wins_when_idle() -> None:
    assert _rank(Candidate("m", "a"), Candidate("m", "b", matched_tokens=900)) == ["b", "a"]


def test_busy_cache_holder_loses_to_idle_replica() -> None:
    holder = Candidate("m", "b", matched_tokens=900, queued_prefill_tokens=20000)
    assert _rank(Candidate("m", "a"), holder)[0] == "a"


def test_ties_spread_by_routed_count() -> None:
    assert _rank(Candidate("m", "a", routed=3), Candidate("m", "b", routed=1))[0] == "b"


def test_full_replicas_are_filtered_unless_all_are_full() -> None:
    full = Candidate("m", "a", matched_tokens=1000, ongoing=4, max_ongoing=4)
    assert _rank(full, Candidate("m", "b")) == ["b"]
    assert _rank(full) == ["a"]


def test_unknown_or_misplaced_plugins_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown scorer"):
        make_plugin("no-such-scorer", "scorer")
    with pytest.raises(ValueError, match="unknown picker"):
        make_plugin("prefix-cache-scorer", "picker")
    with pytest.raises(ValueError):
        PipelineConfig(scorers=[PluginRef(name="prefix-cache-scorer", weight=-1)])
    with pytest.raises(ValueError, match="hold"):
        PipelineConfig.model_validate({"admission": {"hold": 0.1}})  # a typo is an error
    with pytest.raises(ValueError):
        PipelineConfig.model_validate({"admission": {"hold_s": -1}})


def test_weights_are_applied() -> None:
    cfg = PipelineConfig(scorers=[PluginRef(name="prefix-cache-scorer", weight=1.0),
                                  PluginRef(name="ongoing-requests-scorer", weight=5.0)])
    busy_holder = Candidate("m", "a", matched_tokens=1000, ongoing=3)
    idle = Candidate("m", "b")
    assert Pipeline(cfg).rank(_ctx(busy_holder, idle))[0].replica == "b"


def test_scores_lie_in_unit_interval() -> None:
    ctx = _ctx(Candidate("m", "a", ongoing=3, queued_prefill_tokens=500),
               Candidate("m", "b", matched_tokens=640))
    for name, cls in PLUGINS.items():
        if cls.kind == "scorer":
            assert all(0.0 <= s <= 1.0 for s in make_plugin(name, "scorer").score(ctx)), name


def test_scores_outside_zero_one_are_clamped_by_the_pipeline() -> None:
    """A scorer that breaks the [0, 1] contract (or returns NaN) cannot outweigh the
    others by more than its weight."""

    @register("test-wild-scorer", "scorer")
    class Wild:
        def __init__(self, params: object) -> None: ...

        def score(self, ctx: RequestContext) -> list[float]:
            return [50.0 if c.replica == "a" else float("nan") for c in ctx.candidates]

    try:
        cfg = PipelineConfig(scorers=[PluginRef(name="test-wild-scorer", weight=0.5),
                                      PluginRef(name="prefix-cache-scorer", weight=1.0)])
        ranked = Pipeline(cfg).rank(_ctx(Candidate("m", "a"),
                                         Candidate("m", "b", matched_tokens=900)))
        assert ranked[0].replica == "b"  # unclamped, a's 25 would beat b's cache hit
    finally:
        del PLUGINS["test-wild-scorer"]
