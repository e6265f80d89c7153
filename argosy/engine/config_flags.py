"""Engine flags generated from EngineConfig's fields, and back.

`add_engine_flags` gives `argosy engine`, `argosy generate` and the torchrun entry the same flags, with
the defaults, help and choices the fields declare; `engine_config_from_args` builds the EngineConfig
(which range-checks every value); `engine_flags` turns settings into the command line that gives them
to `argosy engine` (the fleet controller's replicas).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from argosy.engine.config import EngineConfig
from argosy.engine.settings import Setting, settings_of

SETTINGS = settings_of(EngineConfig)


def flag_name(name: str, s: Setting) -> str:
    return s.flag or "--" + name.replace("_", "-")


def flag_settings() -> dict[str, Setting]:
    """The settings that are flags, by field name."""
    return {name: d.setting for name, d in SETTINGS.items() if d.setting.flag is not None}


def add_engine_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    for name, (f, s, kind, _) in SETTINGS.items():
        if s.flag is None:
            continue
        names = [flag_name(name, s), *([s.short] if s.short else [])]
        if kind is bool:  # a flag that flips the default: --no-prefix-caching, --compile-matvec
            parser.add_argument(*names, dest=name, action="store_false" if f.default else "store_true",
                                help=s.help)
            continue
        shown = "" if f.default is None else f" (default: {f.default})"
        parser.add_argument(*names, dest=name, type=kind, default=f.default, choices=s.choices, metavar=s.metavar,
                            help=s.help + shown)


def engine_config_from_args(args: argparse.Namespace, **fixed: Any) -> EngineConfig:
    """The EngineConfig of parsed flags; `fixed` sets what the command decides (model, usage).
    Raises ValueError (naming the setting) for a value out of range."""
    values = {name: getattr(args, name) for name in flag_settings() if hasattr(args, name)}
    return EngineConfig(**{**values, **fixed})


def engine_flags(values: Mapping[str, Any]) -> list[str]:
    """The flags that set these settings (name -> value) on `argosy engine`; a value equal to the field's
    default for a switch, or None, adds nothing."""
    out: list[str] = []
    for name, value in values.items():
        if name not in SETTINGS or SETTINGS[name].setting.flag is None:
            raise ValueError(f"{name} is not an engine flag")
        f, s, kind, _ = SETTINGS[name]
        if kind is bool:
            if value != f.default:
                out.append(flag_name(name, s))
        elif value is not None:
            out += [flag_name(name, s), str(value)]
    return out
