"""POST /tokenize and POST /detokenize, in vLLM's shapes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from argosy.server.chat import parse_messages
from argosy.server.errors import APIError
from argosy.server.protocol import Fields, chat_template_options, check_model, read_json_body
from argosy.server.state import ServerState, json_response
from argosy.server.tools import parse_tools, template_messages


async def tokenize(request: Request) -> Response:
    """{"prompt": str, "add_special_tokens": true} or {"messages": [...], "add_generation_prompt": true}
    -> {"count", "max_model_len", "tokens", "token_strs"}."""
    state: ServerState = request.app.state.argosy
    tokenizer = state.tokenizer
    fields = Fields(await read_json_body(request, state.max_body_bytes))
    check_model(fields, state.served_model_name)
    if "messages" in fields.body:
        messages = parse_messages(fields.body["messages"])
        if not tokenizer.has_chat_template:
            raise APIError.bad_request("This model has no chat template.", "messages")
        options = chat_template_options(fields)
        tools = parse_tools(fields, tokenizer.chat_template)
        messages = template_messages(messages, tools, tokenizer.chat_template)
        extra = {"tools": tools.tools} if tools is not None else {}
        try:
            text = tokenizer.apply_chat_template(messages, **options, **extra)
        except Exception as exc:
            raise APIError.bad_request(f"The chat template rejected the messages: {exc}", "messages") from None
        add_special = fields.get_bool("add_special_tokens", False)
    else:
        text = fields.get_str("prompt")
        if text is None:
            raise APIError.bad_request("'prompt' (a string) or 'messages' is required.", "prompt")
        add_special = fields.get_bool("add_special_tokens", True)
    tokens = await state.encode(text, add_special_tokens=add_special, within_context=False)  # counts any length
    token_strs = None
    if fields.get_bool("return_token_strs", False):
        token_strs = [tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    return json_response({"count": len(tokens), "max_model_len": state.engine.max_model_len, "tokens": tokens,
                          "token_strs": token_strs})


async def detokenize(request: Request) -> Response:
    """{"tokens": [int]} -> {"prompt": str}."""
    state: ServerState = request.app.state.argosy
    tokenizer = state.tokenizer
    fields = Fields(await read_json_body(request, state.max_body_bytes))
    check_model(fields, state.served_model_name)
    if "tokens" not in fields.body:
        raise APIError.bad_request("'tokens' (a list of token ids) is required.", "tokens")
    tokens = fields.get_int_list("tokens")
    bad = [t for t in tokens if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise APIError.bad_request(f"Token id {bad[0]} is out of range [0, {tokenizer.vocab_size}).", "tokens")
    return json_response({"prompt": tokenizer.decode(tokens, skip_special_tokens=False)})
