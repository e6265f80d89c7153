"""The CUDA path on a real GPU: the Triton kernels compiled (half and single precision), the engine on them
with CUDA graphs against its eager and gather + SDPA paths, the KV cache sized by profiling, and NVML
telemetry. Skipped without a CUDA device; bench/gpu_check.py runs them on the lent H200 (docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.py)")

from argosy import LLM, SamplingParams  # noqa: E402
from tests.kernel_checks import check_decode, check_kv_write, check_prefill, check_rms_norm, check_rope  # noqa: E402
from tests.test_cpu_kernels import assert_same_outputs  # noqa: E402

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", [*HALF, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size,splits", [
    (32, 8, 128, 16, 16), (32, 8, 128, 16, 1), (8, 2, 64, 1, 3), (6, 2, 80, 32, 2), (4, 4, 128, 256, 8),
    (28, 4, 128, 16, 5)])
def test_decode_kernel(heads, kv_heads, dim, block_size, splits, dtype):
    check_decode("cuda", heads, kv_heads, dim, block_size, splits, dtype)


@pytest.mark.parametrize("dtype", [*HALF, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(32, 8, 128, 16), (8, 2, 64, 1), (6, 2, 80, 32)])
def test_prefill_kernel(heads, kv_heads, dim, block_size, dtype):
    check_prefill("cuda", heads, kv_heads, dim, block_size, dtype)


@pytest.mark.parametrize("dtype", [*HALF, torch.float32])
def test_small_kernels(dtype):
    check_kv_write("cuda", dtype)
    for dim in (48, 4096):
        check_rms_norm("cuda", dtype, dim, exact_sum=True)
    check_rope("cuda", dtype)


PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
PROMPTS = [list(range(3, 3 + n)) for n in (4, 19, 40, 70, 7, 300)]


def test_the_engine_on_cuda_graphs_gives_the_eager_and_sdpa_paths_tokens(tiny_llama):
    settings = dict(dtype="float32", kv_cache_memory_gib=0.05, max_num_batched_tokens=64, max_num_seqs=8)
    sdpa = LLM(tiny_llama, attention_backend="sdpa", enforce_eager=True, **settings)
    expected = sdpa.generate(PROMPTS, PARAMS, use_tqdm=False)
    eager = LLM(tiny_llama, enforce_eager=True, **settings)
    assert eager.engine.runner.attention.name == "triton" and eager.engine.runner.graphs is None
    assert_same_outputs(expected, eager.generate(PROMPTS, PARAMS, use_tqdm=False), 1e-3)
    graphs = LLM(tiny_llama, **settings)
    got = graphs.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert_same_outputs(expected, got, 1e-3)
    assert graphs.engine.runner.graphs.replays >= PARAMS.max_tokens // 2
    graphs.engine.kv.check_integrity()


def test_the_kv_cache_is_sized_from_a_profile_and_the_largest_step_fits(tiny_llama):
    llm = LLM(tiny_llama, max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.5)
    runner = llm.engine.runner
    assert runner.dtype == torch.bfloat16  # CUDA's default
    profile = runner.platform.last_profile
    assert profile is not None and all(peak > 0 for peak in profile.step_peaks) and len(profile.step_peaks) == 2
    kv_bytes = runner.num_blocks * runner.kv_bytes_per_block()
    assert kv_bytes <= 0.5 * profile.total - profile.in_use
    free, total = torch.cuda.mem_get_info()
    assert total - free <= 0.5 * total * 1.02  # the engine stays within its share (2 % for rounding)
    prompts = [[5 + i] * 32 for i in range(256)]  # the whole token budget in one step (no shared prefix)
    out = llm.generate(prompts, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=4, logprobs=5),
                       use_tqdm=False)
    assert len(out) == 256 and all(len(o.outputs[0].token_ids) == 4 for o in out)


def test_nvml_telemetry_reports_this_gpu():
    from argosy.server.device_telemetry import DeviceTelemetry
    from tests.test_device_telemetry import parse

    telemetry = DeviceTelemetry.for_device("cuda")
    assert telemetry.gpus is not None and telemetry.gpus.gpus, "NVML found no GPU"
    values, types = parse(telemetry.render())
    names = {name for name, _ in values}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_POWER_USAGE"} <= names
    for (name, labels), value in values.items():
        labels = dict(labels)
        if name == "DCGM_FI_DEV_GPU_TEMP":
            assert 10 <= value <= 110
        elif name == "DCGM_FI_DEV_FB_TOTAL":
            assert value * (1 << 20) == pytest.approx(torch.cuda.get_device_properties(0).total_memory, rel=0.05)
        elif name == "DCGM_FI_DEV_POWER_USAGE":
            assert 10 <= value <= 2000
        elif name == "DCGM_FI_DEV_SM_CLOCK":
            assert 0 < value < 4000
        if name.startswith("DCGM_"):
            assert labels["UUID"].startswith(("GPU-", "MIG-")) and labels["modelName"]
