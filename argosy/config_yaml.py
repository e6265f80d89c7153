"""Reading the project's YAML files (the fleet file, traffic files): one line for every way one can be wrong,
and a key given twice in one mapping refused, not silently dropped. A leaf module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """The file cannot be read as YAML; the message is one line naming it (file:line:column for syntax)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, but a key given twice in one mapping is an error: YAML keeps the last, so a
    section written twice (two `models:`, two `autoscaling:` in a model) dropped the first without a word.
    Merge keys (`<<: *anchor`) still override what they merge."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    twice = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeConstructor says so below
                    continue
                if twice:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"{key!r} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """The file's YAML value (None when empty); YamlFileError in one line when it cannot be read."""
    p = Path(path)
    try:
        return yaml.load(p.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise YamlFileError(_syntax_error(p, e)) from None
    except OSError as e:
        raise YamlFileError(f"{p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise YamlFileError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _syntax_error(path: Path, e: yaml.YAMLError) -> str:
    """A YAML syntax error as one line: file:line:column, and what is wrong there."""
    mark = getattr(e, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and start is not None and mark is not None and start.line != mark.line:
        context += f" that starts at line {start.line + 1}"
    return f"{where}: YAML syntax error: {problem}" + (f" ({context})" if context else "")
