"""Model selection and sessions in the default profile: (model, replica) pairs
scored together, preferences, filters, and the session load guard."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deploy.config import KvrouteConfig
from deploy.config.routing import profile
from router.routing.context import Candidate, RequestContext
from router.routing.pipeline import Pipeline

PROMPT = 8000


def _ctx(*cands: Candidate, **kw: object) -> RequestContext:
    models = {c.model for c in cands}
    ctx = RequestContext("r", {m: PROMPT for m in models}, {m: [] for m in models}, 64,
                         list(cands))
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def _best(ctx: RequestContext) -> tuple[str, str]:
    top = Pipeline(profile("kvroute")).rank(ctx)[0]
    return top.model, top.replica


def test_preferred_model_wins_when_nothing_is_cached() -> None:
    ctx = _ctx(Candidate("big", "b1"), Candidate("small", "s1"),
               model_weights={"big": 1.0, "small": 0.6})
    assert _best(ctx) == ("big", "b1")


def test_warm_conversation_stays_on_its_model() -> None:
    ctx = _ctx(Candidate("big", "b1"), Candidate("small", "s1", matched_tokens=PROMPT - 64),
               model_weights={"big": 1.0, "small": 0.6})
    assert _best(ctx) == ("small", "s1")


def test_context_window_and_tools_filters() -> None:
    cands = (Candidate("big", "b1"), Candidate("small", "s1", matched_tokens=PROMPT))
    short = _ctx(*cands, max_tokens=512, context_windows={"big": 32768, "small": 4096})
    assert _best(short)[0] == "big"
    no_tools = _ctx(*cands, has_tools=True, tool_models=frozenset({"big"}))
    assert _best(no_tools)[0] == "big"


def test_session_sticks_while_load_allows() -> None:
    idle = (Candidate("m", "a", routed=5), Candidate("m", "b", routed=0))
    assert _best(_ctx(*idle, sticky=("m", "a"))) == ("m", "a")
    assert _best(_ctx(*idle)) == ("m", "b")  # without the session: spread
    busy = (Candidate("m", "a", queued_prefill_tokens=50_000), Candidate("m", "b"))
    assert _best(_ctx(*busy, sticky=("m", "a"))) == ("m", "b")  # the load guard wins


BASE = {"models": [{"name": "big", "model_path": "/x"}, {"name": "small", "model_path": "/x"}]}


def test_groups_resolve_and_validate() -> None:
    cfg = KvrouteConfig.model_validate({**BASE, "groups": [
        {"name": "coder", "models": [{"model": "big"}, {"model": "small", "weight": 0.6}]}]})
    assert cfg.resolve("coder") == {"big": 1.0, "small": 0.6}
    assert cfg.resolve("auto") == {"big": 1.0, "small": 1.0}
    assert cfg.resolve("big") == {"big": 1.0} and cfg.resolve("nope") is None
    for bad in ([{"name": "big", "models": [{"model": "small"}]}],
                [{"name": "g", "models": [{"model": "ghost"}]}],
                [{"name": "g", "models": [{"model": "big", "weight": 0}]}]):
        with pytest.raises(ValidationError):
            KvrouteConfig.model_validate({**BASE, "groups": bad})


def test_a_pinned_pair_goes_first_and_the_rest_keep_their_rank() -> None:
    from router.routing.context import Candidate
    from router.routing.selection import pinned

    ranked = [Candidate("a", "r1"), Candidate("a", "r2"), Candidate("b", "r3")]
    assert pinned(ranked, None) is ranked
    assert [c.replica for c in pinned(ranked, ("b", "r3"))] == ["r3", "r1", "r2"]
    assert [c.replica for c in pinned(ranked, ("a", "gone"))] == ["r1", "r2", "r3"]
