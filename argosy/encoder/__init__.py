"""The encoder engine: BERT-family embedding models and cross-encoder rerankers (docs/components.md)."""

from argosy.encoder.config import EncoderConfig
from argosy.encoder.offline import Encoder

__all__ = ["Encoder", "EncoderConfig"]
