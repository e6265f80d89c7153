"""The `argosy` command as a user runs it: make-test-model, generate, and one-line errors for bad input."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from argosy import LLM, SamplingParams
from tests.server_fixtures import ROOT


def argosy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "argosy.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli") / "tiny"
    proc = argosy("make-test-model", str(folder), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote a random-weight llama checkpoint (tiny) to {folder}" in proc.stdout
    return folder


def test_make_test_model_then_generate(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    proc = argosy("generate", "--model", str(model_dir), "Hello", "--max-tokens", "8", "--kv-cache-memory", "0.01")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # The prompt, then the greedy continuation the offline API gives, then a summary line on stderr.
    expected = LLM(str(model_dir), kv_cache_memory_gib=0.01).generate(
        "Hello", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert proc.stdout == "Hello" + expected.text + "\n"
    summary = re.search(r"\[(\d+) tokens, finish_reason=(\w+)\]", proc.stderr)
    assert summary, proc.stderr
    assert (int(summary.group(1)), summary.group(2)) == (len(expected.token_ids), expected.finish_reason)
    assert len(expected.token_ids) == 8 or expected.finish_reason == "stop"


def _no_tokenizer(model_dir, tmp_path):
    folder = tmp_path / "no-tok"
    shutil.copytree(model_dir, folder)
    (folder / "tokenizer.json").unlink()
    return [str(folder)], "tokenizer.json"


# One case per kind of error: CheckpointError, FileNotFoundError, InvalidRequestError from the engine,
# ValueError from the engine config, and an out-of-range sampling flag.
@pytest.mark.parametrize("case", [
    lambda model_dir, tmp_path: ([str(tmp_path / "no-such-model")], "does not exist"),
    _no_tokenizer,
    lambda model_dir, tmp_path: ([str(model_dir), "--max-tokens", "5000"], "max_tokens"),
    lambda model_dir, tmp_path: ([str(model_dir), "--block-size", "3"], "block_size"),
    lambda model_dir, tmp_path: ([str(model_dir), "--temperature", "-1"], "temperature"),
], ids=["missing-folder", "no-tokenizer", "max-tokens-over-context", "bad-block-size", "bad-temperature"])
def test_bad_input_gives_one_line_and_exit_2(model_dir, tmp_path, case):
    model_args, named = case(model_dir, tmp_path)
    # The case's flags come last, so they win over these.
    proc = argosy("generate", "Hello", "--max-tokens", "4", "--kv-cache-memory", "0.01", "--model", *model_args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("argosy generate: error:") and named in lines[0], proc.stderr

