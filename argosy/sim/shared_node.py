"""CPU replicas sharing one node's cores in the simulation (`argosy sim --node-cores`, docs/sim.md).

Each busy replica asks for its engine's threads plus the CPU its step's tokens cost the node outside
the engine (the profile's node_token_cpu_table and node_request_cpu_s: the gateway, the event loops, a
load generator on the node); a replica that is starting asks for one core. While they ask for more than
the node has, every step runs (asked / cores) times slower than profiled: its time is scaled when it
starts, and a run of decode steps keeps the factor it started with. That factor is a mean: the kernel
runs a thread in slices, so a step that shares a core runs at full speed and loses whole slices (the
profile's time_slice_s) to the others, Poisson-many, (factor - 1) x its time on average. A start is one core's work (the
profile's cold_start_cpu_s, measured beside a serving replica; else cold_start_s, measured alone) done at
the share of a core it gets, re-paced whenever a replica starts and at each autoscaler tick. A step
also reads its weights from memory again when its neighbours have stepped since (the profile's
neighbour_step_table, by how many are at work): one replica's profile has them in cache. The CPU
outside the engines grows the same way (the profile's node_neighbour_table, against one at work). What serving
adds to a request outside the engine (the profile's request_s, measured on an idle node) is one more
thread's work there: it takes (asked + 1) / cores times as long when the node is full as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from argosy.sim.profile import StepProfile


@dataclass
class _Start:
    left_s: float  # one core's seconds of work left, as of `mark`
    mark: float
    pace: float = 1.0  # wall seconds per core second since `mark`
    version: int = 0  # of the READY event that stands


class SharedNode:
    def __init__(self, cores: float, replica_threads: float, profile: StepProfile,
                 live: Callable[[], Iterable]):
        self.cores, self.threads, self.profile = cores, replica_threads, profile
        self.live = live  # the replicas not stopped (starting, ready, draining)
        self.demand: dict = {}  # replica -> cores its step in progress asks for
        self.starts: dict = {}  # starting replica -> _Start
        self.start_cpu_s = 0.0  # one core's seconds of every start so far
        self.rng = np.random.default_rng(0)  # the slices lost: the same run gives the same answer

    def asked(self, but=None) -> float:
        """Cores asked for by every live replica but `but`."""
        total = 0.0
        for r in self.live():
            if r is but:
                continue
            if r.busy:
                total += self.demand.get(r, self.threads)
            elif r in self.starts:
                total += 1.0  # a replica's start (imports, load, warm-up) is one busy thread
        return total

    def step_factor(self, rep, seconds: float, cpu: float) -> float:
        """The time multiplier of `rep`'s step of `seconds` (as profiled) whose tokens cost the node `cpu`
        CPU seconds outside the engine."""
        self.demand[rep] = self.threads + (cpu / seconds if seconds > 0 else 0.0)
        return max(1.0, (self.demand[rep] + self.asked(rep)) / self.cores)

    def stretch(self, rep, times: list[float], cpu: float) -> list[float]:
        """`rep`'s steps of `times` seconds (as profiled, one run) on the node, whose tokens cost it `cpu` CPU
        seconds outside the engine: each stretched by the step factor on average, in whole lost slices."""
        f = self.step_factor(rep, sum(times), cpu)
        q = self.profile.time_slice_s
        if f <= 1.0 or q <= 0.0:
            return [t * f for t in times]
        lost = self.rng.poisson(np.asarray(times) * ((f - 1.0) / q))
        return [t + q * int(k) for t, k in zip(times, lost, strict=True)]

    def others_at_work(self, rep) -> int:
        """The node's other replicas stepping or starting: each streams its weights through the shared cache."""
        return sum(1 for r in self.live() if r is not rep and (r.busy or r in self.starts))

    def outside_scale(self, rep) -> float:
        """What the CPU of `rep`'s tokens outside the engines is multiplied by: the profile measured it beside
        one replica at work; beside more, the serving path's code and data are out of the cache more."""
        return self.profile.node_cpu_scale(1 + self.others_at_work(rep))

    def overhead_factor(self) -> float:
        """How many times slower a request's serving overhead (HTTP, tokenization, first chunk: one thread's
        work in the event loops) runs than profiled, given the cores asked for now."""
        return max(1.0, (self.asked() + 1.0) / self.cores)

    def neighbour_s(self, rep) -> float:
        """What `rep`'s next step takes beyond its profile because its neighbours (the node's other
        replicas at work: stepping or starting) pushed its weights out of the shared cache."""
        others = self.others_at_work(rep)
        if not others:
            return 0.0
        # Only a step that starts after the replica was off its core finds its weights gone; it is off
        # for the share of the time the node cannot give it (all at work asking for more than the cores).
        off = max(0.0, 1.0 - self.cores / (self.demand.get(rep, self.threads) + self.asked(rep)))
        return off * self.profile.neighbour_step_s(others)

    def start(self, rep, now: float) -> None:
        work = self.profile.cold_start_cpu_s or self.profile.cold_start_s
        self.start_cpu_s += work
        self.starts[rep] = _Start(work, now)

    def pace(self, now: float) -> list[tuple[float, object, int]]:
        """Re-paces every start at the share of a core it gets now: (ready time, replica, version) each."""
        events = []
        for rep, s in self.starts.items():
            s.left_s -= (now - s.mark) / s.pace
            s.mark, s.pace, s.version = now, max(1.0, (1.0 + self.asked(rep)) / self.cores), s.version + 1
            rep.ready_s = now + max(s.left_s, 0.0) * s.pace
            events.append((rep.ready_s, rep, s.version))
        return events

    def started(self, rep, version: int) -> bool:
        """A READY event for `rep`: True (and its start is over) unless a later pacing replaced it."""
        s = self.starts.get(rep)
        if s is None or s.version != version:
            return False
        del self.starts[rep]
        return True

    def forget(self, rep) -> None:
        """`rep` is stopped."""
        self.demand.pop(rep, None)
        self.starts.pop(rep, None)
