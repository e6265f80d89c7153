"""One source for engine settings: EngineConfig's fields give `argosy engine`'s flags, the fleet file's
`engine:` section and one range check; replicas started by the fleet get the engine's own defaults."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

from argosy.config import FleetConfigError, parse_fleet
from argosy.engine.config import EngineConfig
from argosy.engine.config_flags import engine_config_from_args, engine_flags
from argosy.fleet.engine_args import engine_args
from argosy.server.cli import add_engine_arguments
from tests.server_fixtures import ROOT

CPU = torch.device("cpu")


def engine_parser() -> argparse.ArgumentParser:
    """The parser `argosy engine` uses."""
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser


def replica_config(engine: dict, on_gpu: bool = False) -> EngineConfig:
    """The EngineConfig a replica of a fleet file's model builds from the flags the fleet gives it."""
    model = parse_fleet({"models": [{"name": "m", "checkpoint": "/ckpt", "engine": engine}]}).models[0]
    return engine_config_from_args(engine_parser().parse_args(engine_args(model, on_gpu)), model="/ckpt")


def test_an_engine_section_that_sets_nothing_gives_replicas_what_argosy_engine_picks():
    plain = engine_config_from_args(engine_parser().parse_args([]), model="/ckpt")  # `argosy engine`, no flags
    assert replica_config({}) == plain
    # The drift this guards against: the fleet's own 8192 overrode the CPU server's 512.
    assert replica_config({}).token_budget(CPU) == plain.token_budget(CPU) == 512
    # A replica the placer put on a GPU runs there; everything else stays the engine's.
    assert replica_config({}, on_gpu=True) == dataclasses.replace(plain, device="cuda")
    assert replica_config({"device": "cpu"}, on_gpu=True).device == "cpu"


def test_every_setting_a_fleet_file_gives_reaches_the_replica():
    given = {"dtype": "bfloat16", "device": "cpu", "block_size": 32, "kv_cache_memory_gib": 0.5,
             "gpu_memory_utilization": 0.5, "max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 128,
             "enable_prefix_caching": False, "scheduling_policy": "priority", "seed": 7, "tensor_parallel_size": 2,
             "pipeline_parallel_size": 3, "distributed_executor_backend": "ray", "max_logprobs": 5,
             "compile_matvec": True, "quantization": "q4_0", "quant_batch_dtype": "float32",
             "attention_backend": "sdpa", "enforce_eager": True, "cpu_threads": 3}
    fleet_fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "usage"}
    assert set(given) == fleet_fields  # a new EngineConfig field gets a value here
    got = replica_config(given)
    assert {name: getattr(got, name) for name in given} == given
    for name, value in given.items():  # and each one alone
        assert getattr(replica_config({name: value}), name) == value


def test_the_flags_users_know_keep_their_names_short_forms_and_choices():
    args = ["-tp", "2", "-pp", "2", "--kv-cache-memory", "0.5", "--no-prefix-caching", "--compile-matvec",
            "--dtype", "float16", "--block-size", "8", "--distributed-executor-backend", "mp", "--scheduling-policy",
            "priority", "--max-model-len", "100", "--max-num-seqs", "3", "--seed", "5", "--device", "cpu",
            "--max-num-batched-tokens", "64", "--gpu-memory-utilization", "0.8", "--max-logprobs", "4",
            "--enforce-eager", "--attention-backend", "triton"]
    config = engine_config_from_args(engine_parser().parse_args(args), model="/ckpt")
    assert config == EngineConfig(
        model="/ckpt", tensor_parallel_size=2, pipeline_parallel_size=2, kv_cache_memory_gib=0.5,
        enable_prefix_caching=False, compile_matvec=True, dtype="float16", block_size=8,
        distributed_executor_backend="mp", scheduling_policy="priority", max_model_len=100, max_num_seqs=3, seed=5,
        device="cpu", max_num_batched_tokens=64, gpu_memory_utilization=0.8, max_logprobs=4, enforce_eager=True,
        attention_backend="triton")
    assert engine_config_from_args(engine_parser().parse_args(engine_flags(
        {name: getattr(config, name) for name in ("tensor_parallel_size", "kv_cache_memory_gib",
                                                 "enable_prefix_caching", "compile_matvec", "dtype")})),
        model="/ckpt") == dataclasses.replace(EngineConfig(model="/ckpt"), tensor_parallel_size=2,
                                              kv_cache_memory_gib=0.5, enable_prefix_caching=False,
                                              compile_matvec=True, dtype="float16")
    with pytest.raises(SystemExit):
        engine_parser().parse_args(["--dtype", "int8"])


@pytest.mark.parametrize("name,value,says", [
    ("max_num_batched_tokens", 0, "at least 1"),
    ("max_num_seqs", 0, "at least 1"),
    ("cpu_threads", 0, "at least 1"),
    ("cpu_threads", 10 ** 6, "at most 1024"),
    ("max_model_len", 0, "at least 1"),
    ("tensor_parallel_size", 0, "at least 1"),
    ("block_size", 24, "power of two from 1 to 256"),
    ("block_size", 512, "power of two from 1 to 256"),
    ("gpu_memory_utilization", 0.0, "greater than 0 and at most 1"),
    ("gpu_memory_utilization", 1.5, "at most 1"),
    ("kv_cache_memory_gib", 0.0, "greater than 0"),
    ("kv_cache_memory_gib", math.nan, "finite"),
    ("max_logprobs", -1, "at least 0"),
    ("device", "tpu", "auto, cpu, cuda or cuda:N"),
    ("dtype", "int8", "auto, float32, bfloat16 or float16"),
])
def test_one_range_check_for_llm_and_the_fleet_file(name, value, says):
    with pytest.raises(ValueError, match=f"^{name} .*{says}"):
        EngineConfig(model="/ckpt", **{name: value})
    with pytest.raises(FleetConfigError, match=f"models\\.0\\.engine\\.{name}: .*{says}"):
        parse_fleet({"models": [{"name": "m", "checkpoint": "/ckpt", "engine": {name: value}}]})


@pytest.mark.parametrize("name,value,says", [("max_num_seqs", "8", "an integer"),
                                             ("enable_prefix_caching", "no", "true or false"),
                                             ("kv_cache_memory_gib", "1", "a number")])
def test_llm_keywords_of_the_wrong_type_are_named(name, value, says):
    # (The fleet file reads YAML as pydantic does: "8" there is 8.)
    with pytest.raises(ValueError, match=f"^{name} must be {says}"):
        EngineConfig(model="/ckpt", **{name: value})


def test_the_fleet_file_refuses_settings_that_are_not_the_engines():
    with pytest.raises(FleetConfigError, match=r"models\.0\.engine\.max_num_sqs: Extra inputs"):
        parse_fleet({"models": [{"name": "m", "engine": {"max_num_sqs": 4}}]})
    with pytest.raises(FleetConfigError, match=r"models\.0\.engine\.usage"):  # the engine's command decides it
        parse_fleet({"models": [{"name": "m", "engine": {"usage": "offline"}}]})


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "argosy.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=90)


def test_a_zero_token_budget_is_refused_by_every_door(tiny_llama):
    # It used to be taken, and then every step scheduled nothing: generate spun forever.
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least 1, got 0"):
        from argosy import LLM

        LLM(tiny_llama, max_num_batched_tokens=0)
    with pytest.raises(FleetConfigError, match=r"models\.0\.engine\.max_num_batched_tokens: .*at least 1"):
        parse_fleet({"models": [{"name": "m", "checkpoint": tiny_llama, "engine": {"max_num_batched_tokens": 0}}]})
    engine = _run("engine", "--model", tiny_llama, "--port", "0", "--max-num-batched-tokens", "0")
    assert engine.returncode != 0 and "Traceback" not in engine.stderr
    assert "argosy engine: max_num_batched_tokens must be at least 1, got 0" in engine.stderr
    generate = _run("generate", "Hello", "--model", tiny_llama, "--max-num-batched-tokens", "0")
    assert generate.returncode == 2
    assert generate.stderr.strip() == "argosy generate: error: max_num_batched_tokens must be at least 1, got 0"
