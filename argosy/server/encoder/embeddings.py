"""POST /v1/embeddings (OpenAI's shape) and POST /embed (TEI's), on one path.

`input`: a string, a list of strings, a list of token ids, or a list of lists of token ids (token ids
are used as given, special tokens included). `encoding_format`: float (default) or base64 (the float32
bytes, little-endian, as OpenAI sends them). `dimensions` is refused unless it is the model's own size:
these models were not trained to be cut short (Matryoshka), so a shorter vector would be a worse one.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from argosy.server.encoder.state import EncoderState, TEIError, truncation
from argosy.server.errors import APIError
from argosy.server.protocol import Fields, check_model, read_json_body

LARGE_RESPONSE_FLOATS = 65536  # past this many numbers, the JSON is written on the thread pool


def parse_input(value: Any, param: str = "input") -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists)."""
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list) or not value:
        raise APIError.bad_request(f"'{param}' must be a non-empty string, list of strings, list of token ids "
                                   "or list of lists of token ids.", param)
    if all(isinstance(x, str) for x in value):
        return value, None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return None, [value]
    if all(isinstance(x, list) for x in value):
        for i, ids in enumerate(value):
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise APIError.bad_request(f"'{param}[{i}]' must be a non-empty list of token ids.", param)
        return None, value
    raise APIError.bad_request(f"'{param}' mixes types: give strings, or token ids, not both.", param)


async def encode_inputs(state: EncoderState, texts: list[str] | None, ids: list[list[int]] | None,
                        body: dict[str, Any], openai_route: bool, param: str) -> list[list[int]]:
    core = state.core
    max_len, cut, direction = truncation(body, core.max_model_len)
    state.admit(len(texts if texts is not None else ids), param)
    if texts is not None:
        return await state.tokenize(core.tokenizer.encode_texts, texts, max_len, cut, direction, param,
                                    openai_route=openai_route)
    return await state.tokenize(core.tokenizer.check_ids, ids, max_len, cut, direction, param,
                                openai_route=openai_route)


def _embeddings_body(vectors: np.ndarray, fmt: str, model: str, tokens: int) -> bytes:
    from argosy.server.state import dumps

    if fmt == "base64":
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        rows = vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    # usage last: the gateway reads it from the tail of the body to bill tokens
    return dumps({"object": "list", "data": data, "model": model,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()


async def create_embeddings(request: Request) -> Response:
    arrival = time.monotonic()
    state: EncoderState = request.app.state.argosy
    state.check_ready()
    body = await read_json_body(request, state.max_body_bytes)
    fields = Fields(body)
    check_model(fields, state.served_model_name)
    state.check_kind("/v1/embeddings")
    fmt = fields.get_str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise APIError.bad_request("'encoding_format' must be float or base64.", "encoding_format")
    dims = fields.get_int("dimensions")
    if dims is not None and dims != state.core.dimensions:
        raise APIError.bad_request(
            f"'dimensions' ({dims}) is not supported by `{state.served_model_name}`: its embeddings have "
            f"{state.core.dimensions} dimensions and the model was not trained to be truncated (Matryoshka). "
            "Leave 'dimensions' out.", "dimensions")
    texts, ids = parse_input(body.get("input"))
    tokens = await encode_inputs(state, texts, ids, body, True, "input")
    out = await state.run(tokens, arrival)
    vectors = out.data.numpy()
    if vectors.size > LARGE_RESPONSE_FLOATS:
        payload = await asyncio.to_thread(_embeddings_body, vectors, fmt, state.served_model_name, out.num_tokens)
    else:
        payload = _embeddings_body(vectors, fmt, state.served_model_name, out.num_tokens)
    return Response(payload, media_type="application/json")


async def tei_embed(request: Request) -> Response:
    """TEI's /embed: {"inputs": str | [str], "normalize": true, "truncate": false} -> [[float, ...], ...]."""
    try:
        arrival = time.monotonic()
        state: EncoderState = request.app.state.argosy
        state.check_ready()
        body = await read_json_body(request, state.max_body_bytes)
        check_model(Fields(body), state.served_model_name)
        state.check_kind("/embed")
        normalize = body.get("normalize", True)
        if not isinstance(normalize, bool):
            raise APIError(422, "'normalize' must be a boolean.", param="normalize")
        if not normalize and state.core.spec.normalize:
            raise APIError(400, f"`{state.served_model_name}` always returns unit-length vectors (its "
                           "Normalize module); 'normalize': false is not supported.", param="normalize")
        texts, ids = parse_input(body.get("inputs"), "inputs")
        tokens = await encode_inputs(state, texts, ids, body, False, "inputs")
        out = await state.run(tokens, arrival, openai_route=False)
    except APIError as e:
        raise TEIError.from_api(e) from None
    from argosy.server.state import dumps

    vectors = out.data.numpy().tolist()
    if out.data.numel() > LARGE_RESPONSE_FLOATS:
        payload = await asyncio.to_thread(dumps, vectors)
    else:
        payload = dumps(vectors)
    return Response(payload.encode(), media_type="application/json")
