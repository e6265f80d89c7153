"""Small GGUF files for the tests, written with the `gguf` package's own writer.

`hf_to_gguf` converts a random-weight Hugging Face checkpoint (random_model.py) the way llama.cpp's
converter lays one out: llama-style q/k rows permuted for its RoPE, names blk.N.*, the byte-level
BPE vocabulary and merges, special tokens and chat template in `tokenizer.*` metadata. Tensors are
quantized with the `gguf` package's quantizer (F32, F16, Q8_0, Q4_0, Q4_1, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
        "MistralForCausalLM": "llama"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    rest = hf.removeprefix("model.layers.")
    layer, _, rest = rest.partition(".")
    module, _, kind = rest.rpartition(".")
    return f"blk.{layer}.{LAYER[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for q and k of llama-architecture files."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tokenizer(writer, folder: Path) -> None:
    import gguf

    tok = json.loads((folder / "tokenizer.json").read_text())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
    size = max([*vocab.values(), *added]) + 1
    tokens = [""] * size
    for text, i in vocab.items():
        tokens[i] = text
    for i, text in added.items():
        tokens[i] = text
    types = [gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    writer.add_bos_token_id(ids[cfg["bos_token"]])
    writer.add_eos_token_id(ids[cfg["eos_token"]])
    writer.add_unk_token_id(ids[cfg["unk_token"]])
    writer.add_add_bos_token(True)
    writer.add_chat_template(cfg["chat_template"])


def hf_to_gguf(folder: str | Path, out: str | Path, qtype: str = "F32", arch: str | None = None,
               tensor_types: dict[str, str] | None = None) -> Path:
    """Writes `folder`'s checkpoint as one GGUF file; `tensor_types` overrides the type of single tensors."""
    import gguf

    folder, out = Path(folder), Path(out)
    cfg = json.loads((folder / "config.json").read_text())
    arch = arch or ARCH[cfg["architectures"][0]]
    writer = gguf.GGUFWriter(str(out), arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_vocab_size(cfg["vocab_size"])
    write_tokenizer(writer, folder)
    for hf, w in load_file(str(folder / "model.safetensors")).items():
        name = gguf_name(hf)
        w = w.astype(np.float32)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            w = permute(w, heads if ".attn_q." in name else kv_heads)
        kind = (tensor_types or {}).get(name, qtype if w.ndim == 2 else "F32")
        t = gguf.GGMLQuantizationType[kind]
        if t == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, w)
        elif t == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, t), raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
