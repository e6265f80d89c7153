"""A listening socket that cannot be bound, said in words a person can act on (every `argosy` server)."""

from __future__ import annotations

import argparse
import errno


def port_number(text: str) -> int:
    """argparse's type for --port: 0 (any free port) to 65535, else one line naming the range."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: 0 (any free one) to 65535")
    return port


def port_problem(e: OSError, port: int) -> str:
    """What to do about a failed bind, in words."""
    if e.errno == errno.EADDRINUSE:
        return ("the port is already in use (another argosy serve or gateway?): stop it, or pass --port N "
                "(--port 0 picks a free one)")
    if e.errno == errno.EACCES:
        return f"permission denied (ports below 1024 need privileges): pass --port {max(port, 8000)}"
    if e.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address: pass --host 127.0.0.1 or one of its own addresses"
    return e.strerror or str(e)
