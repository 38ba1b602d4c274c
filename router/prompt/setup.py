"""A router replica's prompt-cache settings: the environment's overrides, the shared Redis
level (``router.prompt.store``), and the bounded pool that tokenizes off the event loop."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from deploy.config import AuthConfig, IndexConfig, PromptCacheConfig
from router import telemetry
from router.prompt import store as ts

__all__ = ["PromptCacheConfig", "TokenCache", "off_loop", "tokenize_pool", "with_env",
           "with_redis"]

T = TypeVar("T")


def with_env(config: PromptCacheConfig | None = None) -> PromptCacheConfig:
    """``config`` (default: the schema's defaults) with the environment's overrides, which
    benchmarks use to compare with the cache off: ``KVROUTE_PROMPT_CACHE=0``,
    ``KVROUTE_PROMPT_CACHE_MB``, ``KVROUTE_TOKENIZE_OFFLOAD=0``, ``KVROUTE_TOKENIZE_THREADS``,
    ``KVROUTE_PROMPT_CACHE_REDIS=0|1``, ``KVROUTE_SWITCH_INTERVAL_MS``."""
    config = config or PromptCacheConfig()
    env, off = os.environ, ("0", "false", "off", "no")
    update: dict[str, Any] = {}
    if "KVROUTE_PROMPT_CACHE" in env:
        update["enabled"] = env["KVROUTE_PROMPT_CACHE"].lower() not in off
    if "KVROUTE_PROMPT_CACHE_MB" in env:
        update["max_bytes"] = int(env["KVROUTE_PROMPT_CACHE_MB"]) << 20
    if "KVROUTE_TOKENIZE_OFFLOAD" in env:
        update["offload"] = env["KVROUTE_TOKENIZE_OFFLOAD"].lower() not in off
    if "KVROUTE_TOKENIZE_THREADS" in env:
        update["threads"] = int(env["KVROUTE_TOKENIZE_THREADS"])
    if "KVROUTE_SWITCH_INTERVAL_MS" in env:
        update["switch_interval_ms"] = float(env["KVROUTE_SWITCH_INTERVAL_MS"])
    if "KVROUTE_PROMPT_CACHE_REDIS" in env:
        update["redis"] = env["KVROUTE_PROMPT_CACHE_REDIS"].lower() not in off
    return config.model_copy(update=update) if update else config


@dataclass(frozen=True, slots=True)
class TokenCache:
    """A router replica's prompt cache settings and its shared second level (or None)."""

    config: PromptCacheConfig
    store: ts.TokenStore | None = None


def with_redis(config: PromptCacheConfig, index: IndexConfig, auth: AuthConfig | None = None
               ) -> TokenCache:
    """``with_env(config)`` plus the Redis level on ``index.redis_url`` (``config.redis``;
    None: on when the URL is set), one store shared by every model's tokenizer; each key's
    share of it in the per-key metrics (labelled as ``auth`` says)."""
    config = with_env(config)
    on = config.redis if config.redis is not None else bool(index.redis_url)
    if not (on and index.redis_url and config.enabled):
        return TokenCache(config)
    return TokenCache(config, ts.TokenStore(
        index.redis_url, index.namespace, config.redis_ttl_s, timeout_s=index.timeout_s,
        backoff_s=index.backoff_s, key_bytes=config.redis_bytes_per_key,
        on_share=telemetry.redis_share("tokens", auth is not None and
                                       auth.key_names_in_metrics)))


# -- off the event loop -------------------------------------------------------------------
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def tokenize_pool(config: PromptCacheConfig) -> ThreadPoolExecutor:
    """The process's bounded pool for rendering, tokenizing and hashing prompts (the
    ``tokenizers`` library releases the GIL while it encodes). Python work on a prompt's
    ids holds the GIL, so the process's switch interval drops to ``switch_interval_ms``:
    at the default 5 ms the event loop waited that long each time it wanted the GIL back,
    and a cold 156k-token prompt stalled every stream on the router."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            sys.setswitchinterval(config.switch_interval_ms / 1e3)
            _POOL = ThreadPoolExecutor(max_workers=config.threads,
                                       thread_name_prefix="kvroute-tok")
        return _POOL


async def off_loop(config: PromptCacheConfig, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the tokenize pool, or inline when offloading is off."""
    if not config.offload:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(
        tokenize_pool(config), fn, *args)
