"""Tokenizer loading, BOS/EOS handling and chat templates, checked against transformers on the same folder."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from argosy.engine.bpe_builder import build_test_tokenizer
from argosy.engine.tokenizer import Tokenizer

CORPUS = [
    "Tokenizers split text into pieces. Byte-level BPE starts from the 256 bytes and merges frequent pairs.",
    "The weather today is sunny with a light breeze; tomorrow it may rain in the hills and the valleys.",
    "Numbers like 42, 3.14159 and 1,000,000 appear in text, and so do emails like someone@example.com.",
    "Café, naïve, über, 東京, 北京, 서울 and emoji such as 🙂 and 🚀 are rarer but must survive a round trip.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
] * 4

STRINGS = [
    "Hello world",
    "  leading and   runs of   spaces  ",
    "tabs\tand\nnewlines\n\n\n",
    "unicode: café naïve über",
    "CJK: 東京 北京 서울",
    "emoji: 🙂🚀✨👩‍👩‍👧 done",
    "special tokens in text: <s> and </s> here",
    "",
    "1234567890 3.14159",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "Be brief & <kind>."},
    {"role": "user", "content": "Héllo 🙂, what's 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Thanks"},
]


def _train_byte_bpe() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("hf_tok")
    fast = PreTrainedTokenizerFast(tokenizer_object=_train_byte_bpe(), bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder


def _auto(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_encode_decode_match_transformers(hf_folder):
    ours, theirs = Tokenizer.from_pretrained(hf_folder), _auto(hf_folder)
    for text in STRINGS:
        for add in (True, False):
            ids = ours.encode(text, add_special_tokens=add)
            assert ids == theirs.encode(text, add_special_tokens=add), (text, add)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.decode(ours.encode(text)) == text.replace("<s>", "").replace("</s>", "")
    assert ours.encode("x")[0] == ours.bos_token_id == theirs.bos_token_id
    assert ours.vocab_size == len(theirs)
    assert ours.eos_token_id == theirs.eos_token_id and ours.eos_token_ids == {theirs.eos_token_id}
    assert set(theirs.all_special_ids) <= ours.all_special_ids
    ids = ours.encode("Hello 🙂")
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)


def test_long_texts_encode_as_transformers_does_and_bound_their_length(hf_folder):
    """Texts from GIL_FREE_CHARS on go through encode_batch (which releases the GIL); the ids must not change.
    max_chars bounds the text any number of tokens can hold."""
    from argosy.engine.tokenizer import GIL_FREE_CHARS

    ours, theirs = Tokenizer.from_pretrained(hf_folder), _auto(hf_folder)
    text = " ".join(STRINGS) * (GIL_FREE_CHARS // len(" ".join(STRINGS)) + 2)
    assert len(text) >= GIL_FREE_CHARS
    for add in (True, False):
        assert ours.encode(text, add_special_tokens=add) == theirs.encode(text, add_special_tokens=add)
    vocab = theirs.get_vocab()
    longest = max(vocab, key=len)
    assert ours.max_chars(100) == 2 * 100 * len(longest)
    # The bound's premise: no token covers more text than the longest vocabulary entry, even a text made of
    # that very token (its byte-level spelling is at least as long as the text it stands for).
    piece = theirs.decode([vocab[longest]])
    many = ours.encode(piece * 50, add_special_tokens=False)
    assert len(piece * 50) <= len(many) * len(longest) and len(many) <= 50 + 1


def test_chat_template_matches_transformers(hf_folder):
    ours, theirs = Tokenizer.from_pretrained(hf_folder), _auto(hf_folder)
    assert ours.has_chat_template
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b <é>"}}]
    for add_generation_prompt in (True, False):
        for extra in ({}, {"tools": tools}):
            expected = theirs.apply_chat_template(MESSAGES, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **extra)
            assert ours.apply_chat_template(MESSAGES, add_generation_prompt=add_generation_prompt, **extra) == expected
    assert "<é>" in ours.apply_chat_template(MESSAGES, tools=tools)  # HF's tojson does not escape


def test_continue_final_message_matches_transformers(hf_folder):
    ours, theirs = Tokenizer.from_pretrained(hf_folder), _auto(hf_folder)
    for final in ("The answer is", "The answer is ", "  {\"a\": "):
        messages = [*MESSAGES[:2], {"role": "assistant", "content": final}]
        expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                              continue_final_message=True)
        got = ours.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
        assert got == expected and not got.endswith("</s>\n")
    with pytest.raises(ValueError, match="continue_final_message"):
        ours.apply_chat_template([*MESSAGES[:2], {"role": "assistant", "content": "  "}], add_generation_prompt=False,
                                 continue_final_message=True)


def test_template_switches_reach_the_template(hf_folder):
    ours = Tokenizer.from_pretrained(hf_folder)
    switch = "{% if enable_thinking is defined and not enable_thinking %}NO THINKING{% endif %}"
    assert ours.apply_chat_template(MESSAGES, chat_template=switch, enable_thinking=False) == "NO THINKING"
    assert ours.apply_chat_template(MESSAGES, chat_template=switch) == ""


def test_chat_content_parts_are_flattened(hf_folder):
    ours = Tokenizer.from_pretrained(hf_folder)
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    assert ours.apply_chat_template(parts) == ours.apply_chat_template([{"role": "user", "content": "first\nsecond"}])
    with pytest.raises(ValueError, match="image_url"):
        ours.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_template_errors_are_value_errors(hf_folder):
    ours = Tokenizer.from_pretrained(hf_folder)
    with pytest.raises(ValueError, match="bad role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="Chat template error"):
        ours.apply_chat_template(MESSAGES, chat_template="{% for %}")


def _write(folder, name, data):
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_config_variants(tmp_path):
    _train_byte_bpe().save(str(tmp_path / "tokenizer.json"))
    added = {"content": "</s>", "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    _write(tmp_path, "tokenizer_config.json", {
        "bos_token": "<s>", "eos_token": added,  # the AddedToken dict form
        "chat_template": [{"name": "tool_use", "template": "TOOLS"},
                          {"name": "default", "template": "{{ strftime_now('%Y') }}|{{ messages[0]['content'] }}"}],
    })
    _write(tmp_path, "generation_config.json", {"eos_token_id": [2, 7]})
    _write(tmp_path, "config.json", {"eos_token_id": 9, "bos_token_id": 1})
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.eos_token == "</s>" and tok.eos_token_id == 2 and tok.eos_token_ids == {2, 7, 9}
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) in {
        f"{datetime.now().year}|hi", f"{datetime.now().year - 1}|hi"}  # the year may turn during the call
    _write(tmp_path, "chat_template.jinja", "JINJA {{ messages | length }}")  # the newer layout wins
    assert Tokenizer.from_pretrained(tmp_path).apply_chat_template([{"role": "user", "content": "hi"}]) == "JINJA 1"


def test_no_chat_template_and_missing_files(tmp_path):
    _train_byte_bpe().save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_pretrained(tmp_path)  # no tokenizer_config.json at all
    assert not tok.has_chat_template and tok.eos_token_ids == set()
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json and tokenizer.model") as err:
        Tokenizer.from_pretrained(empty)
    assert str(empty) in str(err.value)


@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory):
    sentencepiece = pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("spm_tok")
    # Llama's settings: BPE with byte fallback, no normalization, whitespace kept as is.
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(folder / "tokenizer"), vocab_size=360, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    _write(folder, "tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                                             "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                                             "add_eos_token": False, "legacy": False})
    return folder


def test_sentencepiece_matches_reference(spm_folder):
    import sentencepiece

    tok = Tokenizer.from_pretrained(spm_folder)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_folder / "tokenizer.model"))
    hf = _auto(spm_folder)  # transformers reads tokenizer.model with protobuf (a test dependency)
    plain = [s for s in STRINGS if "<s>" not in s]
    for text in plain:
        assert tok.encode(text) == hf.encode(text), text
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text), skip_special_tokens=True), text
        if not text.startswith(" "):  # where no dummy-prefix rule differs, plain sentencepiece agrees too
            assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
    assert tok.bos_token_id == 1 and tok.eos_token_ids == {2} and tok.vocab_size == sp.get_piece_size()
    assert tok.decode([*tok.encode("Hello"), tok.vocab_size + 3]) == "Hello"  # ids past the vocab: nothing
    assert {0, 1, 2} <= tok.all_special_ids


def test_sentencepiece_special_tokens_in_text(spm_folder):
    tok = Tokenizer.from_pretrained(spm_folder)
    for text in ["a</s>b", "Hello </s> world<s>again", "</s>"]:
        ids = tok.encode(text)
        assert ids.count(2) == text.count("</s>") and ids.count(1) == text.count("<s>") + 1
        # Like Llama's "<s> Hello": only the decoded text's very first piece loses its "▁".
        assert tok.decode(ids, skip_special_tokens=False) == "<s>" + " " * (not text.startswith("<")) + text
        assert tok.decode(ids) == text.replace("<s>", "").replace("</s>", "")


def test_sentencepiece_missing_gives_install_hint(spm_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # makes `import sentencepiece` fail
    with pytest.raises(ImportError, match="pip install sentencepiece"):
        Tokenizer.from_pretrained(spm_folder)


def test_build_test_tokenizer_loads_like_transformers(tmp_path):
    folder = build_test_tokenizer(tmp_path / "tok", vocab_size=400)
    ours, theirs = Tokenizer.from_pretrained(folder), _auto(folder)
    for text in [*STRINGS, "<|im_start|>user\nhi<|im_end|>\n"]:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == theirs.decode(theirs.encode(text))
    for text in STRINGS[:6]:
        assert ours.decode(ours.encode(text)) == text  # byte-level: any Unicode text round-trips
    assert ours.encode("hi")[0] == ours.bos_token_id == ours.token_to_id("<s>")
    assert ours.eos_token_ids == {ours.token_to_id("</s>")}
    assert ours.vocab_size == len(theirs) == 400
    messages = MESSAGES[:2]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(messages, tokenize=False,
                                                                           add_generation_prompt=True)
    assert ours.apply_chat_template(messages).endswith("<|im_start|>assistant\n")
    # Deterministic: the same corpus gives the same tokenizer.
    again = build_test_tokenizer(tmp_path / "again", vocab_size=400)
    assert (again / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
