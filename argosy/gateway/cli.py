"""`argosy gateway --config fleet.yaml` (`argosy keys` is keys_cli.py).

Safe default: with no keys configured the gateway needs no key, so it only binds a loopback
address; binding anything else without keys is refused unless --insecure. Beyond loopback, admin
endpoints need the admin key whatever else is set (admin.require_admin).
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import sys
import threading

from argosy.bind_errors import port_number, port_problem
from argosy.config import FleetConfigError, load_fleet, parse_fleet
from argosy.gateway import local_admin
from argosy.gateway.admin import is_loopback
from argosy.gateway.keys import KeyStore
from argosy.gateway.pepper import PepperError
from argosy.gateway.regions.auth import SecretError
from argosy.observe.logs import add_logging_arguments, setup_logging


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="fleet file (YAML); without one, the defaults")
    parser.add_argument("--host", help="override gateway.host")
    parser.add_argument("--port", type=port_number, help="override gateway.port (0: any free port)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback address with no API keys configured (anyone can use it)")
    parser.add_argument("--log-level", default="info")
    add_region_argument(parser)
    add_observe_arguments(parser)


def add_region_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="this gateway's region, a regions[].name of the fleet file (docs/regions.md)")


def in_region(fleet, region: str | None):
    """The fleet as the gateway (and controller) of one region run it; a fleet without regions as it is."""
    from argosy.config_regions import region_view

    name = region or fleet.gateway.region
    if not fleet.regions:
        if region:
            raise FleetConfigError(f"--region {region}: the fleet file has no regions")
        return fleet
    if name is None:
        raise FleetConfigError("the fleet file has regions: start each region's gateway with --region NAME ("
                               + ", ".join(r.name for r in fleet.regions) + ")")
    try:
        return region_view(fleet, name)
    except ValueError as e:
        raise FleetConfigError(str(e)) from None


def add_observe_arguments(parser: argparse.ArgumentParser) -> None:
    """`argosy gateway` and `argosy serve`: traces (--otlp-endpoint) and log flags (beside --log-level)."""
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="override gateway.otlp_endpoint: export traces over OTLP/HTTP (default: off)")
    add_logging_arguments(parser, log_level=False)


def bind(fleet, args: argparse.Namespace, prog: str) -> tuple[socket.socket, str] | None:
    """The listening socket for the gateway's address (flags over the fleet file), and its URL; None, with
    the reason printed, when the address is not loopback and no API key is configured (unless --insecure)."""
    gw = fleet.gateway
    host = args.host or gw.host
    port = gw.port if args.port is None else args.port
    if not fleet.keys and not is_loopback(host) and not args.insecure:
        print(f"{prog}: refusing to listen on {host} with no API keys configured: anyone who can "
              f"reach it could use every model.\nAdd a key first:  argosy keys add NAME --config "
              f"{getattr(args, 'config', None) or 'fleet.yaml'}\nor bind 127.0.0.1, or pass --insecure.",
              file=sys.stderr)
        return None
    try:  # keys hashed with a pepper this gateway cannot find: one line now, not 401 for every key later
        KeyStore.from_fleet(fleet)
    except (PepperError, ValueError) as e:  # ValueError: a hash that is none (an example's "scrypt:...")
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    # The shared step of `argosy gateway` and `argosy serve` before their app exists: logs and traces too.
    try:
        setup_logging(args.log_format, args.log_level, args.log_requests)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    if args.otlp_endpoint:
        gw.otlp_endpoint = args.otlp_endpoint  # replicas the fleet starts get it too (model_controller)
    gw.host = host  # the gateway app decides what needs the admin key from where it listens
    if not is_loopback(host) and fleet.admin_key_hash is None:
        print(f"{prog}: no admin key: /admin/*, /metrics/targets and /dashboard/data are disabled on {host} "
              "(argosy keys add admin --admin --config FILE)", file=sys.stderr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        print(f"{prog}: cannot listen on {host}:{port}: {port_problem(e, port)}", file=sys.stderr)
        return None
    sock.listen(4096)  # connections wait in the backlog until the app has started
    scheme = "https" if gw.tls.cert else "http"
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"{scheme}://{shown}:{sock.getsockname()[1]}"


def run_gateway(args: argparse.Namespace) -> int:

    from argosy.gateway.app import Gateway

    try:
        fleet = in_region(load_fleet(args.config) if args.config else parse_fleet({}), args.region)
    except FleetConfigError as e:
        print(f"argosy gateway: {e}", file=sys.stderr)
        return 2
    bound = bind(fleet, args, "argosy gateway")
    if bound is None:
        return 2
    sock, url = bound
    try:
        gateway = Gateway(fleet)
    except SecretError as e:
        sock.close()
        print(f"argosy gateway: {e}", file=sys.stderr)
        return 2
    print(f"argosy gateway listening on {url}" + (f" (region {fleet.gateway.region})" if gateway.regions else ""),
          flush=True)
    gateway.local_admin_digest = local_admin.issue(url)  # `argosy keys` on this machine (local_admin.py)
    try:
        return serve_on(gateway, fleet, sock)
    finally:
        local_admin.withdraw(url)


def serve_on(app, fleet, sock: socket.socket) -> int:
    """Runs an ASGI app (the gateway, or `argosy serve`'s) on a bound socket until Ctrl-C or SIGTERM."""
    import uvicorn

    tls = fleet.gateway.tls
    # log_config=None: uvicorn's own loggers go through the root handler (JSON or text, as chosen).
    # proxy_headers=False: the gateway is the front door and trusts no X-Forwarded-* header (and skips
    # that middleware's work on every request).
    from argosy.gateway.connections import guarded_protocol
    from argosy.gateway.shutdown import AnswerOnCancel

    # An idle kept-alive connection waits for its next request head as long as a new one may take for its
    # head (request_header_timeout_s, 30 s; nginx keeps one 75 s). uvicorn's own 5 s is the idle expiry of
    # httpx's and the openai client's pools: a client could send on a connection the gateway was closing,
    # and got a ServerDisconnectedError for a request never read (once in 2,368 of a bursty bench run).
    keep_alive_s = max(1, math.ceil(fleet.gateway.request_header_timeout_s))
    cfg = uvicorn.Config(AnswerOnCancel(app), http=guarded_protocol(fleet.gateway.request_header_timeout_s),
                         lifespan="on", access_log=False, log_level="warning", ssl_certfile=tls.cert,
                         ssl_keyfile=tls.key, timeout_graceful_shutdown=fleet.gateway.drain_timeout_s,
                         timeout_keep_alive=keep_alive_s,
                         log_config=None, proxy_headers=False, server_header=False)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again so the exit status says why it
    # ended; that re-raise reaches this handler: a requested, completed stop exits 0 (`podman stop`,
    # Kubernetes), as an orchestrator expects. Ctrl-C (SIGINT) keeps its 130.
    main = threading.current_thread() is threading.main_thread()  # handlers can be set from there only
    previous = signal.signal(signal.SIGTERM, _stopped) if main else None
    try:
        uvicorn.Server(cfg).run(sockets=[sock])
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _stopped(signum, frame) -> None:
    raise SystemExit(0)
