"""What each engine setting declares beside its default: help text, flag, allowed values, range.

EngineConfig's fields carry a `Setting` (`dataclasses.field(metadata=...)`, through `setting()`), and
everything else is generated from it: `argosy engine`'s and `argosy generate`'s flags (config_flags.py),
the fleet file's `engine:` section (argosy/config.py) and the range check that EngineConfig runs on
construction, so `LLM(...)`, the flags and the fleet file accept and refuse the same values with the
same message. This module imports neither torch nor pydantic: the gateway reads it too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Setting:
    help: str
    flag: str | None = ""  # "" : --the-field-name; None: no flag (set by the command itself)
    short: str | None = None  # e.g. -tp
    metavar: str | None = None
    choices: tuple | None = None
    at_least: float | None = None
    above: float | None = None  # strictly greater than this
    at_most: float | None = None
    power_of_two: bool = False
    pattern: tuple[str, str] | None = None  # (regular expression, what it allows in words)
    fleet: bool = True  # may be set in a fleet file's `engine:` section

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of the right type ("must be at least 1"), or None. None passes."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return "must be " + _one_of(self.choices)
        if self.pattern is not None and not re.fullmatch(self.pattern[0], value):
            return "must be " + self.pattern[1]
        if self.power_of_two and (value < 1 or value & (value - 1) or value > (self.at_most or value)):
            return f"must be a power of two from 1 to {self.at_most:g}"
        if self.above is not None and not value > self.above:
            upper = f" and at most {self.at_most:g}" if self.at_most is not None else ""
            return f"must be greater than {self.above:g}{upper}"
        if self.at_least is not None and value < self.at_least:
            return f"must be at least {self.at_least:g}"
        if self.at_most is not None and value > self.at_most:
            return f"must be at most {self.at_most:g}"
        return None


def _one_of(choices: tuple) -> str:
    names = [str(c) for c in choices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def setting(default: Any = dataclasses.MISSING, help: str = "", **spec: Any) -> Any:  # noqa: A002 - argparse's word
    """A dataclass field with its Setting: `block_size: int = setting(16, "tokens per KV block", ...)`."""
    return dataclasses.field(default=default, metadata={"setting": Setting(help=help, **spec)})


class Declared(NamedTuple):
    """One field that declares a Setting: the dataclass field, its Setting, its value type (int for
    `int | None`) and whether None is allowed (None means: the engine picks)."""

    field: dataclasses.Field
    setting: Setting
    kind: type
    nullable: bool

    def check(self, value: Any) -> Any:
        return check_value(self.field.name, value, self.setting, self.kind, self.nullable)


@functools.cache
def settings_of(cls: type) -> dict[str, Declared]:
    """name -> Declared for every field of cls that declares a Setting, in field order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        s = f.metadata.get("setting")
        if s is None:
            continue
        hint, nullable = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = typing.get_args(hint)
            nullable = type(None) in args
            (hint,) = [a for a in args if a is not type(None)]
        out[f.name] = Declared(f, s, hint, nullable)
    return out


def check_value(name: str, value: Any, s: Setting, kind: type, nullable: bool) -> Any:
    """The value, checked (type, then range); raises ValueError naming the setting. An int is taken
    where a float is asked for (and returned as a float)."""
    if value is None:
        if nullable:
            return None
        raise ValueError(f"{name} must be set (it has no 'auto' value)")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name} must be {_kind_name(kind)}, got {value!r}")
    if kind is float and not math.isfinite(value):  # NaN passes every comparison below
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    problem = s.problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}, got {value!r}")
    return value


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, kind.__name__)
