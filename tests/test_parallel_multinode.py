"""The multi-node launchers, on one host: the engine's ranks as Ray actors in a placement group on a real
local Ray cluster, and as processes started by torchrun (driver = rank 0). Both give greedy output
token-identical to one process; a killed Ray actor fails the engine fast."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from argosy import LLM
from argosy.engine.random_model import make_random_model
from tests.test_parallel import KV_GIB, NEW_TOKENS, generate, greedy, prompts_for, reference

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(make_random_model(tmp_path_factory.mktemp("mn-llama"), arch="llama", init_std=0.2))
    return path, reference(path, prompts_for())[0]


@pytest.fixture()
def ray_cluster(monkeypatch):
    ray = pytest.importorskip("ray")
    for k, v in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0")):
        monkeypatch.setenv(k, v)
    # A local cluster with its own GCS and raylet, stopped by ray.shutdown().
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.timeout(180)
def test_ray_placement_group_matches_one_process_and_a_killed_actor_fails_fast(llama, ray_cluster):
    path, expected = llama
    from ray.util import placement_group_table

    with LLM(path, kv_cache_memory_gib=KV_GIB, max_num_batched_tokens=16, tensor_parallel_size=2,
             distributed_executor_backend="ray") as llm:
        ranks = llm.engine.runner.ranks
        table = placement_group_table(ranks.pg)
        # Bundle 0, the driver's, is pinned to this node (Ray's node:<ip> resource); the ranks meet on that IP.
        assert [n["NodeManagerAddress"] for n in ray_cluster.nodes()] == [ranks.master_addr]
        assert table["state"] == "CREATED" and list(table["bundles"].values()) == [
            {"CPU": 1.0, f"node:{ranks.master_addr}": 0.001}, {"CPU": 1.0}]
        # Rank 1 runs in a Ray actor process, not one this process spawned.
        assert llm.engine.runner.procs == [] and len(ranks.actors) == 2
        assert generate(llm, prompts_for()) == expected
        assert generate(llm, prompts_for()) == expected  # prefix-cache hits
        ray_cluster.kill(ranks.actors[1])
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"tensor-parallel worker 1 \(Ray actor\)"):
            generate(llm, prompts_for())
        assert time.monotonic() - start < 5
    # close() gave the bundles back.
    assert placement_group_table(ranks.pg)["state"] == "REMOVED"


@pytest.mark.timeout(120)
def test_torchrun_two_stages_match_one_process(llama, tmp_path):
    path, expected = llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in prompts_for()))
    # Rank 0 is the driver and writes the outputs; rank 1 runs the second stage and exits when it is done.
    cmd = [f"{BIN}/torchrun", "--standalone", "--nproc-per-node=2", "-m", "argosy.engine.torchrun_generate",
           "--model", path, "--pipeline-parallel-size", "2", "--prompts", str(prompts), "--max-tokens",
           str(NEW_TOKENS), "--ignore-eos", "--kv-cache-memory", str(KV_GIB), "--max-num-batched-tokens", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["token_ids"] for r in rows] == expected


@pytest.mark.timeout(120)
def test_argosy_engine_under_torchrun_serves_from_rank_0(llama):
    import openai

    path, expected = llama
    with LLM(path, kv_cache_memory_gib=KV_GIB) as llm:
        texts = [o.outputs[0].text for o in llm.generate(prompts_for(), greedy(), use_tqdm=False)]
    # Rank 0 runs the HTTP server and the driver; rank 1 (tensor-parallel) only serves its steps.
    proc = subprocess.Popen([f"{BIN}/torchrun", "--standalone", "--nproc-per-node=2", "--no-python", f"{BIN}/argosy",
                             "engine", "--model", path, "--tensor-parallel-size", "2", "--port", "0",
                             "--kv-cache-memory", str(KV_GIB)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:  # "argosy engine: ready, serving NAME at URL/v1"
            lines.append(line)
            if "ready, serving" in line:
                break
        assert lines and "ready, serving" in lines[-1], "".join(lines)[-2000:]
        client = openai.OpenAI(base_url=lines[-1].split()[-1], api_key="none", max_retries=0, timeout=60)
        for prompt, text in zip(prompts_for(), texts, strict=True):
            out = client.completions.create(model=os.path.basename(path), prompt=prompt, max_tokens=NEW_TOKENS,
                                            temperature=0, extra_body={"min_tokens": NEW_TOKENS})
            assert out.choices[0].text == text and out.usage.completion_tokens == NEW_TOKENS
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun passes it on; rank 0's shutdown stops rank 1
        proc.wait(30)
    assert subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).stdout == b""


def test_torchrun_backend_outside_torchrun_is_a_clear_error(llama):
    with pytest.raises(ValueError, match="torchrun --nproc-per-node=2"):
        LLM(llama[0], tensor_parallel_size=2, distributed_executor_backend="torchrun")
