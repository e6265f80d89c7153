"""The fleet file's `models[].rollout` section: how a model changes revision (docs/rollouts.md).

A leaf module (pydantic only): argosy/config.py takes RolloutConfig from here, and the controller's
analysis (argosy/fleet/rollout/analysis.py) takes the gate names. Every default is written here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from argosy.config_section import ConfigSection

STRATEGIES = ("canary", "blue-green", "rolling")
# Gate metrics, and whether a lower value is the better one (bounds: max/max_ratio) or a higher (min/min_ratio).
LOWER_IS_BETTER = {"error_rate": True, "ttft_p50": True, "ttft_p95": True, "itl_p95": True, "e2e_p50": True,
                   "e2e_p95": True, "tokens_per_s_per_replica": False, "shadow_agreement": False}
GateMetric = Literal["error_rate", "ttft_p50", "ttft_p95", "itl_p95", "e2e_p50", "e2e_p95",
                     "tokens_per_s_per_replica", "shadow_agreement"]




class CanaryStep(ConfigSection):
    weight: float = Field(ge=0, le=100)  # percent of the model's requests that go to the canary
    pause_s: float | None = Field(None, ge=0)  # stay this long at this weight (analysis running), then go on
    manual: bool = False  # stay until `argosy rollout promote`

    @model_validator(mode="after")
    def _one_pause(self) -> CanaryStep:
        if (self.pause_s is None) == (not self.manual):
            raise ValueError("a step has pause_s (seconds) or manual: true, not both or neither")
        return self


class AnalysisGate(ConfigSection):
    """One check of the canary against the stable revision over the same window.

    Relative: canary <= max_ratio x stable (latencies, errors) or canary >= min_ratio x stable
    (throughput, agreement). Absolute: canary <= max or >= min, in the metric's unit."""
    metric: GateMetric
    max_ratio: float | None = Field(None, gt=0)
    min_ratio: float | None = Field(None, gt=0)
    max: float | None = Field(None, ge=0)
    min: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AnalysisGate:
        lower = LOWER_IS_BETTER[self.metric]
        wrong = [k for k in (("min", "min_ratio") if lower else ("max", "max_ratio")) if getattr(self, k) is not None]
        if wrong:
            good = "max or max_ratio" if lower else "min or min_ratio"
            raise ValueError(f"gate {self.metric}: {' and '.join(wrong)} does not apply (lower is "
                             f"{'better' if lower else 'worse'}: give {good})")
        if self.metric == "shadow_agreement" and self.min_ratio is not None:
            raise ValueError("gate shadow_agreement: the stable has no agreement to compare with: give min (0..1)")
        if all(getattr(self, k) is None for k in ("max_ratio", "min_ratio", "max", "min")):
            raise ValueError(f"gate {self.metric}: give a bound (max_ratio, max, min_ratio or min)")
        return self


def _default_gates() -> list[AnalysisGate]:
    return [AnalysisGate(metric="error_rate", max=0.01), AnalysisGate(metric="ttft_p95", max_ratio=1.5)]


class AnalysisConfig(ConfigSection):
    interval_s: float = Field(30.0, gt=0)  # one analysis per interval, over the interval just past
    min_samples: int = Field(20, ge=1)  # per revision and gate; fewer in the window: inconclusive, not pass
    failure_limit: int = Field(2, ge=1)  # this many failed analyses in one rollout abort it
    require_pass: bool = True  # a canary step (and the final switch) waits for an analysis that passed
    gates: list[AnalysisGate] = Field(default_factory=_default_gates)  # []: no analysis, steps follow the clock


def _default_steps() -> list[CanaryStep]:
    return [CanaryStep(weight=10, pause_s=60), CanaryStep(weight=50, pause_s=60)]


class BlueGreenConfig(ConfigSection):
    shadow_sample: float = Field(0.25, ge=0, le=1)  # share of live requests mirrored to the preview
    analysis_passes: int = Field(2, ge=0)  # passed pre-promotion analyses before the switch
    auto_promote: bool = True  # switch once they passed; false: wait for `argosy rollout promote`
    scale_down_delay_s: float = Field(30.0, ge=0)  # the old revision stays warm (switch back at once)


class ShadowEvalConfig(ConfigSection):
    sample: float = Field(0.0, ge=0, le=1)  # canary: share of the stable's requests also sent to the canary
    max_in_flight: int = Field(16, ge=1)  # shadows beyond this are dropped, never queued
    judge_url: str | None = None  # an OpenAI-compatible server (base URL, .../v1) that scores pairs 0..1
    judge_model: str | None = None  # the judge's model name (required with judge_url)
    judge_sample: float = Field(0.1, ge=0, le=1)  # share of compared pairs sent to the judge
    judge_api_key_env: str | None = None  # environment variable holding the judge's API key

    @model_validator(mode="after")
    def _judge(self) -> ShadowEvalConfig:
        if self.judge_url is not None:
            if not self.judge_url.startswith(("http://", "https://")):
                raise ValueError(f"judge_url {self.judge_url!r} is not an http(s) URL")
            if not self.judge_model:
                raise ValueError("judge_url needs judge_model")
        return self


class RolloutConfig(ConfigSection):
    strategy: Literal["canary", "blue-green", "rolling"] = "canary"  # when `rollout start` names none
    steps: list[CanaryStep] = Field(default_factory=_default_steps, min_length=1)  # then 100%
    analysis: AnalysisConfig = AnalysisConfig()
    blue_green: BlueGreenConfig = BlueGreenConfig()
    shadow: ShadowEvalConfig = ShadowEvalConfig()
    ready_timeout_s: float = Field(600.0, gt=0)  # a new revision's replica must be ready within this, or abort
    revision_header: str = "x-argosy-revision"  # a request naming the rollout's candidate here goes to it ("": off)

    @model_validator(mode="after")
    def _agreement_needs_shadow(self) -> RolloutConfig:
        weights = [s.weight for s in self.steps]
        if weights != sorted(weights):
            raise ValueError(f"steps: weights must not decrease (got {weights})")
        if self.uses_agreement() and self.shadow.sample == 0 and self.blue_green.shadow_sample == 0:
            raise ValueError("the shadow_agreement gate needs shadow.sample > 0 (canary) or "
                             "blue_green.shadow_sample > 0 (blue-green)")
        return self

    def uses_agreement(self) -> bool:
        return any(g.metric == "shadow_agreement" for g in self.analysis.gates)
