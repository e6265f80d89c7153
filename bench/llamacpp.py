"""llama.cpp through llama-cpp-python, installed in a venv of its own: finding it and converting to GGUF.

Install the peer (it compiles: ~16 minutes on 2 cores):
    python3.11 -m venv PEER
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" PEER/bin/pip install 'llama-cpp-python[server]'
The HF-to-GGUF converter ships in llama-cpp-python's source package, fetched from PyPI
(`pip download --no-binary`) unless an unpacked copy is given. The converter needs a tokenizer it
knows, so the GGUF gets a small sentencepiece vocabulary: the benchmarks send token ids (or text
that both sides tokenize alike), and only the weights, which are the same, matter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import CACHE


def add_arguments(ap) -> None:
    ap.add_argument("--llamacpp-python", default=os.environ.get("LLAMACPP_PYTHON", sys.executable),
                    help="python of the venv where llama-cpp-python is installed")
    ap.add_argument("--llamacpp-src", default=None, help="unpacked llama-cpp-python source package")


def peer_version(python: str) -> str | None:
    try:
        r = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                           text=True)
    except OSError:  # no such interpreter
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def converter(src: str | None, version: str) -> Path:
    if src is None:
        dest = CACHE / f"llama-cpp-python-{version}-src"
        if not dest.exists():
            print(f"fetching llama-cpp-python {version}'s source package for its GGUF converter ...", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                f"llama-cpp-python=={version}", "-d", tmp], check=True)
                with tarfile.open(next(Path(tmp).glob("*.tar.gz"))) as tar:
                    tar.extractall(dest, filter="data")
        src = str(next(dest.glob("llama_cpp_python-*")))
    return Path(src) / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"


def to_gguf(path: str, conv: Path) -> Path:
    out = Path(path) / "model-f32.gguf"
    if out.exists():
        return out
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("config.json", "model.safetensors"):
            os.symlink(Path(path) / name, Path(tmp) / name)
        lines = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(300)]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=f"{tmp}/tokenizer", vocab_size=400,
                                       model_type="bpe", byte_fallback=True, minloglevel=2)
        env = {**os.environ, "PYTHONPATH": str(conv.parent / "gguf-py")}
        print("converting to GGUF (f32) ...", flush=True)
        subprocess.run([sys.executable, str(conv), tmp, "--outtype", "f32", "--outfile", str(out)], check=True,
                       env=env, capture_output=True)
    return out
