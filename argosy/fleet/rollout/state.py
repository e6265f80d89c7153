"""What the fleet keeps of a model across a restart of the gateway or the controller: the stable revision,
the traffic split, and the rollout in progress (or the last one) with where it was.

Plain dataclasses, written as JSON (store.py). Times are wall-clock seconds (time.time()): they mean
something after a restart; a step's progress is kept as seconds spent in it, so a restart resumes the
step where it was rather than counting the downtime.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any

TERMINAL = ("succeeded", "aborted", "switched_back")


class RolloutAborted(Exception):
    """Raised inside a strategy: the rollout ends, the candidate is rolled back; the message is the reason."""

MAX_EVENTS = 40
MAX_HISTORY = 10


@dataclass
class Rollout:
    id: str
    strategy: str  # canary | blue-green | rolling
    from_revision: str  # the stable revision when it started
    to_revision: str
    size: int  # replicas the stable ran when it started (canary scale, blue-green preview, rolling count)
    phase: str = "starting"  # starting, progressing | analysing, promoting | switched, then a TERMINAL one
    step: int = 0  # canary: index into the steps (len(steps): promotion)
    weight: float = 0.0  # the candidate's percent of the model's requests now
    paused: bool = False
    step_elapsed_s: float = 0.0  # seconds spent at this step while not paused
    passed_in_step: int = 0  # analyses passed at this step (blue-green: before the switch)
    analyses: dict[str, int] = field(default_factory=lambda: {"pass": 0, "fail": 0, "inconclusive": 0})
    last_analysis: dict[str, Any] | None = None
    replaced: int = 0  # rolling: replicas of the new revision in place so far
    switched_at: float | None = None  # blue-green: when all traffic moved
    promote_requested: bool = False
    full_promote: bool = False
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    reason: str | None = None  # why it ended
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def summary(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("id", "strategy", "from_revision", "to_revision", "phase", "reason",
                                               "started_at", "finished_at")}


@dataclass
class ModelState:
    model: str
    stable: str
    split: dict[str, float]  # percent per revision
    rollout: Rollout | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the last finished rollouts, newest last

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelState:
        ro = d.get("rollout")
        return cls(d["model"], d["stable"], {k: float(v) for k, v in d["split"].items()},
                   Rollout.from_dict(ro) if ro else None, list(d.get("history") or [])[-MAX_HISTORY:])

    def finish(self) -> None:
        """The rollout ended: its summary joins the history."""
        if self.rollout is not None:
            self.history = [*self.history, self.rollout.summary()][-MAX_HISTORY:]
