"""The driver's control connections to its ranks, and stopping them (shared by every launcher:
launch.py's and ray_ranks.py's).

Each step's inputs go from the driver to every rank over one connection per rank, not a collective, so
an idle rank waits without a timeout and sees the driver's death as the connection closing. Locally
spawned ranks get a pipe; the others, possibly on other hosts, a TCP connection
(multiprocessing.connection, so the same Connection interface, authenticated with a random key):
once every rank has joined the process group, the driver broadcasts its listening address and key
over it, and each rank connects and names itself.
"""

from __future__ import annotations

import pickle
import secrets
import socket
from multiprocessing.connection import Client, Connection, Listener

import torch.distributed as dist

from argosy.engine.parallel.state import ParallelState

STOP_TIMEOUT_S = 5.0  # a rank asked to stop gets this long before it is killed


def ip_toward(host: str, port: int) -> str:
    """This host's address on the route to host (UDP connect sends nothing); loopback stays loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port))
        return s.getsockname()[0]


def accept_ranks(ps: ParallelState, host: str, listener_box: list) -> list[Connection]:
    """The driver: listens on host, tells every rank where (over the process group), and returns one
    connection per rank 1..N-1, in rank order. listener_box receives the listener so that close() can
    unblock an accept() still waiting when the engine fails to start."""
    key = secrets.token_bytes(32)
    listener = Listener((host, 0), authkey=key)
    listener_box.append(listener)
    try:
        dist.broadcast_object_list([listener.address, key], src=0)
        conns: dict[int, Connection] = {}
        while len(conns) < ps.world_size - 1:
            conn = listener.accept()
            conns[pickle.loads(conn.recv_bytes())] = conn
    finally:
        listener.close()
    return [conns[r] for r in range(1, ps.world_size)]


def connect_to_driver(ps: ParallelState) -> Connection:
    box: list = [None, None]
    dist.broadcast_object_list(box, src=0)
    address, key = box
    conn = Client(tuple(address), authkey=key)
    conn.send_bytes(pickle.dumps(ps.rank))
    return conn


def send_stop(conns: list[Connection]) -> None:
    """Asks each rank to stop (one that is already gone is skipped)."""
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("stop", None)))
        except (OSError, ValueError):
            pass


def close_connections(conns: list[Connection], listeners: list) -> None:
    """Closes the control connections and listeners, and leaves the process group."""
    for c in [*conns, *listeners]:
        try:
            c.close()
        except OSError:
            pass
    if dist.is_initialized():
        dist.destroy_process_group()
