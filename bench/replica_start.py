"""A replica's start: launch to ready of `argosy engine`, against llama.cpp's llama-server on the same GGUF file.

    .venv/bin/python bench/replica_start.py [--models builtin smollm2] [--starts 5]
        [--llama-server PATH/build/bin/llama-server] [--baseline OTHER_CHECKOUT]

Each start launches the server, polls its readiness every 20 ms (`/ready` for Argosy, `/health` for
llama-server) and reads the process's CPU time before stopping it; the targets alternate within each
round, so that a machine slowing down slows all alike. Argosy runs with its defaults (on the CPU a 2 GiB
KV cache) and `OMP_NUM_THREADS=1`, as the fleet's replicas on a 2-core host get one thread each;
llama-server as in bench/llamacpp_server.py (`-t 2 -c 32768 -np 64`), on the smollm2 GGUF only (it reads
no other format). --baseline runs `argosy engine` from another checkout too (a `git worktree` of an
older commit): the same start before and after a change. --serve also launches `argosy serve --model M`
and times it to its first replica's `ready at` log line, with the serve process's resident memory (the
gateway and controller) a second later. Without --llama-server there is no peer, and the report says so.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from llamacpp_server import free_port, stop  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(cmd: list[str], ready_url: str, cwd: Path, env: dict) -> tuple[float, float]:
    """(seconds from launch to ready, CPU-seconds the process spent by then)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        with httpx.Client(timeout=1) as client:
            while time.monotonic() - t0 < 300:
                if proc.poll() is not None:
                    raise RuntimeError(f"{' '.join(cmd[:4])} exited with {proc.returncode}")
                try:
                    if client.get(ready_url).status_code == 200:
                        return time.monotonic() - t0, cpu_seconds(proc.pid)
                except httpx.TransportError:
                    pass
                time.sleep(0.02)
        raise TimeoutError(f"{' '.join(cmd[:4])} not ready after 300 s")
    finally:
        stop(proc)


def one_serve(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """`argosy serve`: (seconds from launch to its first replica's `ready at` line, the serve process's
    resident MiB a second later: the gateway and controller, not the replica)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if "ready at " in line:
                wall = time.monotonic() - t0
                time.sleep(1)
                with open(f"/proc/{proc.pid}/status") as f:
                    rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024
                return wall, rss
        raise RuntimeError(f"argosy serve exited with {proc.wait()} before a replica was ready")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # serve and its replicas
        stop(proc)


def targets(args) -> list[tuple[str, str]]:
    """(label, model) pairs; labels: argosy, baseline, llama-server, serve, serve-baseline."""
    out = []
    for model in args.models:
        out.append(("argosy", model))
        if args.baseline:
            out.append(("baseline", model))
        if args.llama_server and model == "smollm2":
            out.append(("llama-server", model))
        if args.serve:
            out += [("serve", model)] + ([("serve-baseline", model)] if args.baseline else [])
    return out


def command(label: str, model: str, args, port: int) -> tuple[list[str], str, Path, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if label == "llama-server":
        from argosy.engine.model_names import resolve_model

        lib = str(Path(args.llama_server).parent)
        env["LD_LIBRARY_PATH"] = lib + ":" + os.environ.get("LD_LIBRARY_PATH", "")
        return ([args.llama_server, "-m", str(resolve_model("smollm2")), "--host", "127.0.0.1", "--port", str(port),
                 "-t", "2", "-c", "32768", "-np", "64"], f"http://127.0.0.1:{port}/health", ROOT, env)
    tree = Path(args.baseline).resolve() if label.endswith("baseline") else ROOT
    env["PYTHONPATH"] = str(tree)  # that checkout's argosy package, not the installed one
    which = "serve" if label.startswith("serve") else "engine"
    return ([sys.executable, "-m", "argosy.cli", which, "--model", model, "--port", str(port)],
            f"http://127.0.0.1:{port}/ready", tree, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["builtin", "smollm2"], help="names or checkpoint paths")
    ap.add_argument("--starts", type=int, default=5, help="starts of each target")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (the peer)")
    ap.add_argument("--baseline", default=None, help="another checkout whose `argosy engine` to start too")
    ap.add_argument("--serve", action="store_true",
                    help="also `argosy serve --model M`: launch to its first replica ready, and its memory")
    args = ap.parse_args()
    if args.llama_server and not Path(args.llama_server).is_file():
        print(f"replica_start: no llama-server at {args.llama_server} (build it with "
              "../shared/peers/build-llama-server.sh)", file=sys.stderr)
        return 2
    if args.baseline and not (Path(args.baseline) / "argosy" / "cli.py").is_file():
        print(f"replica_start: {args.baseline} is not an Argosy checkout", file=sys.stderr)
        return 2
    pairs = targets(args)
    seen: dict[tuple[str, str], list[tuple[float, float]]] = {p: [] for p in pairs}
    for r in range(args.starts):
        for label, model in pairs if r % 2 == 0 else pairs[::-1]:
            cmd, url, cwd, env = command(label, model, args, free_port())
            if label.startswith("serve"):
                wall, rss = one_serve(cmd, cwd, env)
                seen[(label, model)].append((wall, rss))
                print(f"  start {r + 1}/{args.starts}  {label:<14} {model:<10} first replica ready after "
                      f"{wall:5.2f} s, serve process {rss:5.0f} MiB", flush=True)
                continue
            wall, cpu = one_start(cmd, url, cwd, env)
            seen[(label, model)].append((wall, cpu))
            print(f"  start {r + 1}/{args.starts}  {label:<14} {model:<10} ready after {wall:5.2f} s, "
                  f"{cpu:5.2f} CPU-s", flush=True)
    print(f"\nlaunch to ready, median of {args.starts} starts (min-max); CPU-seconds of the process by then")
    print("| target | model | start to ready | CPU | against argosy |")
    print("|---|---|---|---|---|")
    for (label, model), runs in seen.items():
        if label.startswith("serve"):
            continue
        walls = [w for w, _ in runs]
        mine = statistics.median(w for w, _ in seen[("argosy", model)])
        print(f"| {label} | {model} | {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}) | "
              f"{statistics.median(c for _, c in runs):.2f} s | {statistics.median(walls) / mine:.2f}x |")
    if args.serve:
        print("\n`argosy serve --model M`: launch to its first replica ready, and the serve process's resident "
              "memory a second later (median)")
        print("| target | model | first replica ready | serve process RSS |")
        print("|---|---|---|---|")
        for (label, model), runs in seen.items():
            if label.startswith("serve"):
                print(f"| {label} | {model} | {statistics.median(w for w, _ in runs):.2f} s | "
                      f"{statistics.median(m for _, m in runs):.0f} MiB |")
    if not args.llama_server:
        print("no peer: run with --llama-server PATH to start llama.cpp's server on the smollm2 GGUF too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
