"""The base of every fleet-file section: unknown keys refused, and a yes/no where a number or text belongs refused.
A leaf module (pydantic only), so each config_* module can build on it.

pydantic reads `True` as 1 for an int or float field, and YAML reads `yes`, `on` and `true` as True, so
`max_replicas: yes` was one replica and `target: on` a target of 1.0, without a word. Where text belongs
(`name: no`), pydantic said only "Input should be a valid string"."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _types_in(annotation: Any) -> set[Any]:
    """The plain types an annotation accepts: `int | None` -> {int, NoneType}; Annotated[x, ...] -> x's."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _types_in(typing.get_args(annotation)[0])
    if origin is typing.Literal:  # `policy: Literal["prefix", ...]`: text
        return {type(a) for a in typing.get_args(annotation)}
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_types_in(a) for a in typing.get_args(annotation)))
    return {annotation}


def takes_a_number_not_a_bool(annotation: Any) -> bool:
    accepted = _types_in(annotation)
    return bool(accepted & {int, float}) and not accepted & {bool, Any}


def takes_text_not_a_bool(annotation: Any) -> bool:
    accepted = _types_in(annotation)
    return str in accepted and not accepted & {bool, int, float, Any}


class ConfigSection(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_no_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and takes_a_number_not_a_bool(field.annotation):
            raise ValueError(f"{str(value).lower()} (a yes/no) where a number belongs: give a number")
        if isinstance(value, bool) and field is not None and takes_text_not_a_bool(field.annotation):
            raise ValueError("a yes/no where text belongs (YAML reads an unquoted yes, no, on, off, true or false as "
                             "one): quote it, e.g. \"no\"")
        return value
