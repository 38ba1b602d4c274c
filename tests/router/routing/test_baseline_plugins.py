"""Baseline pickers (round robin, power of two, SGLang cache-aware, Ray prefix affinity),
their approximate tree, and the kvroute scorer's learned signals, on handcrafted contexts."""

from __future__ import annotations

import pytest

from deploy.config.routing import PROFILES, profile
from router.routing.context import Candidate, RequestContext
from router.routing.pipeline import Pipeline
from router.routing.plugins import make_plugin
from router.routing.plugins.approx_tree import ApproxPrefixTree

BS = 512


def _ctx(hashes: list[int], *cands: Candidate, now: float = 0.0) -> RequestContext:
    return RequestContext("r", {"m": len(hashes) * BS}, {"m": hashes}, BS, list(cands), now=now)


def _cands(*loads: int) -> list[Candidate]:
    return [Candidate("m", f"r{i}", ongoing=n) for i, n in enumerate(loads)]


def _route(picker: object, ctx: RequestContext) -> str:
    chosen = picker.pick(ctx, [0.0] * len(ctx.candidates))[0]  # type: ignore[attr-defined]
    if hook := getattr(picker, "on_routed", None):
        hook(ctx, chosen)
    return chosen.replica


def _seed_tree(picker: object, replica: str, hashes: list[int], *loads: int) -> None:
    """Teach a picker that ``replica`` got ``hashes`` (as routing history would)."""
    ctx = _ctx(hashes, *_cands(*loads))
    picker.on_routed(ctx, next(c for c in ctx.candidates if c.replica == replica))  # type: ignore[attr-defined]


def test_baseline_profiles_build() -> None:
    for name in ("round-robin", "power-of-two", "sglang-cache-aware", "ray-prefix-affinity"):
        assert name in PROFILES
        Pipeline(profile(name))
    assert "kvroute" in PROFILES


# ---- round robin and power of two --------------------------------------------------------

def test_round_robin_cycles_and_advances_only_when_routed() -> None:
    rr = make_plugin("round-robin-picker", "picker")
    ctx = _ctx([1], *_cands(0, 0, 0))
    first = rr.pick(ctx, [0.0] * 3)
    assert [c.replica for c in first] == ["r0", "r1", "r2"]
    assert rr.pick(ctx, [0.0] * 3)[0].replica == "r0"  # no decision taken: no advance
    assert [_route(rr, ctx) for _ in range(4)] == ["r0", "r1", "r2", "r0"]


def test_power_of_two_takes_the_less_loaded_of_two_and_is_seeded() -> None:
    p2 = make_plugin("power-of-two-picker", "picker")
    for _ in range(20):  # with two candidates the sample is both: always the less loaded
        assert _route(p2, _ctx([1], *_cands(5, 2))) == "r1"
    ctx = _ctx([1], *_cands(3, 1, 4, 1, 5, 9, 2, 6))
    a = [_route(make_plugin("power-of-two-picker", "picker", {"seed": 7}), ctx) for _ in range(3)]
    assert len(set(a)) == 1
    picks = [_route(p2, ctx) for _ in range(200)]
    assert "r5" not in picks  # the most loaded can never win a pairwise comparison
    assert len(set(picks)) > 3


# ---- the approximate tree ----------------------------------------------------------------

def test_tree_match_is_longest_leading_run() -> None:
    t = ApproxPrefixTree(None, 120.0)
    t.insert("a", [1, 2, 3])
    assert t.match("a", [1, 2, 3, 4]) == 3
    assert t.match("a", [1, 9, 3]) == 1
    assert t.match("b", [1]) == 0
    t.insert("b", [1, 2])
    assert t.best_match([("a", [1, 2, 3]), ("b", [1, 2, 3])]) == (3, ["a"])
    assert t.best_match([("a", [1, 2]), ("b", [1, 2])]) == (2, ["a", "b"])
    assert t.smallest(["a", "b", "c"]) == ["c"]


def test_tree_trims_lru_leaves_first_every_interval() -> None:
    t = ApproxPrefixTree(3, 120.0)
    t.insert("a", [1, 2, 3, 4])  # one chain: 4 is the leaf
    t.insert("a", [1, 5])  # a newer branch
    assert not t.maybe_trim(0.0)  # starts the clock
    assert not t.maybe_trim(119.0) and t.size("a") == 5
    assert t.maybe_trim(120.0)
    assert t.size("a") == 3
    assert t.match("a", [1, 5]) == 2  # the recent branch survives
    assert t.match("a", [1, 2, 3, 4]) == 2  # the old chain lost its leaves, kept its root
    t.insert("a", [7, 8, 9, 10])
    assert not t.maybe_trim(200.0)  # next trim only at 240 s
    assert t.maybe_trim(240.0) and t.size("a") == 3


def test_untrimmed_tree_keeps_everything() -> None:
    t = ApproxPrefixTree(None, 10.0)
    t.insert("a", list(range(100)))
    t.maybe_trim(0.0)
    assert t.maybe_trim(50.0) and t.size("a") == 100


# ---- SGLang cache-aware ------------------------------------------------------------------

def _sglang(**params: object) -> object:
    return make_plugin("sglang-cache-aware-picker", "picker", params)


def test_sglang_imbalance_goes_to_shortest_queue() -> None:
    p = _sglang()
    _seed_tree(p, "r0", [1, 2, 3, 4], 0, 0, 0)
    # r0 holds the whole prompt but the gap is 100 > 64 and 100 > 1.5 x 0: least loaded.
    assert _route(p, _ctx([1, 2, 3, 4], *_cands(100, 50, 0))) == "r2"


def test_sglang_relative_threshold_keeps_cache_routing() -> None:
    p = _sglang()
    _seed_tree(p, "r0", [1, 2, 3, 4], 0, 0)
    # gap 80 > 64, but 300 <= 1.5 x 220: still balanced, so the cache holder wins.
    assert _route(p, _ctx([1, 2, 3, 4], *_cands(300, 220))) == "r0"


def test_sglang_follows_a_match_above_threshold() -> None:
    p = _sglang()
    _seed_tree(p, "r1", [1, 2], 0, 0, 0)
    _seed_tree(p, "r0", [7, 8], 0, 0, 0)
    assert _route(p, _ctx([1, 2, 3, 4, 5], *_cands(0, 5, 0))) == "r1"  # 2/5 = 0.4 > 0.3


def test_sglang_low_match_goes_to_smallest_tree() -> None:
    p = _sglang()
    _seed_tree(p, "r0", [1, 2, 3], 0, 0, 0)
    _seed_tree(p, "r1", [9], 0, 0, 0)
    # Best match is 1 block of 4 (0.25 <= 0.3): the smallest tree (r2, empty) wins,
    # even though it is the busiest.
    assert _route(p, _ctx([1, 5, 6, 7], *_cands(0, 0, 9))) == "r2"


def test_sglang_match_ties_go_to_the_less_loaded() -> None:
    p = _sglang()
    _seed_tree(p, "r0", [1, 2], 0, 0)
    _seed_tree(p, "r1", [1, 2], 0, 0)
    assert _route(p, _ctx([1, 2], *_cands(3, 1))) == "r1"


def test_sglang_inserts_whatever_branch_chose() -> None:
    p = _sglang()
    _route(p, _ctx([1, 2, 3], *_cands(100, 0)))  # imbalanced: r1
    assert p.tree.match(("m", "r1"), [1, 2, 3]) == 3  # type: ignore[attr-defined]


def test_sglang_trims_on_its_interval() -> None:
    p = _sglang(max_blocks=2, trim_interval_s=120.0)
    _route(p, _ctx([1, 2, 3, 4], *_cands(0), now=0.0))
    _route(p, _ctx([1, 2, 3, 4], *_cands(0), now=60.0))
    assert p.tree.size(("m", "r0")) == 4  # type: ignore[attr-defined]
    _route(p, _ctx([5], *_cands(0), now=130.0))  # trims before deciding, then inserts 5
    assert p.tree.size(("m", "r0")) == 3  # type: ignore[attr-defined]


# ---- Ray prefix affinity -----------------------------------------------------------------

def _ray(**params: object) -> object:
    return make_plugin("ray-prefix-affinity-picker", "picker", params)


def test_ray_imbalance_falls_back_to_power_of_two() -> None:
    for gap, expected in ((11, "r1"), (10, "r0")):
        p = _ray()
        _seed_tree(p, "r0", [1, 2, 3], 0, 0)
        # Gap 11 > 10: power of two over both candidates picks the less loaded, not the
        # holder; gap 10 is balanced, so the holder wins although busier.
        assert _route(p, _ctx([1, 2, 3], *_cands(gap, 0))) == expected


def test_ray_best_match_with_shortest_queue_among_ties() -> None:
    p = _ray()
    for r in ("r0", "r1"):
        _seed_tree(p, r, [1, 2], 0, 0, 0)
    _seed_tree(p, "r2", [1], 0, 0, 0)
    # 2/10 = 0.2 >= 0.1: replicas holding the best (2-block) match, the shortest queue.
    assert _route(p, _ctx(list(range(1, 3)) + list(range(20, 28)), *_cands(4, 2, 0))) == "r1"


def test_ray_match_rate_threshold_is_inclusive() -> None:
    p = _ray()
    _seed_tree(p, "r0", [1], 0, 0)
    _seed_tree(p, "r1", [50, 51], 0, 0)
    assert _route(p, _ctx([1] + list(range(60, 69)), *_cands(3, 0))) == "r0"  # 1/10 = 0.1


def test_ray_low_match_goes_to_smallest_tree_then_shortest_queue() -> None:
    p = _ray()
    _seed_tree(p, "r0", [1, 2, 3], 0, 0, 0)
    # No match: r1 and r2 both have empty trees; r2 has the shorter queue.
    assert _route(p, _ctx([40, 41], *_cands(0, 5, 2))) == "r2"


def test_ray_does_not_evict_by_default() -> None:
    p = _ray()
    _route(p, _ctx(list(range(50)), *_cands(0), now=0.0))
    _route(p, _ctx([99], *_cands(0), now=1000.0))
    assert p.tree.size(("m", "r0")) == 51  # type: ignore[attr-defined]


# ---- kvroute's scorer: learned rate and the externality -----------------------------------

def test_prefill_rate_is_learned_from_reported_counters() -> None:
    s = make_plugin("queued-prefill-scorer", "scorer")
    c = Candidate("m", "r0", prefill_tok_s=4000.0)
    assert s.rates.rate(c) == 4000.0  # prior
    for k in range(1, 40):  # the replica really does 12000 tok/s
        c.prefill_busy_s, c.prefill_tokens_total = float(k), 12000 * k
        s.on_routed(_ctx([1], c, now=float(k)), c)
    assert s.rates.rate(c) == pytest.approx(12000.0)
    fresh = Candidate("m", "r1", prefill_tok_s=4000.0)  # a new replica of the same model
    assert s.rates.rate(fresh) == pytest.approx(12000.0)  # its fleet's rate, not the prior
    assert s.rates.rate(Candidate("other", "r9", prefill_tok_s=4000.0)) == 4000.0
    c.prefill_busy_s, c.prefill_tokens_total = 1.0, 6000  # restarted worker, slower
    s.on_routed(_ctx([1], c), c)
    assert s.rates.rate(c) == pytest.approx(6000.0)


def test_externality_keeps_a_busier_cache_holder_under_load() -> None:
    # Holder: 2 s of queue, 0.1 s own prefill. Other: idle, 1.9 s own prefill.
    holder = Candidate("m", "a", matched_tokens=22 * BS, queued_prefill_tokens=24000,
                       prefill_tok_s=12000.0)
    idle = Candidate("m", "b", prefill_tok_s=12000.0)
    prompt = [*range(22), 99, 100]  # 24 blocks = 12288 tokens, 22 cached on "a"
    greedy = make_plugin("queued-prefill-scorer", "scorer", {"externality": False})
    full = make_plugin("queued-prefill-scorer", "scorer")
    for t in range(50):  # 2 requests per second per replica
        full.on_routed(_ctx([1], holder, idle, now=t * 0.25), holder)
    ctx = _ctx(prompt, holder, idle, now=12.5)
    g, f = greedy.score(ctx), full.score(ctx)
    assert g[1] > g[0]  # alone, the idle replica is faster for this request...
    assert f[0] > f[1]  # ...but the miss costs the requests queued behind it more
