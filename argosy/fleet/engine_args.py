"""The `argosy engine` flags of one replica, from its model's fleet-file `engine:` section."""

from __future__ import annotations

from argosy.config import ModelConfig
from argosy.engine.config_flags import engine_flags


def engine_args(cfg: ModelConfig, on_gpu: bool) -> list[str]:
    """Only what the fleet file sets (a field left out stays out, so the replica picks the engine's own
    default for its device, as `argosy engine` with no flags does), plus what the fleet decides: a
    replica placed on a GPU runs on cuda unless the file names a device."""
    e = cfg.engine
    values = {name: getattr(e, name) for name in sorted(e.model_fields_set)}
    if on_gpu and values.get("device", "auto") == "auto":
        values["device"] = "cuda"
    return engine_flags(values)
