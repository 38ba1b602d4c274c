"""The router ingress's section (``router``): replicas, retries, routing policy,
incremental tokenization and KV leases.

Schema only: imports no other kvroute package but the schema's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from deploy.config.autoscale import AutoscalingConfig
from deploy.config.routing import PipelineConfig, profile
from deploy.config.schema import Strict


class LeaseConfig(Strict):
    """KV retention across an agent's pauses (router.routing.leases): each turn asks its replica to
    keep the session's blocks for about the gap the router expects before the next turn."""

    enabled: bool = Field(False, description="Send leases (engines without them ignore "
                          "them). Off by default: measured, they cost cached tokens when the "
                          "working set exceeds the cache (docs/routing.md, Leases).")
    quantile: float = Field(0.75, gt=0, le=1, description="The lease covers this quantile of "
                            "the session kind's learned gaps between turns.")
    prior_s: float = Field(30.0, ge=0, description="Lease before a kind has min_samples gaps.")
    min_samples: int = Field(8, ge=1, description="Gaps seen before the learned lease is used.")
    max_s: float = Field(300.0, ge=0, description="Longest lease.")
    by_ending: bool = Field(
        True, description="Choose the lease by how the turn ended: a reply with a tool call "
        "gets the learned pause after tool calls (sent with the request), a final answer "
        "the learned pause before the user's next task (renewed when the reply ends, by a "
        "prefill-only request of prompt + reply). Gaps are then learned from each turn's "
        "end per (kind, ending). Off: one lease per kind, from start-to-start gaps.")
    tool_prior_s: float = Field(5.0, ge=0, description="by_ending: the lease after a tool "
                                "call before min_samples such gaps are seen.")


class PrewarmConfig(Strict):
    """Pre-warmed scale-out (router.routing.prewarm): a replica Serve adds gets the hottest shared
    prefixes as prefill-only requests before it takes user traffic."""

    enabled: bool = Field(True, description="Warm new replicas of a model deployment.")
    max_prefixes: int = Field(4, ge=1, le=64, description="Most prefixes sent to one new "
                              "replica (the hottest first).")
    max_tokens: int = Field(65536, ge=1, description="Most prompt tokens sent to one new "
                            "replica in all.")
    min_uses: int = Field(2, ge=1, description="A prefix is hot once this many requests "
                          "reused it (found it in a replica's cache).")
    timeout_s: float = Field(10.0, gt=0, description="Bound on one replica's whole warm-up; "
                             "what is not done by then is dropped.")
    hold_s: float = Field(5.0, ge=0, description="User traffic avoids a replica being "
                          "warmed for at most this long (0: it takes traffic at once).")
    table_size: int = Field(256, ge=1, description="Prefixes remembered per router replica "
                            "(least recently used go first).")


class PromptCacheConfig(Strict):
    """Incremental tokenization in each router replica (router.prompt.cache)."""

    enabled: bool = Field(True, description="Keep token ids of rendered-text prefixes, so a "
                          "growing conversation's turn tokenizes only its new part.")
    max_bytes: int = Field(128 << 20, ge=0, description="The cache's bound per router replica "
                           "(least recently used segments go first).")
    offload: bool = Field(True, description="Render and tokenize in a thread pool, off the "
                          "event loop, so a long cold prompt never stalls other streams.")
    threads: int = Field(2, ge=1, le=64, description="Threads of that pool.")
    switch_interval_ms: float = Field(
        1.0, gt=0, le=100, description="The router replica's thread switch interval "
        "(Python's sys.setswitchinterval; its default is 5 ms), set when the pool starts. The "
        "pool's threads hold the GIL in short steps, and the event loop, which serves every "
        "stream, gets it back within this interval.")
    redis: bool | None = Field(
        None, description="A second level shared by all router replicas: token ids of "
        "prompt prefixes in index.redis_url, so a session new to a replica (a restart, "
        "scale-out) tokenizes only what Redis lacks. None: on when index.redis_url is set.")
    redis_ttl_s: float = Field(3600.0, gt=0, description="How long Redis keeps an entry "
                               "after it was written or last read.")
    redis_bytes_per_key: int = Field(
        256 << 20, ge=0, description="The most one API key's admitted requests may write to "
        "the second level within a redis_ttl_s (renewals count as writes); past it the key's "
        "new prompts are not shared (its replicas tokenize them). 0: no bound.")


class RouterConfig(Strict):
    replicas: int = Field(1, ge=1, description="Router ingress replicas (without autoscaling).")
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Autoscale router replicas (a router holds each request for its "
        "whole stream, so aim target_ongoing_requests high, e.g. 128). With server.ingress "
        "direct, on the requests open on the replicas' own listeners (deploy.autoscale.router).",
    )
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests per router replica.")
    max_queued_requests: int = Field(
        256, ge=1, description="Requests Serve's proxy may queue for the routers when every "
        "router replica is at max_ongoing_requests; past it a fast 503 (Serve: unbounded). "
        "With server.ingress direct, each router replica's listener takes at most "
        "max_ongoing_requests + this at once and answers 503 past it.",
    )
    num_cpus: float = Field(0.0, ge=0, description="CPUs reserved per router replica.")
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="Spread router replicas: at most this many on one node."
    )
    prefill_tokens_per_s: float = Field(
        4000.0, gt=0, description="Initial per-replica prefill rate before one is learned."
    )
    max_retries: int = Field(2, ge=0, description="Retries on the next replica before 1st token.")
    maintenance_s: float = Field(1.0, gt=0, description="How often each router replica purges "
                                 "replicas Serve dropped and pushes its metrics.")
    max_resumes: int = Field(2, ge=0, description="Times a stream cut by a failed replica "
                             "resumes on another (prompt + tokens sent); 0 = end it with an error.")
    first_token_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for a replica to start streaming (queue + "
        "prefill) before the request fails with 503.",
    )
    assign_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait for Serve to place a dispatched request on a "
        "replica; past it the request is sent again (within first_token_timeout_s). Serve "
        "was seen to strand one request in its handle queue through a scale-down.",
    )
    worker_transport: Literal["grpc", "actor"] = Field(
        "grpc", description="How the router streams from workers: Serve's direct gRPC data "
        "plane (about half the per-call latency) or Ray actor calls (Serve's default).",
    )
    stream_transport: Literal["serve", "loopback"] = Field(
        "loopback", description="How token chunks after the first reach a router from a "
        "replica on its node: a Serve stream message each, or one loopback TCP connection "
        "per request (workers.transport.loopback; start, errors and cancel stay on Serve).",
    )
    start_transport: Literal["serve", "loopback"] = Field(
        "loopback", description="With stream_transport loopback: how a request starts on "
        "a replica of the router's node whose loopback address the router has seen: "
        "Serve's handle call, or a loopback call on that socket (workers.transport.loopback_call; "
        "sent through Serve when the replica is full or unreachable). Models with "
        "serve-default autoscaling always start through Serve: it counts only its calls.",
    )
    prompt_cache: PromptCacheConfig = Field(
        default_factory=PromptCacheConfig, description="Incremental tokenization.")
    leases: LeaseConfig = Field(default_factory=LeaseConfig,
                                description="KV retention across agents' pauses.")
    prewarm: PrewarmConfig = Field(default_factory=PrewarmConfig,
                                   description="Pre-warmed scale-out.")
    policy: str = Field("kvroute", description="A named routing profile (deploy.config.routing).")
    pipeline: PipelineConfig | None = Field(
        None, description="An explicit pipeline (filters, weighted scorers, picker); "
        "overrides `policy`.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        profile(v)
        return v

    @field_validator("autoscaling")
    @classmethod
    def _router_scaling(cls, v: AutoscalingConfig | None) -> AutoscalingConfig | None:
        if v is not None and v.policy != "serve-default":
            raise ValueError("router autoscaling supports policy: serve-default only (the "
                             "kvroute policy reads the workers' prefill backlog)")
        return v

    def routing(self) -> PipelineConfig:
        return self.pipeline or profile(self.policy)
