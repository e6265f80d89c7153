"""What a request asks its output to follow: vLLM's `StructuredOutputsParams`, checked without a tokenizer.

Exactly one of json (a JSON schema), json_object, regex, choice, grammar (EBNF, as llama.cpp's GBNF) or
structural_tag (xgrammar's format: tool calls) is set. `to_grammar()` turns it into the grammar engine's
tokenizer-independent grammar, cached by spec, so a bad spec is a 400 before the request reaches the
engine, and a spec seen before costs one dict lookup.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from argosy.engine.errors import InvalidRequestError

# JSON is written as json.dumps writes it (", " and ": "), with no free whitespace: a model may otherwise
# spend its whole budget on blank lines (vLLM added disable_any_whitespace for that). Set
# disable_any_whitespace=False to allow whitespace between tokens, vLLM's default.
_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
# The grammar engine's compile time grows about as the cube of a schema's nesting: 240 levels of nested
# anyOf took 10 s of a core, and a few such requests slowed everyone's tokens 10-30x. Real schemas (and
# pydantic's, which nest through $defs) stay far below; OpenAI's strict mode allows 10 levels of objects.
MAX_SCHEMA_DEPTH = 64  # JSON nesting of the schema document itself
_ENGINE_NOISE = re.compile(r"^\[[\d:. ]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


class StructuredOutputsError(InvalidRequestError):
    """The schema, regex, grammar or choice list cannot be compiled."""


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema (object or its text)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None  # EBNF (GBNF), root rule `root`
    structural_tag: str | dict | None = None  # xgrammar's structural tag (tool calls)
    disable_any_whitespace: bool = True
    param: str = field(default="structured_outputs", compare=False)  # the request field named in errors

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = "none" if not given else ", ".join(given)
            raise StructuredOutputsError(
                f"exactly one of {', '.join(_KINDS)} must be set for structured outputs, got {what}", self.param)
        if isinstance(self.json, dict):  # before key() writes it out (a deep one is a RecursionError there)
            _check_nesting(self.json, self.param)

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple:
        """Identifies the compiled grammar: equal keys share one compilation."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = json.dumps(value, separators=(",", ":"))  # key order kept: it is the output order
        return self.kind, value, self.disable_any_whitespace

    def to_grammar(self) -> Any:
        """The grammar engine's grammar (tokenizer-independent); StructuredOutputsError if invalid."""
        return _grammar(self.key(), self.param)


def _clean(message: str) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return _ENGINE_NOISE.sub("", lines[0] if lines else message).strip()


# xgrammar (0.2.9) writes a length-bounded JSON string's characters as [^"\\\r\n], which admits raw control
# characters that JSON forbids: such a grammar is rebuilt from its EBNF with them excluded.
_LOOSE_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'


def _json_safe(grammar: Any) -> Any:
    import xgrammar as xgr

    text = str(grammar)
    return xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR)) if _LOOSE_STRING_CHAR in text \
        else grammar


@functools.lru_cache(maxsize=256)
def _grammar(key: tuple, param: str) -> Any:
    grammar = _build(key, param)
    return _json_safe(grammar) if key[0] in ("json", "json_object", "structural_tag") else grammar


def _check_nesting(schema: Any, param: str) -> None:
    depth = _nesting(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise StructuredOutputsError(f"the JSON schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} "
                                     "are compiled (name repeated parts in $defs)", param)


def _nesting(value: Any) -> int:
    """How deep objects and arrays nest in a parsed JSON value (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _build(key: tuple, param: str) -> Any:
    import xgrammar as xgr

    kind, value, no_whitespace = key
    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise StructuredOutputsError("the JSON schema must be an object", param)
            _check_nesting(schema, param)
            return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=not no_whitespace)
        if kind == "json_object":  # any object; strict mode off, or {"type": "object"} would only allow {}
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=not no_whitespace,
                                                strict_mode=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(value)
        if kind == "choice":
            if not value or not all(isinstance(c, str) and c for c in value):
                raise StructuredOutputsError("choice must be a non-empty list of non-empty strings", param)
            return xgr.Grammar.from_regex("|".join(re.escape(c) for c in value))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(value)
        return xgr.Grammar.from_structural_tag(value)
    except StructuredOutputsError:
        raise
    except ValueError as exc:  # json.loads
        raise StructuredOutputsError(f"the JSON schema is not valid JSON: {exc}", param) from None
    except Exception as exc:  # the grammar engine's RuntimeError names what it could not convert
        raise StructuredOutputsError(f"invalid {kind.replace('_', ' ')}: {_clean(str(exc))}", param) from None
