"""GGUF checkpoints: loading per tensor type, the tokenizer from metadata, the same tokens as the Hugging Face
path, serving end to end, and bad files rejected with a clear error."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from argosy import LLM, SamplingParams  # noqa: E402
from argosy.engine import quant_kernels  # noqa: E402
from argosy.engine.checkpoint import CheckpointError, load_model_config  # noqa: E402
from argosy.engine.gguf.file import gguf_model_config  # noqa: E402
from argosy.engine.gguf.loader import GGUFWeights  # noqa: E402
from argosy.engine.gguf.tokenizer import gguf_tokenizer  # noqa: E402
from argosy.engine.quant_linear import QuantEmbedding, QuantLinear  # noqa: E402
from argosy.engine.random_model import make_random_model  # noqa: E402
from tests.gguf_fixtures import hf_to_gguf, permute  # noqa: E402
from tests.test_quant_kernels import random_blocks  # noqa: E402

DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
LONGER = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["It is a truth universally acknowledged", "Hello, my name is", "1 2 3"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("hf") / "llama", arch="llama", **DIMS)


def greedy(model: str, **kwargs) -> list[list[int]]:
    with LLM(model, kv_cache_memory_gib=0.05, **kwargs) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_every_tensor_type_loads_as_gguf_dequantizes_it(tmp_path, llama_folder):
    types = {"blk.0.attn_q.weight": "F16", "blk.0.attn_k.weight": "BF16", "blk.0.attn_v.weight": "Q8_0",
             "blk.0.attn_output.weight": "Q4_0", "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q8_0"}
    path = hf_to_gguf(llama_folder, tmp_path / "mixed.gguf", "F32", tensor_types=types)
    # The K-quants (the gguf package only dequantizes them): random valid blocks in a file of their own.
    kquants = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(kquants), "llama")
    for name, qtype in (("q4k", 12), ("q5k", 13), ("q6k", 14)):
        writer.add_tensor(name, random_blocks(qtype, 8, 512), raw_dtype=gguf.GGMLQuantizationType(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cfg = gguf_model_config(path)
    for file, names in ((path, list(types) + ["blk.0.ffn_down.weight"]), (kquants, ["q4k", "q5k", "q6k"])):
        weights = GGUFWeights(file, cfg, reader=gguf.GGUFReader(file))
        weights.arch = "qwen2"  # no q/k permutation here: the bytes as stored
        for name in names:
            t = weights.tensors[name]
            ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
            ours = quant_kernels.dequantize_rows(weights.quant(name)) if weights.has_kernel(name) \
                else weights.float32(name)
            assert ours.numpy().view(np.uint32).tolist() == ref.view(np.uint32).tolist(), name


def test_llama_q_and_k_rows_are_put_back(tmp_path, llama_folder):
    from safetensors.torch import load_file

    path = hf_to_gguf(llama_folder, tmp_path / "q8.gguf", "Q8_0")
    weights = GGUFWeights(path, gguf_model_config(path))
    hf = load_file(str(llama_folder / "model.safetensors"))
    for name, hf_name in (("blk.1.attn_q.weight", "q_proj"), ("blk.1.attn_k.weight", "k_proj")):
        ours = quant_kernels.dequantize_rows(weights.quant(name))
        ref = hf[f"model.layers.1.self_attn.{hf_name}.weight"]
        assert (ours - ref).abs().max() < 0.02 * ref.abs().max()  # Q8_0 rounding, rows in HF order
    assert not np.array_equal(permute(np.arange(8 * 4).reshape(8, 4), 2), np.arange(8 * 4).reshape(8, 4))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float_gguf_gives_the_hf_path_tokens(tmp_path_factory, arch):
    folder = make_random_model(tmp_path_factory.mktemp(arch) / arch, arch=arch, **DIMS)
    path = hf_to_gguf(folder, folder.parent / f"{arch}.gguf", "F32")
    assert gguf_model_config(path).architecture == load_model_config(folder).architecture
    assert greedy(str(path)) == greedy(str(folder))


def test_quantized_gguf_matches_the_same_blocks_quantized_at_load(tmp_path, llama_folder):
    path = hf_to_gguf(llama_folder, tmp_path / "q8.gguf", "Q8_0", tensor_types={"token_embd.weight": "F32"})
    with LLM(str(path), kv_cache_memory_gib=0.05) as llm:
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and isinstance(layer.mlp.down_proj, QuantLinear)
        from_file = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert from_file == greedy(str(llama_folder), quantization="q8_0")


def test_quantized_embedding_is_shared_with_a_tied_output(tmp_path_factory):
    folder = make_random_model(tmp_path_factory.mktemp("tied") / "tied", arch="llama", tie_word_embeddings=True,
                               **DIMS)
    path = hf_to_gguf(folder, folder.parent / "tied.gguf", "Q4_0")
    with LLM(str(path), kv_cache_memory_gib=0.05) as llm:
        model = llm.engine.runner.model
        assert isinstance(model.embed_tokens, QuantEmbedding)
        assert model.lm_head.segments[0] is model.embed_tokens.table
        assert len(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


def test_tokenizer_from_metadata_matches_tokenizers(tmp_path, llama_folder):
    from tokenizers import Tokenizer as HFTokenizer

    path = hf_to_gguf(llama_folder, tmp_path / "t.gguf", "F32")
    ours, ref = gguf_tokenizer(path), HFTokenizer.from_file(str(llama_folder / "tokenizer.json"))
    texts = ["It is a truth universally acknowledged, 12345!", "  two  spaces\n\nand lines", "naïve café 東京 🚀",
             "<|im_start|>user\nhi<|im_end|>", "don't I'll we've"]
    for text in texts:
        assert ours.encode(text) == ref.encode(text).ids, text
        ids = ref.encode(text).ids
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
    assert ours.eos_token_id == ref.token_to_id("</s>") and ours.bos_token_id == ref.token_to_id("<s>")
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_sentencepiece_vocabulary_matches_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["It is a truth universally acknowledged, that a single man in possession of a good "
                                 "fortune, must be in want of a wife.", "However little known the feelings or views "
                                 "of such a man may be on his first entering a neighbourhood 1234.",
                                 "Emma Woodhouse, handsome, clever, and rich, with a comfortable home."] * 20))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    writer = gguf.GGUFWriter(str(tmp_path / "sp.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    writer.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
    types = [3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 6 if sp.is_byte(i) else 1
             for i in range(sp.get_piece_size())]
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = gguf_tokenizer(tmp_path / "sp.gguf")
    for text in ["It is a truth universally acknowledged", "fortune 5678, Emma!", "Zebra quux ünïcode"]:
        assert ours.encode(text) == [1, *sp.encode(text)], text
        assert ours.decode(sp.encode(text)) == sp.decode(sp.encode(text))


def test_a_gguf_file_served_end_to_end(tmp_path, llama_folder):
    from openai import OpenAI

    from tests.server_fixtures import ServerProcess

    path = hf_to_gguf(llama_folder, tmp_path / "served.gguf", "Q4_1")
    with ServerProcess(str(path), served_name="tiny-gguf") as server:
        client = OpenAI(base_url=server.base_url, api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny-gguf"]
        out = client.completions.create(model="tiny-gguf", prompt="Hello", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 8 and out.choices[0].text
        chat = client.chat.completions.create(model="tiny-gguf", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5, temperature=0)
        assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1


def _rewritten(good, out, meta=None, tensors=None, arrays=None):
    """`good` written again by gguf's writer with some metadata values replaced (key -> value, typed as the
    original), some arrays added (key -> (values, item type)) and some tensors' data changed (name ->
    function of the data; None drops the tensor)."""
    reader = gguf.GGUFReader(good)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            value = (meta or {}).get(key, field.contents())
            kind = gguf.GGUFValueType.STRING if isinstance(value, str) and sub is None else field.types[0]
            writer.add_key_value(key, value, kind, sub_type=sub)
    for key, (values, sub) in (arrays or {}).items():
        writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=sub)
    for t in reader.tensors:
        data = (tensors or {}).get(t.name, lambda d: d)(t.data)
        if data is not None:
            writer.add_tensor(t.name, np.ascontiguousarray(data),
                              raw_dtype=None if t.tensor_type == gguf.GGMLQuantizationType.F32 else t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _bad_files(tmp_path, llama_folder):
    good = hf_to_gguf(llama_folder, tmp_path / "good.gguf", "Q8_0")
    data = good.read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    # A metadata string that is not UTF-8 (gguf decodes strings when read, after the file is parsed).
    at = data.index(b"general.architecture") + len(b"general.architecture") + 4 + 8  # value type, string length
    (tmp_path / "utf8.gguf").write_bytes(data[:at] + b"\xff" + data[at + 1:])
    arch = hf_to_gguf(llama_folder, tmp_path / "arch.gguf", "F32", arch="phi3")
    kind = hf_to_gguf(llama_folder, tmp_path / "kind.gguf", "F32")
    blob = bytearray(kind.read_bytes())
    # Retype one tensor's header (its name, then dims, then the type) as Q2_K, which Argosy does not read.
    name = b"blk.0.attn_norm.weight"
    at = blob.index(name) + len(name) + 4 + 8  # n_dims (uint32), one dim (uint64)
    blob[at:at + 4] = int(gguf.GGMLQuantizationType.Q2_K).to_bytes(4, "little")
    (tmp_path / "kind.gguf").write_bytes(bytes(blob))
    # A kept (quantized) tensor with half the rows the config needs: refused at load, not at the first step.
    cut = _rewritten(good, tmp_path / "shape.gguf", tensors={"blk.0.ffn_down.weight": lambda d: d[: d.shape[0] // 2]})
    return {"truncated": ("truncated", tmp_path / "truncated.gguf"),
            "shape": ("blk.0.ffn_down.weight have 128 rows in all, where the model's config needs 256", cut),
            "magic": ("not a GGUF file", tmp_path / "magic.gguf"),
            "utf8": ("GGUF metadata general.architecture cannot be read (UnicodeDecodeError", tmp_path / "utf8.gguf"),
            "arch": ("unsupported GGUF architecture 'phi3'", arch),
            "kind": ("'blk.0.attn_norm.weight' has type Q2_K", tmp_path / "kind.gguf")}


def test_bad_files_are_rejected_with_a_clear_error(tmp_path, llama_folder):
    for label, (message, path) in _bad_files(tmp_path, llama_folder).items():
        with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
            LLM(str(path), kv_cache_memory_gib=0.05)
        if label == "magic":  # and from the command line: one line, exit 2, no traceback
            run = subprocess.run([sys.executable, "-m", "argosy.cli", "generate", "--model", str(path), "hi"],
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 2 and "not a GGUF file" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("meta, tensors, named", [
    ({"llama.attention.head_count": 0}, None, "num_heads is 0"),
    ({"llama.attention.head_count": 3}, None, "3 attention heads do not share its 2 KV heads"),
    ({"llama.block_count": 1_000_000}, None, "its config gives 1000000 layers; its weights hold layers 0-1 (2 in all)"),
    ({"llama.block_count": "two"}, None, "llama.block_count is 'two', not a number"),
    ({"llama.context_length": 0}, None, "max_position_embeddings is 0"),
    ({"llama.rope.freq_base": float("nan")}, None, "rope_theta is nan"),
    ({"llama.attention.key_length": 15}, None, "head_dim is 15: RoPE needs an even one"),
    ({"tokenizer.ggml.bos_token_id": 1_000_000}, None, "bos_token_id 1000000 is not a token of its 512-token"),
    ({"tokenizer.ggml.bos_token_id": "one"}, None, "tokenizer.ggml.bos_token_id is 'one', not a token id"),
    ({"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1, 1]}, None,
     "the tokenizer in its metadata cannot be built"),
    (None, {"blk.1.attn_q.weight": lambda d: None}, "lacks tensor 'blk.1.attn_q.weight'"),
    (None, {"output_norm.weight": lambda d: d[:10]}, "'model.norm.weight' has shape (10,), expected (256,)"),
], ids=["no-heads", "heads-kv-uneven", "a-million-blocks", "count-a-string", "no-context", "nan-rope", "odd-head",
        "bos-outside", "bos-a-string", "tokens-cut", "tensor-missing", "norm-short"])
def test_hostile_metadata_and_tensors_are_a_checkpoint_error_naming_them(tmp_path, llama_folder, meta, tensors,
                                                                         named):
    """Values no model has (from a corrupt or hostile file) were a ZeroDivisionError, KeyError, IndexError or a
    bare ValueError mid-load, or at the first request: each is now refused at load with what is wrong."""
    good = hf_to_gguf(llama_folder, tmp_path / "good.gguf", "Q8_0")
    bad = _rewritten(good, tmp_path / "bad.gguf", meta, tensors)
    with pytest.raises(CheckpointError, match=re.escape(named)):
        LLM(str(bad), kv_cache_memory_gib=0.05)


def test_gguf_config_from_metadata(tmp_path, llama_folder):
    path = hf_to_gguf(llama_folder, tmp_path / "c.gguf", "F32")
    ours, ref = gguf_model_config(path), load_model_config(llama_folder)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "rope_theta", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(ref, field), field
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps)


def test_one_token_steps_in_one_c_call_give_the_layer_by_layer_tokens(tmp_path, llama_folder, monkeypatch):
    path = str(hf_to_gguf(llama_folder, tmp_path / "q41.gguf", "Q4_1", tensor_types={"blk.1.attn_v.weight": "Q8_0"}))
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        assert "forward" in vars(llm.engine.runner.model)  # the one-token path is installed
        fused = [llm.generate(p, LONGER, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]  # one stream
    monkeypatch.setenv("ARGOSY_QUANT_DECODE", "0")
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        assert "forward" not in vars(llm.engine.runner.model)
        layered = [llm.generate(p, LONGER, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    assert fused == layered


def test_decode_steps_of_several_sequences_in_one_c_call_are_the_layer_by_layer_steps(tmp_path, llama_folder,
                                                                                      monkeypatch):
    """csrc/quant_decode_batch.c: a step of 3+ decodes through every layer in one call computes the very numbers
    the model's own forward does (the same kernels, in one OpenMP region), bit for bit."""
    if not quant_kernels.bf16_products_available():
        pytest.skip("this CPU has no AVX512-BF16: batches keep float32 products, which the one-call path leaves alone")
    from argosy.engine import quant_decode
    from argosy.engine.models.llama import LlamaForCausalLM

    path = str(hf_to_gguf(llama_folder, tmp_path / "q41.gguf", "Q4_1", tensor_types={"blk.1.attn_v.weight": "Q8_0"}))
    fused_call, batch_sizes = quant_decode.OneCallDecoder.decode_batch, []

    def checked(self, input_ids, positions, kv_caches, meta):
        layered = LlamaForCausalLM.forward(self.model, input_ids, positions, kv_caches, meta)
        fused = fused_call(self, input_ids, positions, kv_caches, meta)  # rewrites the same K/V
        assert torch.equal(fused, layered)
        batch_sizes.append(input_ids.numel())
        return fused

    monkeypatch.setattr(quant_decode.OneCallDecoder, "decode_batch", checked)
    prompts = PROMPTS + ["It is a truth universally acknowledged, that a single man", "Once upon a time"]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (20, 6, 14, 9, 24)]
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert set(batch_sizes) == {5, 4, 3}  # two sequences left: the layers' own path; one: quant_decode.c
    monkeypatch.setenv("ARGOSY_QUANT_DECODE", "0")
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        assert fused == [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    monkeypatch.delenv("ARGOSY_QUANT_DECODE")
    batch_sizes.clear()
    with LLM(path, kv_cache_memory_gib=0.05, quant_batch_dtype="float32") as llm:  # float32 batches: not taken
        assert "forward" in vars(llm.engine.runner.model)  # (the one-token path is)
        llm.generate(prompts, params, use_tqdm=False)
    assert batch_sizes == []


def test_the_batched_decode_call_refuses_a_bad_slot_length_or_table():
    if not quant_kernels.bf16_products_available():
        pytest.skip("this CPU has no AVX512-BF16: the batched call refuses every step (-1), and is never made")
    lib = quant_kernels._library()
    slots, lens, tables = (torch.tensor(v, dtype=torch.int64) for v in ([0, 1, 2], [1, 1, 1], [[0], [0], [0]]))

    def call(slots, lens, tables, layers=1):  # the checks come before any weight or activation is read
        return lib.quant_decode_batch(layers, 0, 0, 3, 256, 4, 2, 64, 512, 1e-5, 0, 0, tables.data_ptr(),
                                      tables.shape[1], lens.data_ptr(), slots.data_ptr(), 16, 4, 0.125, 2)

    assert call(slots, lens, tables, layers=0) == 0  # these pass the checks (no layer: nothing else is read)
    for bad in (call(torch.tensor([0, 1, 64]), lens, tables), call(slots, torch.tensor([1, 17, 1]), tables),
                call(slots, lens, torch.tensor([[0], [4], [0]])), call(slots, torch.tensor([1, 0, 1]), tables)):
        assert bad == -1


@pytest.mark.parametrize("file_type", ["Q4_1", "F16", "BF16"])
def test_quantized_kernels_give_the_dequantized_float_model_tokens(tmp_path, llama_folder, monkeypatch, file_type):
    embed = "Q8_0" if file_type == "Q4_1" else file_type
    path = str(hf_to_gguf(llama_folder, tmp_path / "q.gguf", file_type, tensor_types={"token_embd.weight": embed}))

    def batch_and_single_streams(llm) -> list[list[int]]:  # a batch: 4x4 tiles; one stream: the single-row path
        both = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        return both + [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]

    with LLM(path, kv_cache_memory_gib=0.05, quant_batch_dtype="float32") as llm:  # the batch: float32 tiles
        kept = batch_and_single_streams(llm)
        down = llm.engine.runner.model.layers[0].mlp.down_proj
        assert isinstance(down, QuantLinear) and down.segments[0].name == embed.replace("Q8_0", "Q4_1")
        if file_type != "Q4_1":  # 16-bit weights stay 2 bytes each
            assert down.weight_bytes() == 2 * down.in_features * down.out_features
    monkeypatch.setattr(quant_kernels, "available", lambda: False)  # every tensor dequantized to float32 at load
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        assert not any(isinstance(m, QuantLinear) for m in llm.engine.runner.model.modules())
        assert kept == batch_and_single_streams(llm)


def test_quant_batch_dtype_reaches_every_quantized_layer(tmp_path, llama_folder, monkeypatch):
    path = str(hf_to_gguf(llama_folder, tmp_path / "q8.gguf", "Q8_0"))
    kinds = set(quant_kernels.KERNEL_TYPES)
    expected = {"float32": set(), "auto": kinds - {0} if quant_kernels.bf16_products_available() else set()}
    if quant_kernels.bf16_products_available():
        expected["bfloat16"] = kinds  # F32 (0) too, only when asked for
    logits = {}
    for choice, bf16 in expected.items():
        with LLM(path, kv_cache_memory_gib=0.05, quant_batch_dtype=choice) as llm:
            model = llm.engine.runner.model
            layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
            assert layers and all(m.bf16_batch_types == bf16 for m in layers)
            rows = torch.randn(5, layers[-1].in_features, generator=torch.Generator().manual_seed(0))
            with torch.no_grad():  # a batch of 5 rows through the output layer
                logits[choice] = model.lm_head(rows)
    if "bfloat16" in expected:  # the rounding shows, and stays small
        diff = ((logits["bfloat16"] - logits["float32"]).norm() / logits["float32"].norm()).item()
        assert 0 < diff < 1e-2
    monkeypatch.setattr(quant_kernels, "bf16_products_available", lambda: False)  # a CPU without AVX512-BF16
    with pytest.raises(ValueError, match="AVX512-BF16"):
        LLM(path, kv_cache_memory_gib=0.05, quant_batch_dtype="bfloat16")


def test_a_16_bit_tensor_of_odd_width_stays_float32(tmp_path_factory, monkeypatch):
    """F16 rows are taken in runs of 32: a width that is not a multiple of 32 (here the MLP's 200) loads as
    float32, the rest stays 2 bytes a weight, and the tokens are those of the file read all in float32."""
    dims = {**DIMS, "intermediate_size": 200}
    folder = make_random_model(tmp_path_factory.mktemp("odd") / "odd", arch="llama", **dims)
    path = str(hf_to_gguf(folder, folder.parent / "odd.gguf", "F16"))
    with LLM(path, kv_cache_memory_gib=0.05, quant_batch_dtype="float32") as llm:
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
        assert not isinstance(layer.mlp.down_proj, QuantLinear)  # 200 inputs
        kept = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    monkeypatch.setattr(quant_kernels, "available", lambda: False)
    assert kept == greedy(path)


def test_the_fast_reader_reads_every_field_and_tensor_as_gguf_does(tmp_path, llama_folder):
    """reader.py parses metadata arrays in one pass (1.5 s of SmolLM2's 2.5 s start was gguf's per-element
    parse); what it gives must be what gguf.GGUFReader gives, arrays of every kind and empty ones included."""
    from argosy.engine.gguf.reader import FastGGUFReader

    good = hf_to_gguf(llama_folder, tmp_path / "good.gguf", "Q8_0")
    extra = {"test.floats": ([0.5, -2.25, 1e-3], gguf.GGUFValueType.FLOAT32),
             "test.bools": ([True, False, True], gguf.GGUFValueType.BOOL),
             "test.u64": ([2**63 + 1, 0], gguf.GGUFValueType.UINT64),
             "test.words": (["", "héllo wörld", "日本語", "a b"], gguf.GGUFValueType.STRING)}
    out = _rewritten(good, tmp_path / "arrays.gguf", arrays=extra)
    theirs, ours = gguf.GGUFReader(out), FastGGUFReader(out)
    assert list(ours.fields) == list(theirs.fields)
    for key in theirs.fields:
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    assert ours.fields["test.words"].contents() == extra["test.words"][0]
    assert ours.fields["tokenizer.ggml.tokens"].contents()[:3] == theirs.fields["tokenizer.ggml.tokens"].contents()[:3]
    assert ours.data_offset == theirs.data_offset and len(ours.tensors) == len(theirs.tensors) > 0
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.shape.tolist(), a.n_bytes, a.data_offset) == \
            (b.name, b.tensor_type, b.shape.tolist(), b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)


@pytest.mark.parametrize("where", ["a-string-past-the-end", "cut-in-the-vocabulary", "a-count-of-2**40"])
def test_a_token_list_cut_short_or_lying_about_a_length_is_a_checkpoint_error(tmp_path, llama_folder, where):
    good = hf_to_gguf(llama_folder, tmp_path / "good.gguf", "F32")
    data = bytearray(good.read_bytes())
    key = b"tokenizer.ggml.tokens"
    first = data.index(key) + len(key) + 4 + 4 + 8  # value type (array), item type, count: the first length
    if where == "a-string-past-the-end":
        data[first:first + 8] = (2**40).to_bytes(8, "little")
    elif where == "a-count-of-2**40":  # refused before a string is read, not after a walk to the file's end
        data[first - 8:first] = (2**40).to_bytes(8, "little")
    else:
        data = data[:first + 500]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    named = "does not fit in the file" if where == "a-count-of-2**40" else "truncated or corrupt"
    with pytest.raises(CheckpointError, match=named):
        gguf_model_config(bad)


def test_the_fast_reader_reads_empty_arrays_as_gguf_does(tmp_path):
    """gguf's writer refuses empty arrays; other writers need not: a file written by hand."""
    import struct

    from argosy.engine.gguf.reader import FastGGUFReader

    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    string, array, int32 = (int(gguf.GGUFValueType.STRING), int(gguf.GGUFValueType.ARRAY),
                            int(gguf.GGUFValueType.INT32))
    kvs = [key("general.architecture") + struct.pack("<I", string) + key("llama"),
           key("test.no_strings") + struct.pack("<IIQ", array, string, 0),
           key("test.no_ints") + struct.pack("<IIQ", array, int32, 0),
           key("test.one_int") + struct.pack("<IIQi", array, int32, 1, -7)]
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    theirs, ours = gguf.GGUFReader(path), FastGGUFReader(path)
    assert {k: f.contents() for k, f in ours.fields.items()} == {k: f.contents() for k, f in theirs.fields.items()}
    assert ours.fields["test.no_strings"].contents() == [] and ours.fields["test.one_int"].contents() == [-7]
