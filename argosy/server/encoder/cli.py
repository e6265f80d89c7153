"""`argosy engine --model DIR` where DIR holds an encoder checkpoint: serve it over HTTP.

The LLM server's flags carry over where they mean the same: --dtype, --device, --max-num-seqs and
--max-num-batched-tokens (a forward pass's sequences and tokens), --max-model-len (tokens per input),
--max-queue (requests waiting; 503 past it), --max-body-bytes; --max-client-batch-size is the encoder's
own (inputs per request; 413 past it). The fleet controller starts encoder replicas with the same flags.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable
from pathlib import Path


def run_encoder_server(args: argparse.Namespace, model: Path, bind: Callable[[str, int], socket.socket],
                       default_port: int) -> None:
    """`bind` and `default_port` are argosy engine's (server/cli.py), so both servers listen alike."""
    import prometheus_client
    import uvicorn

    from argosy.encoder.checkpoint import EncoderCheckpointError, load_encoder_spec
    from argosy.encoder.config import MAX_CLIENT_BATCH_SIZE, EncoderConfig
    from argosy.observe.logs import setup_logging
    from argosy.server.encoder.app import build_encoder_app

    if args.max_queue < 1:
        raise SystemExit("argosy engine: --max-queue must be at least 1")
    try:
        spec = load_encoder_spec(model)
        config = EncoderConfig(model=str(model), dtype=args.dtype, device=args.device,
                               max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                               max_model_len=args.max_model_len, cpu_threads=args.cpu_threads,
                               max_client_batch_size=getattr(args, "max_client_batch_size", None)
                               or MAX_CLIENT_BATCH_SIZE)
    except (ValueError, EncoderCheckpointError) as exc:
        raise SystemExit(f"argosy engine: {exc}") from None
    # A packaged model is served under the name it was asked by (its folder is just "model").
    packaged = args.model and Path(args.model) != model
    served = args.served_model_name or (args.model if packaged else model.resolve().name)
    setup_logging(args.log_format, args.log_level, args.log_requests)

    def make_engine():  # runs in the engine thread
        from argosy.encoder.engine import EncoderEngine

        return EncoderEngine(config)

    port = args.port if args.port is not None else getattr(args, "port_default", default_port)
    sock = bind(args.host, port)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    failures: list[BaseException] = []

    def on_ready() -> None:
        print(f"argosy engine: ready, serving {served} ({spec.kind}) at {url}/v1", flush=True)

    def on_failed(exc: BaseException) -> None:
        failures.append(exc)
        print(f"argosy engine: the encoder for {model} failed ({type(exc).__name__}: {exc}); exiting", flush=True)
        server.should_exit = True

    prometheus_client.disable_created_metrics()
    app = build_encoder_app(served, make_engine, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                            on_ready=on_ready, on_failed=on_failed)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=5, log_config=None))
    print(f"argosy engine: listening on {url}, loading {served} ({spec.kind}) from {model} ...", flush=True)
    server.run(sockets=[sock])
    if failures:
        raise SystemExit(1)
