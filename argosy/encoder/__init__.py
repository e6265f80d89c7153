"""The encoder engine: BERT-family embedding models and cross-encoder rerankers (docs/components.md)."""

from argosy.encoder.config import EncoderConfig

__all__ = ["Encoder", "EncoderConfig"]


def __getattr__(name: str):
    # Encoder (and torch) on first use: the fleet reads argosy.encoder.config without importing torch.
    if name == "Encoder":
        from argosy.encoder.offline import Encoder

        return Encoder
    raise AttributeError(f"module 'argosy.encoder' has no attribute {name!r}")
