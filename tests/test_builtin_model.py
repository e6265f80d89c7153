"""The built-in checkpoint shipped in argosy/models/builtin/: complete, Llama, small, and actually trained."""

from __future__ import annotations

import json
import math
import re

import pytest

from argosy.models.builtin import BUILTIN_MODEL_DIR

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

D = BUILTIN_MODEL_DIR
FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "README.md",
    "heldout_sample.txt",
]
MAX_BYTES = 30 * 1000 * 1000


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(D))


@pytest.fixture(scope="module")
def model():
    m = transformers.AutoModelForCausalLM.from_pretrained(str(D), dtype=torch.float32)
    m.eval()
    return m


def test_files_present_and_small():
    for name in FILES:
        assert (D / name).is_file(), f"missing {name}"
    assert (D / "model.safetensors").stat().st_size <= MAX_BYTES
    total = sum(p.stat().st_size for p in D.iterdir() if p.is_file())
    assert total <= MAX_BYTES, f"built-in model folder is {total / 1e6:.1f} MB"


def test_config_is_small_llama_with_gqa():
    cfg = json.loads((D / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["tie_word_embeddings"] is True
    assert cfg["max_position_embeddings"] >= 512
    assert cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta")


def test_safetensors_fp32_and_parameter_count():
    from safetensors import safe_open

    n = 0
    with safe_open(str(D / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for key in keys:
            t = f.get_slice(key)
            assert t.get_dtype() == "F32", key
            n += math.prod(t.get_shape())
    assert "model.embed_tokens.weight" in keys
    assert "lm_head.weight" not in keys  # tied embeddings
    assert 1_000_000 < n <= 7_500_000


def test_generation_config_eos(tokenizer):
    gc = json.loads((D / "generation_config.json").read_text())
    eos = gc["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    assert tokenizer.convert_tokens_to_ids("</s>") in eos
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in eos
    assert gc["bos_token_id"] == tokenizer.convert_tokens_to_ids("<s>")


@pytest.mark.parametrize(
    "text",
    [
        "It is a truth universally acknowledged.",
        "  spaces   and\ttabs\nand newlines\n\n",
        "unicode: café naïve über — “quotes” 東京 서울 🙂🚀",
        "<|im_start|>user\nhi<|im_end|>\n",
    ],
)
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<s>")  # the post-processor adds <s>
    assert tokenizer.decode(ids[1:]) == text
    raw = tokenizer(text, add_special_tokens=False).input_ids
    assert raw == ids[1:]


def test_special_tokens(tokenizer):
    for tok in ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]:
        i = tokenizer.convert_tokens_to_ids(tok)
        assert i is not None and i < 8, tok
        assert tokenizer(tok, add_special_tokens=False).input_ids == [i]  # never split into bytes


def test_chat_template_renders_generation_prompt(tokenizer):
    assert (D / "chat_template.jinja").read_text() == tokenizer.chat_template
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Good morning!"},
        {"role": "assistant", "content": "Good morning to you."},
        {"role": "user", "content": "Shall we walk?"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<s><|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert "<|im_start|>assistant\nGood morning to you.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nShall we walk?<|im_end|>\n<|im_start|>assistant\n")
    no_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert no_prompt.endswith("Shall we walk?<|im_end|>\n")
    # The template already carries <s>: encode the rendered text without adding special tokens again.
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids.count(tokenizer.convert_tokens_to_ids("<s>")) == 1


def _sample_loss(model, tokenizer) -> tuple[float, int]:
    text = (D / "heldout_sample.txt").read_text()
    ids = torch.tensor([tokenizer(text).input_ids])
    assert ids.shape[1] <= model.config.max_position_embeddings
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    return loss, ids.shape[1]


def test_heldout_loss_matches_readme_and_beats_uniform(model, tokenizer):
    loss, n = _sample_loss(model, tokenizer)
    assert n > 200
    uniform = math.log(model.config.vocab_size)
    assert loss < 0.65 * uniform, f"held-out sample loss {loss:.3f} vs uniform {uniform:.3f}"
    readme = (D / "README.md").read_text()
    m = re.search(r"heldout_sample\.txt`?[^\n]*?\*\*(\d+\.\d+)\*\*", readme)
    assert m, "README.md must state the heldout_sample.txt loss in bold"
    assert abs(float(m.group(1)) - loss) <= 0.011, (m.group(1), loss)


def test_greedy_continuation_is_wordlike(model, tokenizer):
    enc = tokenizer("It was a fine morning, and", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=24, pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 8, text
    assert sum(c.isalpha() or c.isspace() for c in text) >= 0.8 * len(text), text
