"""Structured outputs: grammars (JSON schema, regex, choice, EBNF, tool-call tags) enforced while decoding.

params.py checks what a request asks for; compiler.py compiles it against the vocabulary off the engine's
step; matcher.py follows each sequence and masks the batch's logits. The grammar engine is xgrammar.
Only params is imported here: `import argosy` stays free of torch and the grammar engine.
"""

from argosy.engine.structured.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
