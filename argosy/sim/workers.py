"""Worker processes for the simulator's parallel runs: `argosy plan`'s configurations and `argosy sim --week`'s
load levels.

Spawned, not forked: the parent may hold threads (torch's, the CLI's). Ctrl-C is the parent's, which stops
its workers; a parent killed outright (SIGKILL) runs no cleanup, so each worker exits on its own once its
parent is gone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from argosy.engine.host_cores import usable_cores


def worker_count(requested: int | None, tasks: int) -> int:
    """The workers to start: as asked, else one per usable core (cgroup quota included), at most one a task."""
    return max(1, min(requested or usable_cores(), tasks))


def spawn_context():
    return mp.get_context("spawn")


def start_worker(parent: int) -> None:
    """First thing in a worker: leave Ctrl-C to the parent, and watch for the parent's end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)
