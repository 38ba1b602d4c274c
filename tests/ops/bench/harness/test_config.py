"""The benchmarks' one config builder (``ops.bench.harness.config``): a field left None keeps
kvroute's default; each field a bench sets lands where the deployment reads it."""

from __future__ import annotations

from deploy.config import AutoscalingConfig, KvrouteConfig, ModelConfig
from ops.bench.compare.bench import CompareSpec, build_config
from ops.bench.compare.scaling import scaled_config
from ops.bench.harness.config import StackSpec, build, sim_kwargs


def test_unset_fields_keep_kvroutes_defaults() -> None:
    cfg = build(StackSpec(model="m", model_path="/m", port=1234))
    default = KvrouteConfig(models=[ModelConfig(name="m", model_path="/m")])
    assert cfg.router == default.router and cfg.index == default.index
    assert cfg.server.ingress == default.server.ingress and cfg.server.port == 1234
    model = cfg.models[0]
    assert model.vllm_kv_events is None and not model.direct_http
    assert model.stream_interval_ms == default.models[0].stream_interval_ms


def test_set_fields_reach_the_config() -> None:
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2)
    cfg = build(StackSpec(model="m", model_path="/m", port=1, replicas=None, autoscaling=scaling,
                          redis_url="redis://127.0.0.1:1/0", index_namespace="ns",
                          router_replicas=3, ingress="proxy", prewarm=False, leases=True,
                          kv_event_block_size=16, direct_http=True, stream_interval_ms=5.0))
    model = cfg.models[0]
    assert model.autoscaling == scaling and model.num_replicas is None
    assert model.direct_http and model.vllm_kv_events is not None
    assert model.vllm_kv_events.block_size == 16 and model.stream_interval_ms == 5.0
    assert cfg.index.redis_url == "redis://127.0.0.1:1/0" and cfg.index.namespace == "ns"
    assert cfg.router.replicas == 3 and not cfg.router.prewarm.enabled
    assert cfg.router.leases.enabled and cfg.server.ingress == "proxy"


def test_compare_stacks() -> None:
    """bench compare's replicas: direct endpoints, and KV events only on the sim engine."""
    sim = build_config(CompareSpec(), "/m", 1).models[0]
    assert sim.direct_http and sim.vllm_kv_events is not None
    assert sim.engine_kwargs == sim_kwargs(CompareSpec().sim)
    assert isinstance(sim.engine_kwargs["kv_blocks"], int)
    mlx = build_config(CompareSpec(engine="mlx"), "/m", 1).models[0]
    assert mlx.vllm_kv_events is None and mlx.engine_kwargs == {}
    scaled = scaled_config(CompareSpec(), "/m", 1, 4, "redis://127.0.0.1:1/0")
    assert scaled.router.replicas == 4 and scaled.index.namespace == "kvroute-bench-r4"
