"""Published GPU serving figures, each with its source and the workload the simulator needs to replay it.

Read by bench/sim_published.py. A figure whose source could not be read (repository, path and commit, or
URL) is not here. Settings a source does not state are marked `assumed` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

MLPERF_41 = "github.com/mlcommons/inference_results_v4.1@a2f5d66d17e8f75c02fd74dfe810ecca6a046696"
SGLANG_060 = ("github.com/sgl-project/sglang@120affb9613cc3f5bcd055ec09c7621d3ced0ebc:"
              "benchmark/benchmark_vllm_060/README.md")
LAMBDA = "github.com/LambdaLabsML/vllm-benchmark@0e8fc5d0f9865a326666cb82aeb2d8dc74c82c5e:benchmark_v0.md"
TRTLLM = ("github.com/NVIDIA/TensorRT-LLM@00f37686aa854010d68bcbd0f4ab000221541ca6:"
          "docs/source/performance/perf-overview.md")


@dataclass(frozen=True)
class Workload:
    """Token-count distributions: lognormal (sigma) clipped to [lo, hi] and rescaled to the mean; sigma 0 is fixed."""

    input_mean: float
    output_mean: float
    sigma: float = 0.0
    input_range: tuple[int, int] = (1, 1 << 20)
    output_range: tuple[int, int] = (1, 1 << 20)
    source: str = ""


WORKLOADS = {
    # MLPerf's llama2-70b set: 24,576 OpenOrca samples. Input: min 48, max 1,021, sum 5,463,976 tokens (mean
    # 222.3), as computed from the official pickle (sha256 ec34d70f...) in FlashLab-MBZUAI/HBFSim@96cf1b3
    # validation/calibration/h100-llama2-70b-calibration-protocol.json. Output: what the runs generated,
    # tokens/s over samples/s of the H100 Offline log (24,524.9 / 84.4792 = 290.3; the others agree within
    # 0.4%), at most 1,024. The spread (sigma 0.8) is assumed: only min, max and mean are published.
    "openorca": Workload(222.3, 290.3, 0.8, (48, 1021), (1, 1024), "MLPerf llama2-70b OpenOrca"),
    # ShareGPT as SGLang's bench_serving samples it (prompts of 4-1,024 tokens, prompt + output <= 2,048):
    # output 194.4 = 3,856.01 tok/s / 19.84 req/s of the SGLang v0.3.0 table; input 202 is the mean the vLLM
    # v0.6.0 blog states for its ShareGPT sample (vllm-project/vllm-project.github.io@0dd37ad
    # _posts/2024-09-05-perf-update.md: "Average input tokens: 202, average output tokens: 179").
    # Sigma 1.0 (ShareGPT's long tail) is assumed.
    "sharegpt-sglang": Workload(202, 194.4, 1.0, (4, 1024), (4, 1024), "ShareGPT, SGLang bench_serving"),
    "sharegpt-vllm": Workload(202, 179, 1.0, (4, 1024), (4, 1024), "ShareGPT, vLLM benchmark_serving"),
}
for _isl, _osl in ((128, 2048), (1000, 1000), (2048, 128), (5000, 500)):
    WORKLOADS[f"{_isl}/{_osl}"] = Workload(_isl, _osl, 0.0, source="fixed lengths (prepare_dataset.py, stdev 0)")


@dataclass(frozen=True)
class Figure:
    key: str
    system: str  # what ran, in words
    gpu: str  # argosy/sim/catalogue.yaml accelerator
    model: str  # catalogue model
    dtype: str  # fp8 | bf16 (weights and KV cache)
    tp: int
    replicas: int  # data-parallel copies in the published system
    max_num_seqs: int
    token_budget: int
    workload: str
    requests: int  # offline: requests sent at once (per replica); server: 0
    rate: float  # server: the whole system's arrivals, req/s (Poisson)
    metric: str  # output_tok_s | ttft_p99_s | tpot_p99_s | ttft_p50_s | tpot_p50_s
    published: float
    source: str
    fit: bool = False  # the one figure per GPU the efficiencies are fitted on
    limit: float | None = None  # MLPerf's latency constraint on this metric
    note: str = ""


def _mlperf(key, system, gpu, replicas, tp, seqs, scenario, path, rows, fit=False, rate=0.0, note=""):
    out = []
    for metric, value, limit in rows:
        out.append(Figure(f"{key}-{metric}", system, gpu, "llama-2-70b", "fp8", tp, replicas, seqs, 2048, "openorca",
                          4000 if scenario == "Offline" else 0, rate, metric, value,
                          f"{MLPERF_41}:closed/NVIDIA/results/{path}/{scenario}/performance/run_1/mlperf_log_summary.txt",
                          fit and metric == "output_tok_s", limit, note))
    return out


_H100 = "DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9"
_H200 = "H200-SXM-141GBx8_TRT/llama2-70b-99"
_CTS = "H200-SXM-141GB-CTSx8_TRT/llama2-70b-99.9"
# TP, batch (gpu_batch_size) and FP8: closed/NVIDIA/configs/llama2-70b/{Offline,Server}/__init__.py at the same
# commit (H100_SXM_80GB_TP2x4: TP2 x4, 896 offline / 1024 server; H200_SXM_141GBx8: TP1 x8, 806 / 896;
# H200_SXM_141GB_CTSx8: TP1 x8, 784 / 1024). TensorRT 10.2, CUDA 12.4 on all three (systems/*.json);
# the CTS part runs at 1000 W TGP, the standard H200 at 700 W. Token budget: not stated (2048 assumed).
# Server rates are the logs' "Scheduled samples per second"; limits: TTFT 2 s, TPOT 200 ms (p99).
FIGURES: list[Figure] = [
    *_mlperf("mlperf-h100-offline", "MLPerf v4.1 Offline, 8x H100 (4x TP2), TensorRT-LLM", "H100", 4, 2, 896,
             "Offline", _H100, [("output_tok_s", 24524.9, None)], fit=True),
    *_mlperf("mlperf-h100-server", "MLPerf v4.1 Server, 8x H100 (4x TP2), 75.10 req/s", "H100", 4, 2, 1024,
             "Server", _H100, [("output_tok_s", 21605.79, None), ("ttft_p99_s", 0.461278, 2.0),
                               ("tpot_p99_s", 0.175354, 0.2)], rate=75.10),
    *_mlperf("mlperf-h200-offline", "MLPerf v4.1 Offline, 8x H200 700 W (8x TP1), TensorRT-LLM", "H200", 8, 1, 806,
             "Offline", _H200, [("output_tok_s", 31302.7, None)], fit=True),
    *_mlperf("mlperf-h200-server", "MLPerf v4.1 Server, 8x H200 700 W (8x TP1), 101.25 req/s", "H200", 8, 1, 896,
             "Server", _H200, [("output_tok_s", 29228.22, None), ("ttft_p99_s", 0.452744, 2.0),
                               ("tpot_p99_s", 0.146040, 0.2)], rate=101.25),
    *_mlperf("mlperf-cts-offline", "MLPerf v4.1 Offline, 8x H200-CTS 1000 W (8x TP1)", "H200", 8, 1, 784,
             "Offline", _CTS, [("output_tok_s", 34864.2, None)], note="1000 W part, profile fitted at 700 W"),
    *_mlperf("mlperf-cts-server", "MLPerf v4.1 Server, 8x H200-CTS 1000 W (8x TP1), 113.70 req/s", "H200", 8, 1, 1024,
             "Server", _CTS, [("output_tok_s", 32789.74, None), ("ttft_p99_s", 0.510351, 2.0),
                              ("tpot_p99_s", 0.181534, 0.2)], rate=113.70, note="1000 W part, profile fitted at 700 W"),
]

# Llama 3.1 70B Instruct (BF16, meta-llama/Llama-3.1-70B-Instruct) on 4x H100 TP4, SGLang v0.3.0 and vLLM v0.6.0
# (--num-scheduler-steps 10, --max_model_len 4096): offline 5,000 ShareGPT prompts at once; online 1,200
# prompts at 4 req/s and 2,400 at 8 req/s. Batch limits not stated: 256 assumed (vLLM's default); token
# budget: SGLang's chunked-prefill default 8,192, vLLM's max_model_len 4,096 (no chunked prefill there).
for _engine, _budget, _tput, _online in (
        ("SGLang v0.3.0", 8192, 3856.01, ((4, 53.94, 25.03), (8, 58.11, 33.07))),
        ("vLLM v0.6.0", 4096, 3700.64, ((4, 179.15, 23.58), (8, 207.12, 29.15)))):
    _k = _engine.split()[0].lower()
    FIGURES.append(Figure(f"{_k}-70b-offline", f"{_engine}, Llama 3.1 70B BF16, 4x H100 TP4, 5,000 ShareGPT at once",
                          "H100", "llama-3.1-70b", "bf16", 4, 1, 256, _budget, "sharegpt-sglang", 5000, 0.0,
                          "output_tok_s", _tput, SGLANG_060))
    for _rps, _ttft, _tpot in _online:
        for _metric, _value in (("ttft_p50_s", _ttft / 1e3), ("tpot_p50_s", _tpot / 1e3)):
            FIGURES.append(Figure(f"{_k}-70b-{_rps}rps-{_metric}", f"{_engine}, Llama 3.1 70B BF16, 4x H100 TP4, "
                                  f"ShareGPT at {_rps} req/s", "H100", "llama-3.1-70b", "bf16", 4, 1, 256, _budget,
                                  "sharegpt-sglang", 0, float(_rps), _metric, _value, SGLANG_060))

# vLLM v0.6.0 (--num-scheduler-steps 10), Llama 3.1 8B TP1, 5,000 ShareGPT prompts at rps=inf, max-num-seq 256,
# max-seq-len 2048. The table names neither the GPU nor the precision: the report benchmarks H100 and A100,
# and the repository's cache_model.py (@680cc0a) lists meta-llama/Meta-Llama-3.1-8B-Instruct (BF16): assumed.
FIGURES.append(Figure("vllm-8b-offline", "vLLM v0.6.0, Llama 3.1 8B (BF16 assumed), 1x H100, 5,000 ShareGPT at once",
                      "H100", "llama-3.1-8b", "bf16", 1, 1, 256, 2048, "sharegpt-vllm", 5000, 0.0, "output_tok_s",
                      8088.35, LAMBDA, note="GPU and precision assumed"))

# TensorRT-LLM v1.0 trtllm-bench (PyTorch backend), FP8 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP8,
# nvidia/Llama-3.3-70B-Instruct-FP8: Llama 3.3 70B has Llama 3.1 70B's shape), all requests at once, fixed
# lengths; request counts from the doc's table. Batch and token limits: TensorRT-LLM's defaults (2,048 and
# 8,192) assumed; its default scheduler reserves each request's whole KV up front (no eviction), which the
# bench models by capping the batch at the KV cache / (ISL + OSL).
_TRT = {"128/2048": 3000, "1000/1000": 3000, "2048/128": 3000, "5000/500": 1500}
for _gpu, _model, _tp, _values in (
        ("H100", "llama-3.1-8b", 1, (22714, 15220, 3450, 3459)), ("H100", "llama-3.1-70b", 2, (6651, 4205, 762, 898)),
        ("H200", "llama-3.1-8b", 1, (26221, 17744, 3538, 3902)), ("H200", "llama-3.1-70b", 1, (4336, 2909, 442, 566))):
    for (_shape, _n), _value in zip(_TRT.items(), _values, strict=True):
        _size = "8B" if "8b" in _model else "70B"
        FIGURES.append(Figure(f"trtllm-{_gpu.lower()}-{_size.lower()}-{_shape}", f"TensorRT-LLM v1.0, Llama {_size} "
                              f"FP8, 1 replica {_gpu} TP{_tp}, ISL/OSL {_shape}", _gpu, _model, "fp8", _tp, 1, 2048,
                              8192, _shape, _n, 0.0, "output_tok_s", float(_value), TRTLLM,
                              note="no-evict batch cap"))
