"""A Dynamo worker in front of one sim replica (run by Dynamo's venv python, not kvroute's).

    DYN_... python dynamo_shim.py --replica-socket S --events ipc://E --model-path M \\
        --model-name NAME --block-size 16 --endpoint dyn://kvroute.backend.generate

Dynamo's KV router routes only to Dynamo endpoints, so each replica gets this shim
(``ops.bench.compare.dynamo_peer``): it registers a token-in model (``ModelInput.Tokens``, chat and
completions, ``WorkerType.Aggregated``: one worker does prefill and decode), forwards each
preprocessed request (the frontend templated and tokenized it) to the replica's own
``/v1/completions`` as token ids, streamed, and relays the replica's vLLM-format ZMQ KV
events to the router with ``KvEventPublisher(zmq_endpoint=...)`` (Dynamo re-hashes the
events' ``token_ids`` itself). It runs inside a network namespace that has only loopback:
the replica is reached over a unix socket (``sock_relay`` on
the host side).

What the frontend reads back (from Dynamo 1.6.1's vLLM handler, ``dynamo/vllm/handlers.py``):
chunks ``{"token_ids": [...]}``, the last with ``finish_reason`` and ``completion_usage``
(``prompt_tokens_details.cached_tokens``: the replica's own count, so the cached ratio is
what the replica served, as for every other router). The replica streams the engine's token
ids beside the text (``return_token_ids``, as vLLM's server does); the frontend detokenizes.
Standard library, aiohttp and Dynamo only: kvroute's packages are not installed there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from dynamo.llm import (
    KvEventPublisher,
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
)
from dynamo.runtime import DistributedRuntime

_FINISH = {"stop": "stop", "length": "length"}


class Forwarder:
    """Preprocessed Dynamo request -> the replica's streamed ``/v1/completions``."""

    def __init__(self, socket_path: str, model: str, served_file: str) -> None:
        self.model, self.served_file, self.served = model, served_file, 0
        self.session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            headers={"Authorization": f"Bearer {os.environ.get('KVROUTE_DIRECT_TOKEN', '')}"})

    def count(self) -> None:
        """Requests per replica, kept in a file: the frontend drops the replica's header
        (a few bytes to the page cache, not worth a thread hop)."""
        self.served += 1
        with open(self.served_file, "w") as f:
            f.write(str(self.served))

    def body(self, request: dict[str, Any]) -> dict[str, Any]:
        stop = request.get("stop_conditions") or {}
        sampling = request.get("sampling_options") or {}
        out: dict[str, Any] = {
            "model": self.model, "prompt": list(request["token_ids"]), "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "max_tokens": stop.get("max_tokens") or 16,
            "temperature": sampling.get("temperature") or 0.0,
        }
        if sampling.get("seed") is not None:
            out["seed"] = sampling["seed"]
        return out

    async def generate(self, request: dict[str, Any], context: Any = None
                       ) -> AsyncIterator[dict[str, Any]]:
        finish, usage = None, None
        self.count()
        async with self.session.post("http://replica/v1/completions",
                                     json=self.body(request)) as r:
            if r.status != 200:
                text = (await r.text())[:300]
                yield {"token_ids": [], "finish_reason": f"error: replica HTTP {r.status}: {text}"}
                return
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    yield {"token_ids": [], "finish_reason": f"error: {chunk['error']}"}
                    return
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    if choice.get("token_ids"):  # the engine's own (return_token_ids)
                        yield {"token_ids": choice["token_ids"]}
        yield {"token_ids": [], "finish_reason": _FINISH.get(finish or "stop", "stop"),
               "completion_usage": usage}


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    endpoint = runtime.endpoint(args.endpoint)
    forward = Forwarder(args.replica_socket, args.model_name, args.served_file)
    # Created before serving, as Dynamo's own workers do; it subscribes to the relay.
    # A worker-local indexer, as Dynamo's vLLM worker has by default: the router's recovery
    # target for gaps in a worker's events (without it the router flags the worker's source).
    publisher = KvEventPublisher(endpoint, kv_block_size=args.block_size,
                                 zmq_endpoint=args.events, zmq_topic="",
                                 enable_local_indexer=True)
    await asyncio.gather(
        endpoint.serve_endpoint(forward.generate),
        register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint,
                       args.model_path, args.model_name, worker_type=WorkerType.Aggregated,
                       kv_cache_block_size=args.block_size, runtime_config=engine_config(args)))
    del publisher


def engine_config(args: argparse.Namespace) -> ModelRuntimeConfig:
    """What Dynamo's vLLM worker tells the router about its engine (``dynamo/vllm/main.py``):
    the replica's KV capacity in router-sized blocks and its sequence limit."""
    config = ModelRuntimeConfig()
    config.total_kv_blocks = args.total_kv_blocks
    config.max_num_seqs = args.max_num_seqs
    config.enable_local_indexer = True
    config.kv_event_publishing_enabled = True
    return config


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica-socket", required=True)
    p.add_argument("--events", required=True, help="the replica's KV events (ipc://...)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--model-name", required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--served-file", required=True, help="where the request count is kept")
    p.add_argument("--total-kv-blocks", type=int, help="the replica's KV, in --block-size")
    p.add_argument("--max-num-seqs", type=int, help="the replica's concurrent requests")
    p.add_argument("--endpoint", default="dyn://kvroute.backend.generate")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
