"""What the simulator's commands (`argosy profile`, `sim`, `plan`) share: durations and lists as flags, the
roofline's flags, and one-line errors and progress on stderr."""

from __future__ import annotations

import argparse
import re
import sys

UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0}


def seconds(text: str) -> float:
    """2s, 100ms, 1.5 (seconds)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 2s, 100ms or 1.5")
    return float(m.group(1)) * UNITS[m.group(2) or "s"]


def csv_of(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list") from None
    return parse


def fail(cmd: str, e: Exception) -> int:
    sys.stderr.write(f"argosy {cmd}: error: {e}\n")
    return 2


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def add_roofline(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("roofline profile (hardware not at hand)")
    r.add_argument("--model-config", help="catalogue model (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b), "
                   "a checkpoint folder or a config.json")
    r.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    r.add_argument("--compute-efficiency", type=float, default=0.5, help="share of peak FLOP/s reached (0.5)")
    r.add_argument("--memory-efficiency", type=float, default=0.7, help="share of peak bandwidth reached (0.7)")
    r.add_argument("--cold-start", type=seconds, default=60.0, help="replica start-to-ready time (60s)")


def roofline_settings(args):
    from argosy.sim.profile import RooflineSettings

    for name in ("compute_efficiency", "memory_efficiency"):
        if not 0 < getattr(args, name) <= 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in (0, 1]")
    return RooflineSettings(args.compute_efficiency, args.memory_efficiency, args.dtype, cold_start_s=args.cold_start)
