"""Structured outputs through the official openai client: every output follows its schema, regex or choice,
even from a random-weight model whose free text is noise."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server_fixtures import MODEL_NAME

# Bounded strings, numbers and arrays: a random model fills a free string until max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                     "main": {"type": "boolean"}},
                    "required": ["zip", "main"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person."}]


class Address(BaseModel):
    city: str = Field(max_length=5)
    floor: int = Field(ge=0, le=9)


class Person(BaseModel):
    name: str = Field(max_length=6)
    kind: Literal["cat", "dog"]
    address: Address
    scores: list[bool] = Field(max_length=2)


@pytest.fixture(scope="module")
def server(tool_model_server):
    return tool_model_server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _json_schema(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def test_parse_with_a_pydantic_model(client):
    for seed in range(3):
        done = client.beta.chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, response_format=Person,
                                                  temperature=1.0, seed=seed, max_tokens=200)
        person = done.choices[0].message.parsed
        assert isinstance(person, Person) and isinstance(person.address, Address)
        assert done.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("strict", [True, False])
def test_json_schema_nested_arrays_enums_validates(client, strict):
    done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=1.0, n=4, seed=7,
                                          response_format=_json_schema(PERSON, strict), max_tokens=200)
    for choice in done.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_schema_streamed(client):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, response_format=_json_schema(PERSON),
                                            temperature=1.0, seed=3, max_tokens=200, stream=True)
    text, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object(client):
    done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, response_format={"type": "json_object"},
                                          temperature=0.0, max_tokens=40)
    text = done.choices[0].message.content
    if done.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a random model may fill a string to max_tokens: then what came is a valid start of an object
        _assert_json_prefix(text)


def _assert_json_prefix(text: str) -> None:
    """text is the beginning of a JSON object: parsing fails only for want of more text."""
    assert text.startswith("{")
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(text)
    assert err.value.pos >= len(text.rstrip()) - 1 or "Unterminated string" in err.value.msg, (text, err.value)


def test_length_stop_keeps_a_valid_prefix(client):
    done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, response_format=_json_schema(PERSON),
                                          temperature=1.0, seed=1, max_tokens=5)
    choice = done.choices[0]
    assert choice.finish_reason == "length"
    _assert_json_prefix(choice.message.content)


def test_regex_and_choice_through_vllm_fields(client):
    pattern = r"[a-c]{2}-\d{3}"
    done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=1.0, n=3, seed=5,
                                          max_tokens=30, extra_body={"structured_outputs": {"regex": pattern}})
    texts = [c.message.content for c in done.choices]
    assert all(re.fullmatch(pattern, text) for text in texts), texts
    choices = ["sunny", "rainy", "cloudy"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=1.0, n=3, seed=9,
                                              max_tokens=30, extra_body=extra)
        assert {c.message.content for c in done.choices} <= set(choices)


def test_grammar_and_completions_endpoint(client):
    grammar = 'root ::= "yes" | "no" | ("maybe " [0-9])'
    done = client.completions.create(model=MODEL_NAME, prompt="Answer:", max_tokens=10, temperature=1.0, n=3, seed=2,
                                     extra_body={"structured_outputs": {"grammar": grammar}})
    assert all(re.fullmatch(r"yes|no|maybe [0-9]", c.text) for c in done.choices), [c.text for c in done.choices]
    done = client.completions.create(model=MODEL_NAME, prompt="JSON:", max_tokens=200, temperature=1.0, seed=4,
                                     extra_body={"response_format": _json_schema(PERSON), "guided_json": None})
    jsonschema.validate(json.loads(done.choices[0].text), PERSON)


@pytest.mark.parametrize("body, param", [
    ({"response_format": _json_schema({"type": "nope"})}, "response_format"),
    ({"response_format": _json_schema({"properties": {"a": {"$ref": "#/$defs/missing"}}})}, "response_format"),
    ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs"),
    ({"extra_body": {"guided_grammar": "root ::= undefined_rule"}}, "guided_grammar"),
    ({"extra_body": {"guided_choice": []}}, "guided_choice"),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}}, "guided_regex"),
])
def test_invalid_specs_are_a_clear_400(client, server, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=5, **body)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and err.value.body["message"]
    assert "Traceback" not in err.value.body["message"]
    ok = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3)  # still serving
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_model_card_has_context_revision_and_kind(client):
    card = client.models.list().data[0]
    assert (card.id, card.max_model_len, card.revision, card.kind) == (MODEL_NAME, 1024, "r7", "generate")
    assert card.root.endswith("tool-model0")  # the checkpoint served, as vLLM's root
