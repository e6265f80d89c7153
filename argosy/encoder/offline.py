"""Encoder: the offline API (embed texts, score or rerank documents) over EncoderEngine.

    from argosy.encoder import Encoder
    enc = Encoder("path/to/all-MiniLM-L6-v2")
    vectors = enc.embed(["a sentence", "another"])          # [2, 384] float32, unit length
    scores = Encoder("path/to/cross-encoder").score("query", ["doc a", "doc b"])

Inputs are queued as one request per call and run in token-budget batches (the server's path too).
"""

from __future__ import annotations

import itertools

import torch

from argosy.encoder.checkpoint import EMBED, RERANK
from argosy.encoder.config import EncoderConfig
from argosy.encoder.engine import EncoderEngine


class Encoder:
    def __init__(self, model: str, **kwargs):
        # One call may pass any number of inputs: the engine's per-request bound is for the server.
        kwargs.setdefault("max_client_batch_size", 1 << 30)
        self.engine = EncoderEngine(EncoderConfig(model=str(model), **kwargs))
        self._ids = itertools.count()

    @property
    def kind(self) -> str:
        return self.engine.kind

    def _run(self, inputs: list) -> torch.Tensor:
        rid = f"offline-{next(self._ids)}"
        self.engine.add_request(rid, inputs)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.request_id == rid:
                    return out.data
        raise RuntimeError("the engine stopped before the request finished")

    def embed(self, texts: list[str] | str, truncate: bool = True) -> torch.Tensor:
        """[len(texts), dimensions] float32 vectors (normalised where the model's modules say so)."""
        if self.kind != EMBED:
            raise ValueError("embed() needs an embedding model; this is a cross-encoder (use score or rerank)")
        texts = [texts] if isinstance(texts, str) else list(texts)
        ids = self.engine.tokenizer.encode_texts(texts, self.engine.max_model_len, truncate)
        return self._run(ids)

    def score(self, query: str, documents: list[str], truncate: bool = True) -> torch.Tensor:
        """One relevance score per document: a cross-encoder's (sigmoid of its logit, for one label), or
        for an embedding model the cosine similarity of the query's and the document's vectors."""
        documents = list(documents)
        if self.kind == RERANK:
            pairs = self.engine.tokenizer.encode_pairs(query, documents, self.engine.max_model_len, truncate)
            return self.engine.activate(self._run(pairs))
        vectors = self.embed([query, *documents], truncate)
        return torch.nn.functional.cosine_similarity(vectors[:1], vectors[1:], dim=1)

    def rerank(self, query: str, documents: list[str], top_n: int | None = None) -> list[tuple[int, float]]:
        """(document index, score), best first."""
        scores = self.score(query, documents).tolist()
        ranked = sorted(enumerate(scores), key=lambda x: -x[1])
        return ranked[:top_n] if top_n is not None else ranked
