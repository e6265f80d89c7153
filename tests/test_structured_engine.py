"""Structured outputs inside the engine: the batch's bitmask, grammars compiled off the step, and free
requests untouched by constrained neighbours."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.engine.structured import StructuredOutputsParams
from argosy.engine.structured.compiler import GrammarCompiler
from argosy.engine.structured.matcher import _bit_table, bitmask_penalty

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_bitmask_penalty_matches_bit_by_bit_reading():
    g = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 5), dtype=torch.int32, generator=g)
    vocab = 150  # not a multiple of 32: the last word's high bits are cut
    penalty = bitmask_penalty(bitmask, _bit_table(torch.device("cpu")), vocab)
    expected = torch.full((3, vocab), float("-inf"))
    for r in range(3):
        for t in range(vocab):
            if (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                expected[r, t] = 0.0
    assert torch.equal(penalty, expected)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    engine = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    yield engine
    engine.close()


def test_free_requests_get_the_same_tokens_beside_constrained_ones(llm):
    prompts = ["The quick brown fox", "Once upon a time", "Rivers carry water"]
    free = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=0.8, top_p=0.9, seed=12, max_tokens=12, ignore_eos=True)]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free, use_tqdm=False)]
    constrained = [SamplingParams(temperature=t, seed=s, max_tokens=40,
                                  structured_outputs=StructuredOutputsParams(json=SCHEMA))
                   for t, s in ((0.0, None), (1.0, 3), (1.0, None))]
    mixed = llm.generate([prompts[0], "x", prompts[1], "y", prompts[2], "z"],
                         [free[0], constrained[0], free[1], constrained[1], free[2], constrained[2]], use_tqdm=False)
    assert [mixed[i].outputs[0].token_ids for i in (0, 2, 4)] == alone
    for i in (1, 3, 5):
        assert mixed[i].outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(mixed[i].outputs[0].text), SCHEMA)


def test_a_compiling_grammar_waits_without_stalling_others(llm, monkeypatch):
    release = threading.Event()
    original = GrammarCompiler._compile

    def slow_compile(self, grammar):
        assert release.wait(60)
        return original(self, grammar)

    monkeypatch.setattr(GrammarCompiler, "_compile", slow_compile)
    engine = llm.engine
    engine.grammars = None  # a fresh compiler: nothing cached
    # A schema no earlier test compiled, queued first: FCFS would put it ahead of the free request.
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "z": {"type": "null"}}, "required": ["ok", "n", "z"]}
    engine.add_request("constrained", "Hello", SamplingParams(
        temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema)))
    engine.add_request("free", "Hello", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    finished = {}
    while "free" not in finished:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert len(engine.requests["constrained"][0].output_token_ids) == 0  # still waiting, nothing generated
    release.set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    jsonschema.validate(json.loads(finished["constrained"].outputs[0].text), schema)


def test_a_grammar_that_fails_to_compile_ends_its_request(llm, monkeypatch):
    def broken(self, grammar):
        raise ValueError("out of memory while compiling")

    monkeypatch.setattr(GrammarCompiler, "_compile", broken)
    engine = llm.engine
    engine.grammars = None
    engine.add_request("bad", "Hello", SamplingParams(
        max_tokens=5, structured_outputs=StructuredOutputsParams(regex="[0-9]+")))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    final = outs[-1].outputs[0]
    assert final.finish_reason == "abort" and "out of memory while compiling" in final.stop_reason
    assert final.token_ids == []
    engine.grammars = None  # later users get a working compiler


def test_bad_spec_is_an_invalid_request_before_queueing(llm):
    from argosy.engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="Unsupported type"):
        llm.engine.add_request("r", "Hello", SamplingParams(
            structured_outputs=StructuredOutputsParams(json={"type": "nope"})))
    assert "r" not in llm.engine.requests


def test_a_grammar_queued_for_a_request_that_left_is_not_compiled(llm, monkeypatch):
    release, compiled = threading.Event(), []
    original = GrammarCompiler._compile

    def counted(self, grammar):
        assert release.wait(60)
        compiled.append(str(grammar))
        return original(self, grammar)

    monkeypatch.setattr(GrammarCompiler, "_compile", counted)
    engine = llm.engine
    engine.grammars = None
    first = {**SCHEMA, "properties": {**SCHEMA["properties"], "first_only": {"type": "null"}}}
    second = {**SCHEMA, "properties": {**SCHEMA["properties"], "second_only": {"type": "null"}}}
    for rid, schema in (("busy", first), ("left", second), ("same", second)):  # one compile thread: queued
        engine.add_request(rid, "Hello", SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            json=schema)))
    queued = engine.requests["left"][0].grammar.future
    engine.abort_request("left")
    assert not queued.cancelled()  # "same" still waits for it
    engine.abort_request("same")
    assert queued.cancelled()  # nobody does: it is never compiled (a client that left had kept it queued)
    release.set()
    while engine.has_unfinished_requests():
        engine.step()
    assert len(compiled) == 1 and "first_only" in compiled[0]
    again = engine.grammars.compile(StructuredOutputsParams(json=second))  # asked again: compiled anew
    assert again is not queued and again.result(60) is not None
    engine.grammars = None


def test_a_schema_nested_past_the_limit_is_refused_before_compiling():
    from argosy.engine.structured.params import MAX_SCHEMA_DEPTH, StructuredOutputsError

    def nested(levels: int) -> dict:
        schema: dict = {"type": "integer"}
        for _ in range(levels):  # 4 JSON levels each: 240 of them had taken 10 s of a core to compile
            branch = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
            schema = {"anyOf": [branch, {"type": "integer"}]}
        return schema

    assert StructuredOutputsParams(json=nested(15)).to_grammar() is not None  # 61 levels
    with pytest.raises(StructuredOutputsError, match=f"nested 65 levels deep; at most {MAX_SCHEMA_DEPTH}"):
        StructuredOutputsParams(json=nested(16)).to_grammar()
    with pytest.raises(StructuredOutputsError, match="nested 961 levels deep"):
        StructuredOutputsParams(json=nested(240)).to_grammar()
