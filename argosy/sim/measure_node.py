"""What a CPU node spends outside the engines, per output token: measured on a real `argosy serve`.

Replicas that share a node's cores (`argosy sim --node-cores`) compete with more than each other: every
token also costs CPU in the gateway (read a chunk, write a chunk), in its replica's event loop (the SSE
chunk) and in the client when it runs on the node (a load generator does). On a 2-core machine that is
a quarter of a core at 1,700 tok/s, which the engines then lack.

Measured here: `argosy serve` with one replica (the engine limits given) and `argosy bench` in closed
loop at concurrency 1, 4 and 16, outputs of OUTPUT tokens, plus one run of short outputs at concurrency
1, each run three times in turn and the median kept, with no core let idle (cores_kept_busy). The CPU
time of every thread of the serve process and its replicas except the engine's (named `argosy-engine`,
with its OpenMP workers), plus the bench's over its run (as it counts it: its start left out), over the
output tokens, is the node's CPU per token at that concurrency; the difference between the long and the
short outputs at concurrency 1 splits off what a request costs by itself. The per-token cost falls with
concurrency (a wake-up of the event loops carries more chunks), so it is kept by batch, as the serving
table is. Last, a replica is started beside the serving one under load: the CPU time its start takes
there is what the sim paces a start on a busy node by (more than alone, where CPU time ~ wall time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from argosy.sim.profile import StepProfile

ENGINE_THREAD = "argosy-engine"
CONCURRENCY = (1, 4, 16)
ROUNDS = 3
SHORT_OUTPUT = 8
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    pids, i = [root], 0
    while i < len(pids):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pids[i]}/task/{pids[i]}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        i += 1
    return pids


def _cpu_s(stat: str) -> float:
    """utime + stime from a /proc/.../stat line, in seconds."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _exec_runtime_s(task: str) -> float | None:
    """The scheduler's own count of a thread's CPU time (se.sum_exec_runtime in /proc/.../sched, in ms to the
    ns), or None where the kernel does not show it. utime + stime come rounded to clock ticks (10 ms) per
    thread: over the fifteen-odd threads of a node, up to a tenth of a CPU-second on runs of half a second."""
    with contextlib.suppress(OSError), open(f"{task}/sched") as f:
        for line in f:
            if line.startswith("se.sum_exec_runtime"):
                return float(line.split(":", 1)[1]) / 1e3
    return None


def thread_cpu(root: int) -> dict[tuple[int, int], tuple[bool, float]]:
    """CPU seconds used so far by each thread under `root` (processes included), by (pid, tid): (whether it
    is an engine's thread, seconds)."""
    out = {}
    for pid in _tree(root):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                task = f"/proc/{pid}/task/{tid}"
                with contextlib.suppress(OSError), open(f"{task}/stat") as f:
                    stat = f.read()
                    exact = _exec_runtime_s(task)
                    out[pid, int(tid)] = (stat[stat.index("(") + 1:stat.rindex(")")] == ENGINE_THREAD,
                                          _cpu_s(stat) if exact is None else exact)
    return out


def thread_cpu_s(root: int) -> tuple[float, float]:
    """CPU seconds used so far under `root` (processes included): (the engines' threads, every other)."""
    engines = rest = 0.0
    for is_engine, seconds in thread_cpu(root).values():
        if is_engine:
            engines += seconds
        else:
            rest += seconds
    return engines, rest


class CpuWatch:
    """The CPU seconds each thread under a process spent since the first look, as of its last look: a
    replica stopped between two looks keeps what it had spent at the one before."""

    def __init__(self, root: int):
        self.root, self.first, self.last = root, {}, {}
        self.look()
        self.first = dict(self.last)

    def look(self) -> None:
        self.last.update(thread_cpu(self.root))

    def spent(self) -> dict:
        """CPU seconds since the first look: {"engines": the engines' threads, "outside": every other}."""
        out = {"engines": 0.0, "outside": 0.0}
        for key, (is_engine, seconds) in self.last.items():
            out["engines" if is_engine else "outside"] += seconds - self.first.get(key, (is_engine, 0.0))[1]
        return out


def serving_cpu_s(root: int) -> float:
    """CPU seconds used so far by every thread under `root` (processes included) but the engines'."""
    return thread_cpu_s(root)[1]


def _fleet_file(tmp: Path, model: str, engine: dict) -> Path:
    import yaml

    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "profiled", "checkpoint": model, "engine": engine,
                                                "autoscaling": {"min_replicas": 1, "max_replicas": 1}}]}))
    return path


def start_serve(fleet: Path, timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
    """`argosy serve --config fleet` on a free port, in its own session; returns once a replica is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", str(fleet), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, found, urls, last = time.monotonic() + timeout_s, threading.Event(), [], [""]

    def read() -> None:  # finds the gateway's address, then keeps the pipe drained
        for line in proc.stdout:
            last[0] = line.strip() or last[0]
            if not found.is_set() and "gateway listening on " in line:
                urls.append(line.split("gateway listening on ", 1)[1].split(";")[0].strip())
                found.set()
        found.set()  # the process ended

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout_s)
    if not urls:
        stop_serve(proc)
        raise RuntimeError(f"argosy serve did not start: {last[0] or 'no output'}")
    url = urls[0]
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/admin/fleet", timeout=2) as r:
                reps = json.loads(r.read())["models"][0]["replicas"]
            if any(rep["state"] == "ready" for rep in reps):
                return proc, url
            failed = [rep for rep in reps if rep["state"] == "failed"]
            if failed:
                stop_serve(proc)
                raise RuntimeError(f"the replica behind argosy serve failed: {failed[0].get('detail') or 'no detail'}")
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    stop_serve(proc)
    raise RuntimeError("the replica behind argosy serve was not ready in time")


def stop_serve(proc: subprocess.Popen) -> None:
    """Ctrl-C to the serve process's session (it stops its replicas in order); SIGKILL after a minute."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run(url: str, root: int, concurrency: int, n: int, prompt_tokens: int, output_tokens: int,
         out: Path, idle: float = 0.0) -> tuple[float, int, int]:
    """(CPU seconds outside the engines, output tokens, requests) of one closed-loop bench run, less the
    node's `idle` CPU per second."""
    served0, t0 = serving_cpu_s(root), time.monotonic()
    subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, "--model", "profiled",
                    "--concurrency", str(concurrency), "--num-requests", str(n), "--prompt-tokens",
                    str(prompt_tokens), "--output-tokens", str(output_tokens), "--seed", str(n + concurrency),
                    "--no-progress", "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    served = serving_cpu_s(root) - served0 - idle * (time.monotonic() - t0)
    run = json.loads(out.read_text())["runs"][0]
    # The client's CPU as the bench counts it over the run itself: its interpreter start and imports
    # (about a CPU-second, varying by a few tenths) would otherwise be a few ms on every request.
    cpu = served + run["client_cpu_s"]
    ok = [r for r in run["records"] if r["ok"]]
    if len(ok) < n:
        raise RuntimeError(f"{n - len(ok)} of {n} requests failed while measuring the node's serving CPU")
    return cpu, sum(r["output_tokens"] for r in ok), len(ok)


# A spinner checks every couple of ms that its parent is still there: a spinner left behind by a killed
# profile would take a core for ever.
_SPIN = ("import os, sys\nparent = int(sys.argv[1])\n"
         "if sys.argv[2] == 'idle':\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "while os.getppid() == parent:\n    for _ in range(50_000):\n        pass\n")


@contextlib.contextmanager
def spinning_on_every_core(idle_priority: bool):
    """A spinning process on every core this process may use, for the block's length and never beyond this
    process's life. At idle priority (SCHED_IDLE) it runs only when nothing else wants the core."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid()), "idle" if idle_priority else "0"],
                                 stdin=subprocess.DEVNULL) for _ in os.sched_getaffinity(0)]
    try:
        yield
    finally:
        for s in spinners:
            s.kill()
        for s in spinners:
            s.wait()


def cores_kept_busy():
    """Idle-priority spinners on every core: they take no CPU from the serving threads, but no core ever goes
    idle. The figures are then those of a busy node, where the sim uses them: on this 2-core VM, 1 to 16
    streams on an otherwise idle node left the cores halting between chunks, and each wake-up's cost drifted
    with the host (CPU per request at 16 streams 6.5-10.8 ms in three runs minutes apart, 7.3-7.6 ms with
    spinners between them)."""
    return spinning_on_every_core(idle_priority=True)


def _median_run(runs: list[tuple[float, int, int]]) -> tuple[float, int, int]:
    """The run whose CPU per request is the median of `runs` (CPU seconds, tokens, requests each)."""
    return sorted(runs, key=lambda r: r[0] / r[2])[len(runs) // 2]


def _start_cpu_under_load(url: str, model: str, engine: dict, prompt_tokens: int, output_tokens: int,
                          tmp: Path) -> float:
    """CPU seconds a replica takes from its start to /ready while the node serves (closed loop, 4 streams).
    More than alone: a start shares caches and memory bandwidth with the serving processes."""
    from argosy.sim.measure_serving import free_port, wait_ready

    load = subprocess.Popen([sys.executable, "-m", "argosy.cli", "bench", "--url", url, "--model", "profiled",
                             "--concurrency", "4", "--duration", "300", "--prompt-tokens", str(prompt_tokens),
                             "--output-tokens", str(output_tokens), "--no-progress", "-o", str(tmp / "load.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    try:
        time.sleep(2.0)  # the load under way
        replica = subprocess.Popen([sys.executable, "-m", "argosy.cli", "engine", "--model", model, "--port", str(port),
                                    "--max-num-seqs", str(engine["max_num_seqs"]), "--max-num-batched-tokens",
                                    str(engine["max_num_batched_tokens"]), "--kv-cache-memory",
                                    str(engine["kv_cache_memory_gib"])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{port}", replica)
            with open(f"/proc/{replica.pid}/stat") as f:
                return _cpu_s(f.read())
        finally:
            replica.terminate()
            replica.wait(timeout=30)
    finally:
        load.terminate()
        load.wait(timeout=30)


def measure_node(model: str, prof: StepProfile, *, max_num_seqs: int, token_budget: int, kv_cache_memory_gib: float,
                 prompt_tokens: int = 128, output_tokens: int = 64, requests: int = 96, rounds: int = ROUNDS,
                 log: Callable[[str], None] = print) -> StepProfile:
    """`prof` with the node's CPU per output token (by concurrency) and per request outside the engines."""
    if not os.path.isdir(f"/proc/{os.getpid()}/task"):
        raise RuntimeError("measuring a node's CPU by thread needs Linux's /proc")
    if output_tokens < 2 * SHORT_OUTPUT:  # the per-request split needs outputs well apart in length
        raise ValueError(f"output_tokens must be at least {2 * SHORT_OUTPUT} to measure the node's CPU")
    engine = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": token_budget,
              "kv_cache_memory_gib": kv_cache_memory_gib}
    log(f"node CPU: argosy serve with one replica, {requests} requests at each of "
        f"{', '.join(str(c) for c in CONCURRENCY if c <= max_num_seqs)} streams ({rounds} rounds), then a start "
        "under load ...")
    with tempfile.TemporaryDirectory(prefix="argosy-node-") as tmp:
        proc, url = start_serve(_fleet_file(Path(tmp), model, engine))
        try:
            # A warm-up run first: the first requests pay for lazy imports and connection set-up.
            _run(url, proc.pid, 4, 16, prompt_tokens, output_tokens, Path(tmp) / "warm.json")
            idle0, t0 = serving_cpu_s(proc.pid), time.monotonic()
            time.sleep(2.0)  # health checks and scrapes: the node's CPU with nothing to serve
            idle = (serving_cpu_s(proc.pid) - idle0) / (time.monotonic() - t0)
            # Each run ROUNDS times, interleaved, and the median kept: the rounds of one profile were up to 43%
            # apart at 4 streams.
            levels = [c for c in CONCURRENCY if c <= max_num_seqs]
            shorts: list[tuple[float, int, int]] = []
            longs: dict[int, list[tuple[float, int, int]]] = {c: [] for c in levels}
            with cores_kept_busy():
                for _ in range(rounds):
                    shorts.append(_run(url, proc.pid, 1, requests, prompt_tokens, SHORT_OUTPUT,
                                       Path(tmp) / "short.json", idle))
                    for c in levels:
                        longs[c].append(_run(url, proc.pid, c, requests, prompt_tokens, output_tokens,
                                             Path(tmp) / f"c{c}.json", idle))
            short = _median_run(shorts)
            runs = {c: _median_run(v) for c, v in longs.items()}
            start_cpu = _start_cpu_under_load(url, model, engine, prompt_tokens, output_tokens, Path(tmp))
        finally:
            stop_serve(proc)
    (cpu_s, tok_s, n_s), (cpu_l, tok_l, n_l) = short, runs[1]
    # cpu = n x per_request + tokens x per_token, from two runs with different tokens per request
    per_token_1 = (cpu_l / n_l - cpu_s / n_s) / (tok_l / n_l - tok_s / n_s)
    per_request = max(cpu_l / n_l - per_token_1 * tok_l / n_l, 0.0)
    table = tuple((float(c), max((cpu - n * per_request) / tok, 0.0)) for c, (cpu, tok, n) in runs.items())
    log("node CPU outside the engines (gateway, event loops, client): "
        + ", ".join(f"{t * 1e6:.0f} us/token at {c:g} streams" for c, t in table)
        + f"; {per_request * 1e3:.2f} ms per request; a replica's start under load: {start_cpu:.1f} CPU-s")
    return dataclasses.replace(prof, node_token_cpu_table=table, node_request_cpu_s=per_request,
                               cold_start_cpu_s=start_cpu,
                               notes={**prof.notes, "node": {
                                   "table": [list(t) for t in table], "request_cpu_s": per_request,
                                   "start_cpu_s": start_cpu,
                                   # Each round's CPU-s and output tokens per request, by streams ("short": 1
                                   # stream, short outputs): how far the rounds were apart
                                   "rounds": {str(c): [[cpu / n, tok / n] for cpu, tok, n in v]
                                              for c, v in (("short", shorts), *longs.items())}}})
