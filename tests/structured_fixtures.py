"""A tiny random-weight checkpoint whose chat template writes tools, calls and results as Qwen 2.5's does
(Hermes format), and a server for it."""

from __future__ import annotations

import json
from pathlib import Path

# Written for these tests in the shape of Qwen 2.5's template: tools in the system turn, calls as
# <tool_call> blocks, results as <tool_response> in a user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Call a function as <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- continue %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message.tool_calls %}\n<|im_start|>assistant\n"
    "{{ message['content'] }}{%- for call in message.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n"
    "</tool_call>{%- endfor %}<|im_end|>"
    "{%- elif message['role'] == 'tool' %}\n<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n"
    "</tool_response><|im_end|>"
    "{%- else %}\n<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)


def make_tool_model(folder: Path) -> str:
    from argosy.engine.random_model import make_random_model

    make_random_model(folder, arch="qwen2", init_std=0.2, vocab_size=512)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TOOL_TEMPLATE
    config_file.write_text(json.dumps(config))
    return str(folder)
