"""The built-in checkpoint that ships inside the package (Llama architecture; see README.md here).

``BUILTIN_MODEL_DIR`` is a Hugging Face-style checkpoint folder: config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json.
It is produced by ``scripts/train_builtin_model.py``.
"""

from pathlib import Path

BUILTIN_MODEL_DIR = Path(__file__).resolve().parent
BUILTIN_MODEL_NAME = "argosy-builtin"

__all__ = ["BUILTIN_MODEL_DIR", "BUILTIN_MODEL_NAME"]
