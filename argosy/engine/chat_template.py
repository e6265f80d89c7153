"""Chat templates: finding a checkpoint's template and rendering it like transformers' apply_chat_template."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(jinja2.ext.Extension):
    # HF's `{% generation %}` marks assistant text for training masks; for serving, render the body unchanged.
    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # HF replaces jinja's tojson: no HTML escaping, and json.dumps' options.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=32)
def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _flatten_message(message: Mapping[str, Any]) -> dict[str, Any]:
    # Like transformers, drop None fields, so `message.content is defined` reads the same in templates.
    msg = {k: v for k, v in message.items() if v is not None}
    if isinstance(msg.get("content"), list):
        texts = []
        for part in msg["content"]:
            if isinstance(part, str):
                texts.append(part)
            elif part.get("type", "text") == "text":
                texts.append(part["text"])
            else:
                raise ValueError(f"Unsupported content part type {part.get('type')!r}: only text parts are supported.")
        msg["content"] = "\n".join(texts)  # vLLM joins text parts with a newline too
    return msg


def load_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The checkpoint's template: chat_template.jinja, else chat_template.json, else tokenizer_config.json's
    (`config`; of named templates, "default" or the first)."""
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default", next(iter(named.values()), None))
    json_file = folder / "chat_template.json"
    if json_file.is_file():
        template = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template", template)
    jinja_file = folder / "chat_template.jinja"  # the newer layout wins over tokenizer_config.json
    return jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else template


def render_chat_template(template: str, messages: list[Mapping[str, Any]], add_generation_prompt: bool,
                         context: Mapping[str, Any], continue_final_message: bool = False) -> str:
    """Render `template` over `messages`, with `context`'s variables (special tokens, tools, ...); a template
    that rejects the conversation raises ValueError. continue_final_message: the text ends where the last
    message's content does, without its end-of-turn tokens, so the model goes on writing it (transformers')."""
    try:
        flat = [_flatten_message(m) for m in messages]
        text = _compile_template(template).render(messages=flat, add_generation_prompt=add_generation_prompt,
                                                  **context)
    except (jinja2.TemplateError, TypeError) as e:  # a template that rejects the messages: a bad request
        raise ValueError(f"Chat template error: {e}") from e
    if not continue_final_message:
        return text
    final = flat[-1].get("content") if flat else None
    if not isinstance(final, str) or not final.strip() or final.strip() not in text:
        raise ValueError("continue_final_message: the last message's content does not appear in the rendered "
                         "chat, so there is nothing to continue")
    # Cut after the last message's text; its trailing whitespace is kept only where the template kept it.
    at = text.rindex(final.strip())
    kept = final.lstrip()
    return text[: at + len(kept)] if text[at:at + len(kept)] == kept else text[: at + len(final.strip())]
