"""The rollouts' Prometheus series (`argosy_rollout_*`, docs/metrics.md), on the gateway's registry.

State (the split, the phase, the step, the last analysis's gate values) is read from each model's
RolloutManager when scraped; counters count analyses and finished rollouts as they happen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from argosy.fleet.rollout.manager import RolloutManager

DURATION = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


class RolloutMetrics:
    def __init__(self, r: CollectorRegistry, managers: Callable[[], Iterable[RolloutManager]]):
        self.analyses = Counter("argosy_rollout_analyses", "Rollout analyses by verdict (pass, fail, inconclusive)",
                                ["model", "strategy", "verdict"], registry=r)
        self.finished = Counter("argosy_rollout_finished", "Rollouts ended, by outcome (succeeded, aborted, "
                                "switched_back)", ["model", "strategy", "outcome"], registry=r)
        self.duration = Histogram("argosy_rollout_duration_seconds", "Rollout start to its end",
                                  ["strategy", "outcome"], buckets=DURATION, registry=r)
        r.register(RolloutCollector(managers))


class RolloutCollector(Collector):
    def __init__(self, managers: Callable[[], Iterable[RolloutManager]]):
        self.managers = managers

    def collect(self) -> Iterator[Metric]:
        weight = GaugeMetricFamily("argosy_rollout_weight_percent", "Share of the model's requests per revision",
                                   labels=["model", "revision"])
        stable = GaugeMetricFamily("argosy_rollout_stable", "1 for the model's stable revision",
                                   labels=["model", "revision"])
        active = GaugeMetricFamily("argosy_rollout_in_progress", "1 while a rollout runs, by strategy and phase",
                                   labels=["model", "strategy", "phase"])
        paused = GaugeMetricFamily("argosy_rollout_paused", "1 while the model's rollout is paused", labels=["model"])
        step = GaugeMetricFamily("argosy_rollout_step", "The canary step the rollout is at (0-based)",
                                 labels=["model"])
        gate = GaugeMetricFamily("argosy_rollout_gate_value", "The last analysis's value per gate and side "
                                 "(seconds for latencies)", labels=["model", "metric", "side"])
        for m in list(self.managers()):
            st = m.state
            for rev, w in st.split.items():
                weight.add_metric([st.model, rev], w)
            stable.add_metric([st.model, st.stable], 1)
            r = st.rollout
            if r is None or r.done:
                continue
            active.add_metric([st.model, r.strategy, r.phase], 1)
            paused.add_metric([st.model], 1 if r.paused else 0)
            step.add_metric([st.model], r.step)
            for g in (r.last_analysis or {}).get("gates", []):
                for side in ("candidate", "stable"):
                    if g.get(side) is not None:
                        gate.add_metric([st.model, g["metric"], side], g[side])
        yield from (weight, stable, active, paused, step, gate)
