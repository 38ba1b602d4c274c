"""The router's Prometheus metrics (names fixed by docs/architecture.md#contracts).

Each router replica records into its own registry; ``router.app.metrics_hub``
merges every replica's samples so ``GET /metrics`` on any replica covers all.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# TTFT and TPOT: 1 ms steps to 50 ms, so a median near 10 ms per token reads as such, then
# coarser (a queue, a long prefill).
_STEPS_MS = tuple(i / 1000 for i in range(1, 51))
_TTFT = (*_STEPS_MS, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT = (*_STEPS_MS, 0.075, 0.1, 0.25, 0.5, 1)
_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

TTFT = Histogram("kvroute_ttft_seconds", "Time to first token", ["model"], buckets=_TTFT,
                 registry=REGISTRY)
TPOT = Histogram("kvroute_tpot_seconds", "Time per output token after the first", ["model"],
                 buckets=_TPOT,
                 registry=REGISTRY)
E2E = Histogram("kvroute_e2e_seconds", "Request latency, end to end", ["model"], buckets=_LAT,
                registry=REGISTRY)
ROUTE = Histogram("kvroute_route_decision_seconds", "Index lookup plus pipeline", buckets=_FAST,
                  registry=REGISTRY)
LOOKUP = Histogram("kvroute_index_lookup_seconds", "Prefix index lookup", buckets=_FAST,
                   registry=REGISTRY)
PLUGIN = Histogram("kvroute_plugin_seconds", "Time in each routing plugin", ["plugin"],
                   buckets=_FAST, registry=REGISTRY)
REQUESTS = Counter("kvroute_requests", "Routed requests by outcome", ["model", "status"],
                   registry=REGISTRY)
PROMPT_TOKENS = Counter("kvroute_prompt_tokens", "Prompt tokens", ["model"], registry=REGISTRY)
CACHED_TOKENS = Counter("kvroute_cached_tokens", "Prompt tokens the engine served from cache",
                        ["model"], registry=REGISTRY)
HOST_CACHED_TOKENS = Counter("kvroute_host_cached_tokens",
                             "Of the cached prompt tokens, those reloaded from a slower KV tier "
                             "(host memory, disk)", ["model"], registry=REGISTRY)
PREDICTED_TOKENS = Counter("kvroute_predicted_cached_tokens",
                           "Prompt tokens the router predicted cached", ["model"],
                           registry=REGISTRY)
# Per API key: the label is a key name from the config (or "keyed"
# unless auth.key_names_in_metrics), "anonymous" with keys off, "unauthenticated" for 401s.
KEY_REQUESTS = Counter("kvroute_key_requests", "API requests per key by outcome",
                       ["key", "model", "status"], registry=REGISTRY)
KEY_TOKENS = Counter("kvroute_key_tokens", "Prompt and output tokens per key",
                     ["key", "model", "kind"], registry=REGISTRY)
# A key's part of the shared Redis (store: "tokens", the prompt token store; "responses",
# stored responses), as the store counts it against the key's bound.
KEY_REDIS_SHARE = Gauge("kvroute_key_redis_share_bytes", "Bytes of the shared Redis counted "
                        "against a key (its share within a TTL)", ["key", "store"],
                        registry=REGISTRY)
KEY_REDIS_WRITTEN = Counter("kvroute_key_redis_written_bytes", "Bytes a key's requests wrote "
                            "to the shared Redis", ["key", "store"], registry=REGISTRY)
KEY_REDIS_REFUSED = Counter("kvroute_key_redis_refused_bytes", "Bytes not written to the "
                            "shared Redis: the key's share was full", ["key", "store"],
                            registry=REGISTRY)
OUTPUT_TOKENS = Counter("kvroute_output_tokens", "Generated tokens", ["model"], registry=REGISTRY)
INDEX_BLOCKS = Gauge("kvroute_index_blocks", "Entries in the prefix index (block, replica)",
                     registry=REGISTRY)
INDEX_REPLICAS = Gauge("kvroute_index_replicas", "Replicas with entries in the prefix index",
                       registry=REGISTRY)
INDEX_ERRORS = Counter("kvroute_index_errors", "Prefix index calls that failed", ["op"],
                       registry=REGISTRY)
IGNORED_FIELDS = Counter("kvroute_ignored_fields", "Unknown request fields ignored, by API and "
                         "field name (clipped to 64 characters; past 64 names per API the rest "
                         "count as _other)", ["api", "field"], registry=REGISTRY)
RETRIES = Counter("kvroute_retries", "Dispatches retried on another replica", ["model"],
                  registry=REGISTRY)
LEASE_RENEWALS = Counter("kvroute_lease_renewals", "Final answers whose session KV was "
                         "leased again for the user's pause (router.routing.leases)", ["model"],
                         registry=REGISTRY)
PREWARM = Counter("kvroute_prewarm_requests", "Prefill-only requests sent to warm new "
                  "replicas, by outcome (ok, failed)", ["model", "outcome"], registry=REGISTRY)
RESUMES = Counter("kvroute_resumed_streams", "Streams cut by a failed replica and resumed "
                  "on another (prompt + tokens sent so far)", ["model"], registry=REGISTRY)
ONGOING = Gauge("kvroute_replica_ongoing_requests", "Requests in flight per replica",
                ["model", "replica"], registry=REGISTRY)
QUEUED = Gauge("kvroute_replica_queued_prefill_tokens", "Prefill tokens queued per replica",
               ["model", "replica"], registry=REGISTRY)
ADMISSION_WAIT = Histogram("kvroute_admission_wait_seconds",
                           "Time requests were held at the router (every replica backed up)",
                           buckets=_LAT, registry=REGISTRY)
ADMISSION_HELD = Gauge("kvroute_admission_held_requests",
                       "Requests held at the router now", registry=REGISTRY)
