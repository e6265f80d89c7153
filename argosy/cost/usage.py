"""What was served on which GPUs: read from a simulation result, a bench result, or plain rates.

A `Usage` covers `duration_h` hours; the estimator scales it to the week or month asked for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIM_KEYS = ("duration_s", "gpu_hours", "input_tokens", "output_tokens", "token_time_split")


class UsageError(ValueError):
    """Input that does not describe any usage: a bad results file or a missing flag."""


@dataclass(frozen=True)
class Usage:
    source: str  # where it came from, for the report
    duration_h: float
    gpu_hours: dict[str, float]  # GPU name -> GPU-hours over duration_h
    input_tokens: float
    output_tokens: float
    input_share: float | None = None  # share of GPU time spent on input tokens, when measured
    utilization: float | None = None  # busy share of the GPU-hours, when measured
    requests: float | None = None
    # From a simulation or a plan: the SLO figures of what is priced ({attainment, attainment_target, met,
    # ttft_s, tpot_s}), the window priced ("steady state 120-600 s"), and the model's size in parameters.
    slo: dict | None = None
    window: str | None = None
    model_params: float | None = None

    def __post_init__(self) -> None:
        if not (self.duration_h > 0 and math.isfinite(self.duration_h)):
            raise UsageError(f"{self.source}: duration must be > 0 s")
        if not self.gpu_hours or any(not (h >= 0 and math.isfinite(h)) for h in self.gpu_hours.values()):
            raise UsageError(f"{self.source}: GPU-hours must be given per GPU and be >= 0")
        if not all(n >= 0 and math.isfinite(n) for n in (self.input_tokens, self.output_tokens)):
            raise UsageError(f"{self.source}: token counts must be finite and >= 0")
        for name, v in (("input share", self.input_share), ("utilization", self.utilization)):
            if v is not None and not 0.0 <= v <= 1.0:
                raise UsageError(f"{self.source}: {name} must be between 0 and 1, got {v}")


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


def _number(d: dict, key: str, path: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise UsageError(f"{path}: {key} must be a finite number, got {v!r}")  # json reads 1e400 as inf
    return float(v)


def from_sim(path: str, include_warmup: bool = False) -> Usage:
    """`argosy sim`'s result JSON: duration_s, gpu_hours {GPU: h}, input/output_tokens, token_time_split;
    optionally requests and gpu_busy_share (or utilization). By default its `steady` window (after the
    warm-up) is priced when it has one; `include_warmup` prices the whole run."""
    d = _read_json(path)
    if not isinstance(d, dict):
        raise UsageError(f"{path}: not a simulation result (a JSON object with {', '.join(SIM_KEYS)})")
    if "cheapest" in d and "candidates" in d:
        raise UsageError(f"{path}: this is an `argosy plan` result: price it with --plan {path}")
    whole = d
    steady = d.get("steady") if isinstance(d.get("steady"), dict) else None
    use_steady = steady is not None and not include_warmup and float(steady.get("from_s") or 0) > 0
    if use_steady:
        d = {**steady, "requests": steady.get("requests")}
    missing = [k for k in SIM_KEYS if k not in d]
    if missing:
        raise UsageError(f"{path}: not a simulation result: missing {', '.join(missing)}")
    gpu_hours, split = d["gpu_hours"], d["token_time_split"]
    if not isinstance(gpu_hours, dict) or not all(isinstance(v, int | float) for v in gpu_hours.values()):
        raise UsageError(f"{path}: gpu_hours must map GPU names to hours, e.g. {{\"H100\": 12.5}}")
    if not isinstance(split, dict) or not isinstance(split.get("input"), int | float):
        raise UsageError(f"{path}: token_time_split must be {{\"input\": f, \"output\": 1-f}}")
    duration_s = _number(d, "duration_s", path)
    if duration_s <= 0:
        raise UsageError(f"{path}: the priced window is empty (duration {duration_s:g} s)")
    busy_key = next((k for k in ("gpu_busy_share", "utilization") if d.get(k) is not None), None)
    if use_steady:
        window = f"steady state {steady['from_s']:g}-{whole['duration_s']:g} s of the simulation (warm-up left out)"
        requests = float(steady["requests"]) if isinstance(steady.get("requests"), int | float) else None
    else:
        window = f"the whole simulated run, {duration_s:g} s" + (" (warm-up included)" if steady else "")
        requests = _sim_requests(d, duration_s, path)
    model = whole.get("model") if isinstance(whole.get("model"), dict) else {}
    return Usage(source=f"simulation {path}", duration_h=duration_s / 3600,
                 gpu_hours={str(k): float(v) for k, v in gpu_hours.items()},
                 input_tokens=_number(d, "input_tokens", path), output_tokens=_number(d, "output_tokens", path),
                 input_share=float(split["input"]), requests=requests,
                 utilization=None if busy_key is None else min(_number(d, busy_key, path), 1.0),
                 slo=whole.get("slo") if isinstance(whole.get("slo"), dict) else None, window=window,
                 model_params=model.get("params") if isinstance(model.get("params"), int | float) else None)


def _sim_requests(d: dict, duration_s: float, path: str) -> float | None:
    """Requests served: a number, or the sim's {"completed": n, "measured_from_s": warmup}."""
    r = d.get("requests")
    if r is None or isinstance(r, int | float):
        return r
    if not isinstance(r, dict) or not isinstance(r.get("completed"), int | float):
        raise UsageError(f"{path}: requests must be a number or {{\"completed\": n, ...}}")
    # The sim counts requests after its warm-up but tokens over the whole run: scale the count up
    # to the whole run, so that tokens per request stay right.
    warmup_s = float(r.get("measured_from_s") or 0.0)
    return r["completed"] * duration_s / (duration_s - warmup_s) if 0 <= warmup_s < duration_s else r["completed"]


def from_bench(path: str, gpu: str, gpus: float) -> Usage:
    """`argosy bench`'s result JSON, served by `gpus` GPUs of type `gpu` for the whole run."""
    from argosy.bench import results

    try:
        result = results.load(path)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or not a bench file
        raise UsageError(f"{path}: not an argosy bench results file ({e})") from None
    summaries = [run["summary"] for run in result["runs"]]
    duration_h = sum(s["duration_s"] for s in summaries) / 3600
    return Usage(source=f"bench {path}", duration_h=duration_h, gpu_hours={gpu: gpus * duration_h},
                 input_tokens=sum(s["total_input_tokens"] for s in summaries),
                 output_tokens=sum(s["total_output_tokens"] for s in summaries),
                 requests=sum(s["completed"] for s in summaries))


def from_rates(gpu: str, gpus: float, input_tokens_per_s: float, output_tokens_per_s: float) -> Usage:
    """`gpus` GPUs serving steady token rates; one hour of it (the estimator scales it to the period)."""
    return Usage(source="flags", duration_h=1.0, gpu_hours={gpu: float(gpus)},
                 input_tokens=input_tokens_per_s * 3600, output_tokens=output_tokens_per_s * 3600)


def plan_usage(d: dict, source: str) -> Usage:
    """The usage an `argosy plan` answer carries for its chosen fleet (its steady-state window)."""
    try:
        split, model = d["token_time_split"], d.get("model") or {}
        return Usage(source=source, duration_h=float(d["duration_s"]) / 3600,
                     gpu_hours={str(k): float(v) for k, v in d["gpu_hours"].items()},
                     input_tokens=float(d["input_tokens"]), output_tokens=float(d["output_tokens"]),
                     input_share=float(split["input"]), utilization=min(float(d["gpu_busy_share"]), 1.0) or None,
                     requests=d.get("requests"), slo=d.get("slo"),
                     window=f"the planned fleet's steady state ({float(d['duration_s']):g} s simulated at the peak)",
                     model_params=model.get("params"))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"{source}: not an argosy plan answer ({type(e).__name__}: {e})") from None


def from_plan(path: str) -> Usage:
    """`argosy plan -o plan.json`: the fleet it chose, priced over its simulated steady state."""
    d = _read_json(path)
    if not isinstance(d, dict) or "answer" not in d:
        raise UsageError(f"{path}: not an argosy plan result (no 'answer'; an `argosy sim` result goes to --sim)")
    if d["answer"] is None:
        raise UsageError(f"{path}: the plan found no fleet that meets the SLOs: nothing to price")
    return plan_usage(d["answer"].get("usage"), f"plan {path}")
