"""Incremental detokenization: equal to a full decode, never half a UTF-8 character, stop strings, streaming."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from argosy.engine.bpe_builder import build_test_tokenizer
from argosy.engine.detokenizer import IncrementalDetokenizer
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.tokenizer import Tokenizer

UNICODE_TEXT = "東京 🙂🚀 naïve ✨ done 👩‍👩‍👧!"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_pretrained(build_test_tokenizer(tmp_path_factory.mktemp("tok")))


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's table: byte-level BPE spells byte b as this character.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def byte_tokens(tok: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte: every multi-byte character is split over tokens."""
    table = _byte_to_unicode()
    return [tok.token_to_id(table[b]) for b in text.encode()]


def run(tok, prompt, tokens, finish=True, **params):
    """Feed tokens one at a time; returns the detokenizer, the deltas and the first stop string."""
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(**params))
    deltas, stop = [], None
    for token_id in tokens:
        stop = detok.update([token_id])
        deltas.append(detok.get_delta())
        if stop is not None:
            break
    if finish:
        detok.finish()
        deltas.append(detok.get_delta())
    return detok, deltas, stop


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_tokens_match_full_decode(tok, skip_special_tokens):
    for seed in range(40):
        rng = random.Random(seed)
        prompt = tok.encode("A prompt, then random tokens:")
        # A model's embedding may be padded past the tokenizer's vocabulary: such ids decode to nothing.
        output = [rng.randrange(tok.vocab_size + 8) for _ in range(rng.randrange(1, 80))]
        detok, deltas, _ = run(tok, prompt, output, skip_special_tokens=skip_special_tokens)
        expected = tok.decode(output, skip_special_tokens=skip_special_tokens)
        assert detok.output_text == expected == "".join(deltas), seed
        assert detok.output_token_ids == output


def test_split_characters_never_stream_partially(tok):
    for tokens in (byte_tokens(tok, UNICODE_TEXT), tok.encode(UNICODE_TEXT, add_special_tokens=False)):
        detok = IncrementalDetokenizer(tok, tok.encode("Q:"), SamplingParams())
        streamed = ""
        for i, token_id in enumerate(tokens):
            detok.update([token_id])
            delta = detok.get_delta()
            assert "\ufffd" not in delta
            streamed += delta
            # All complete characters so far are out, and nothing else.
            complete = tok.decode(tokens[: i + 1]).rstrip("\ufffd")
            assert streamed == detok.output_text == complete
        detok.finish()
        assert streamed + detok.get_delta() == UNICODE_TEXT


def test_unfinished_character_is_released_by_finish(tok):
    tokens = byte_tokens(tok, "ab中")[:-1]  # the last character lacks its final byte
    detok, deltas, _ = run(tok, [], tokens, finish=False)
    assert detok.output_text == "ab"
    detok.finish()
    assert detok.output_text == tok.decode(tokens) and detok.output_text.startswith("ab\ufffd")


def test_window_stays_small(tok):
    sizes = []
    decode = tok.decode
    wrapped = lambda ids, skip_special_tokens=True: sizes.append(len(ids)) or decode(ids, skip_special_tokens)
    rng = random.Random(0)
    # Invalid UTF-8 (lone lead and continuation bytes) mixed with text: the case that could stall a window.
    junk = [tok.token_to_id(_byte_to_unicode()[b]) for b in range(0x80, 0x100)]
    tokens = [rng.choice(junk) if rng.random() < 0.9 else rng.randrange(tok.vocab_size) for _ in range(600)]
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    detok.tokenizer = type("Counting", (), {"decode": staticmethod(wrapped)})()
    for token_id in tokens:
        detok.update([token_id])
    detok.finish()
    assert detok.output_text == decode(tokens)
    assert max(sizes) <= 20  # bounded, not growing with the sequence


def test_stop_string_spanning_tokens(tok):
    text = "The answer is 42. STOP and more text"
    for include in (False, True):
        detok, deltas, stop = run(tok, [], byte_tokens(tok, text), stop=["STOP"], include_stop_str_in_output=include)
        assert stop == "STOP" == detok.stop_string and detok.finished
        assert detok.output_text == ("The answer is 42. STOP" if include else "The answer is 42. ")
        assert "".join(deltas) == detok.output_text
        assert detok.num_output_tokens == len("The answer is 42. STOP")  # it stopped at the token completing it
        with pytest.raises(RuntimeError):
            detok.update([0])


def test_stop_inside_one_multi_token_update(tok):
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["world", "lo w"]))
    assert detok.update(tok.encode("hello world, hello again", add_special_tokens=False)) == "lo w"  # earliest
    assert detok.output_text == "hel"


def test_streaming_holds_back_possible_stop_prefix(tok):
    text = "alpha beta </en gamma"  # "</en" could start the stop string until "gamma" arrives
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["</end>"]))
    streamed = ""
    for token_id in byte_tokens(tok, text):
        assert detok.update([token_id]) is None
        streamed += detok.get_delta()
        assert streamed == detok.output_text[: max(len(detok.output_text) - 5, 0)] == detok.visible_text
    assert streamed == text[:-5]
    assert detok.finish() is None
    assert streamed + detok.get_delta() == text == detok.output_text


def test_stop_token_text_is_left_out(tok):
    eos = tok.eos_token_id
    body = byte_tokens(tok, "done 中")[:-1]  # ends inside a character: the stop releases it
    for include in (False, True):
        detok = IncrementalDetokenizer(tok, [], SamplingParams(skip_special_tokens=False,
                                                               include_stop_str_in_output=include))
        for token_id in body:
            detok.update([token_id])
        assert detok.update([eos], stop_terminated=True) is None
        assert detok.finished and detok.output_token_ids == [*body, eos]
        assert detok.output_text == tok.decode(body + [eos] * include, skip_special_tokens=False)
        assert detok.output_text.endswith("</s>") == include


def test_min_tokens_delays_stop_strings(tok):
    tokens = byte_tokens(tok, "ab ab ab")
    detok, _, stop = run(tok, [], tokens, stop=["ab"], min_tokens=4, max_tokens=16)
    assert stop == "ab" and detok.output_text == "ab "  # the first "ab" falls within min_tokens
    detok, _, stop = run(tok, [], tokens, stop=["ab"])
    assert stop == "ab" and detok.output_text == ""


@pytest.fixture(scope="module")
def metaspace_tok(tmp_path_factory) -> Tokenizer:
    """A Llama-2 style tokenizer: Metaspace, byte fallback, a decoder that strips the first leading space."""
    specials = ["<unk>", "<s>", "</s>"]
    trained = HFTokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trained.train_from_iterator(["hello world, the quick brown fox and the lazy dog"] * 5,
                                trainers.BpeTrainer(vocab_size=100, special_tokens=specials, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    # Byte-fallback pieces <0x00>..<0xFF> are ordinary vocabulary entries, as in Llama's, right after the specials.
    pieces = [*specials, *(f"<0x{b:02X}>" for b in range(256)),
              *(t for t in sorted(learned["vocab"], key=learned["vocab"].get) if t not in specials)]
    merges = [tuple(m.split(" ") if isinstance(m, str) else m) for m in learned["merges"]]
    bpe = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(pieces)}, merges=merges, unk_token="<unk>",
                                 byte_fallback=True, fuse_unk=True))
    bpe.add_special_tokens(specials)
    bpe.pre_tokenizer = trained.pre_tokenizer
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder = tmp_path_factory.mktemp("metaspace")
    bpe.save(str(folder / "tokenizer.json"))
    return Tokenizer.from_pretrained(folder)


def test_metaspace_first_token_keeps_its_space(metaspace_tok):
    tok = metaspace_tok
    prompt = tok.encode("hello")
    output = tok.encode(" world 東京 🙂 fox", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(output)
    assert pieces[0].startswith("▁") and "<0xE6>" in pieces  # a leading-space piece; CJK as byte pieces
    detok, deltas, _ = run(tok, prompt, output)
    # The documented difference from decode(output): the prompt precedes the first output token, so its
    # leading space stays, as vLLM does; otherwise equal to the text the output adds to the prompt.
    full, alone = tok.decode(prompt + output), tok.decode(output)
    assert detok.output_text == full[len(tok.decode(prompt)):] == " " + alone == "".join(deltas)
    assert all("\ufffd" not in d for d in deltas)
