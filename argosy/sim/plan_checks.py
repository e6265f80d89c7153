"""Whether a planned fleet survives losing a replica (in any one region) or a whole region, and growing it
until it does (`argosy plan --spare replica|region`).

Losing a replica: that region runs one fewer for the whole run (a region left with none fails over, as a
lost region does). Losing a region: it goes down after the warm-up; its traffic is served by the others
with the failover round trip added. Either way the fleet survives when every region's traffic still
meets the SLO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


def attainment_text(c: dict) -> str:
    """A candidate's attainment for a progress line: measured, or the bound it was stopped at."""
    if c.get("gave_up_s") is None:
        return f"attainment {c['attainment']:.3f}"
    return f"attainment at most {c['attainment']:.3f} (stopped at {c['gave_up_s']:g} s: {c['requests_missed']} " \
           "requests already missed the SLO)"


def survives_replica_loss(trial, counts: dict[str, int], run: Callable[[dict], dict]) -> bool:
    for region, n in counts.items():
        if n > 1:
            ok = run({**counts, region: n - 1})["met"]
        elif len(counts) > 1:
            ok = trial.candidate(counts, down=region)["met"]
        else:
            ok = False  # one region of one replica: nothing is left to serve
        if not ok:
            return False
    return True


def failed_region_losses(trial, counts: dict[str, int]) -> list[str]:
    """The regions whose loss the fleet does not survive (all of them when there is only one)."""
    if len(counts) < 2:
        return list(counts)
    return [r for r in counts if not trial.candidate(counts, down=r)["met"]]


def checks(trial, cand: dict, run: Callable[[dict], dict]) -> dict:
    counts = cand["replicas"]
    regions = failed_region_losses(trial, counts) if len(counts) > 1 else None
    return {"replica_loss": survives_replica_loss(trial, counts, run),
            "region_loss": None if regions is None else not regions}


def with_spare(trial, found: dict, spare: str, max_replicas: int, run: Callable[[dict], dict],
               progress: Callable[[str], None]) -> dict | None:
    """The cheapest growth of `found` that survives what `spare` names, or None within max_replicas."""
    counts = dict(found["replicas"])
    if spare == "region" and len(counts) < 2:
        progress(f"{trial.label}: --spare region needs traffic from two regions or more")
        return None
    while True:
        if spare == "replica":
            ok = survives_replica_loss(trial, counts, run)
            grow = list(counts)
        else:
            failing = failed_region_losses(trial, counts)
            ok = not failing
            grow = [r for r in counts if r not in failing] or list(counts)  # the survivors absorb the load
        if ok:
            c = run(counts)
            if c["met"]:
                return c
        if all(counts[r] >= max_replicas for r in grow):
            return None
        counts = {r: min(n + 1, max_replicas) if r in grow else n for r, n in counts.items()}
        progress(f"{trial.label}: growing to " + ", ".join(f"{r} {n}" for r, n in counts.items())
                 + f" replicas to survive the loss of a {spare}")


HEADROOM_STEPS = (1.1, 1.25, 1.5, 2.0, 3.0)  # rate multipliers tried, in order


def headroom(trial, counts: dict[str, int], progress: Callable[[str], None]) -> dict[str, dict]:
    """Per region, the largest multiple of the planned peak rate (of HEADROOM_STEPS) at which its traffic
    still meets the SLO on the same fleet: how far the load can grow before this plan fails."""
    from argosy.sim.traffic import make_requests

    if trial.spec.trace is not None:
        return {r: {"max_rate_multiplier": None, "note": "a trace's rate is not scaled"} for r in counts}
    best = dict.fromkeys(counts, 1.0)
    failed: set[str] = set()
    for m in HEADROOM_STEPS:
        spec = trial.spec.model_copy(update={"rate": trial.spec.rate * m})
        scaled = dataclasses.replace(trial, spec=spec, reqs=make_requests(spec))
        c = scaled.candidate(counts)
        progress(f"{trial.label}: at {m:g}x the peak rate -> {attainment_text(c)}")
        for r, a in c["attainment_by_region"].items():
            if r not in failed:
                if a >= trial.slo.attainment:
                    best[r] = m
                else:
                    failed.add(r)
        if len(failed) == len(counts):
            break
    return {r: {"max_rate_multiplier": m, "at_least": r not in failed} for r, m in best.items()}
