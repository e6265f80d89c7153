"""Argosy: serve open-weight language models to many users under latency targets."""

from argosy.engine.outputs import CompletionOutput, Logprob, RequestOutput
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.structured.params import StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in torch and the model code; import it only when asked for.
    if name == "LLM":
        from argosy.engine.llm import LLM

        return LLM
    raise AttributeError(name)
