"""`argosy profile`: measure a replica on this machine, or a roofline profile for an accelerator; then what the
profile says one replica can do."""

from __future__ import annotations

import argparse

from argosy.sim.cli_common import add_roofline, fail, log, roofline_settings


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="measure the real engine on this device with this checkpoint")
    p.add_argument("--gpu", help="or a roofline profile for this accelerator (H100, H200, B200, A100, L40S)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (roofline)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="largest decode batch measured (64)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget of a step (512)")
    p.add_argument("--kv-cache-memory", type=float, default=0.5, metavar="GIB", help="KV cache when measuring")
    p.add_argument("--engine-only", action="store_true",
                   help="time the engine's steps only; by default a served replica is measured too (HTTP, SSE)")
    p.add_argument("--node", action="store_true",
                   help="also measure the CPU a node spends outside the engines per token (gateway, event loops, "
                        "client) and a replica's start under load, behind `argosy serve`: for `sim --node-cores`")
    p.add_argument("--output", "-o", default="profile.json")
    add_roofline(p)


def _is_encoder(model: str) -> bool:
    from argosy.encoder.checkpoint import is_encoder_checkpoint
    from argosy.models.packaged import resolve_checkpoint

    return is_encoder_checkpoint(resolve_checkpoint(model))


def run_profile(args: argparse.Namespace) -> int:
    from argosy.sim.profile import model_shape, roofline_profile

    try:
        if (args.model is None) == (args.gpu is None):
            raise ValueError("give --model PATH (measure this device) or --gpu NAME --model-config M (roofline)")
        if args.node and (args.gpu is not None or _is_encoder(args.model)):
            raise ValueError("--node measures a generating model served on this machine (not --gpu or an encoder)")
        if args.gpu is not None:
            if args.model_config is None:
                raise ValueError("--gpu needs --model-config (a catalogue model, checkpoint folder or config.json)")
            prof = roofline_profile(args.gpu, model_shape(args.model_config), args.tp, roofline_settings(args))
        elif _is_encoder(args.model):  # an embedding model or a reranker: batch times of the encoder engine
            from argosy.sim.measure_encoder import measure_encoder_profile

            prof = measure_encoder_profile(args.model, log=log)
        else:
            from argosy.sim.measure import measure_profile

            prof = measure_profile(args.model, max_num_seqs=args.max_num_seqs, token_budget=args.max_num_batched_tokens,
                                   kv_cache_memory_gib=args.kv_cache_memory, log=log)
            if not args.engine_only:
                from argosy.sim.measure_serving import measure_serving

                prof = measure_serving(args.model, prof, max_num_seqs=args.max_num_seqs,
                                       token_budget=args.max_num_batched_tokens,
                                       kv_cache_memory_gib=args.kv_cache_memory, log=log)
            if args.node:
                from argosy.sim.measure_node import measure_node

                prof = measure_node(args.model, prof, max_num_seqs=args.max_num_seqs,
                                    token_budget=args.max_num_batched_tokens,
                                    kv_cache_memory_gib=args.kv_cache_memory, log=log)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return fail("profile", e)
    from argosy.sim.capacity import render_capacity

    prof.save(args.output)
    shape = ("max(matmul FLOPs, weights read) + max(attention FLOPs, KV read)" if prof.combine == "split"
             else f"{prof.combine}(compute, memory)")
    print(f"{prof.name}: step = {prof.base_s * 1e3:.3f} ms + {shape}; "
          f"KV {prof.num_blocks} blocks of {prof.block_size} tokens; cold start {prof.cold_start_s:.1f} s "
          f"-> {args.output}")
    print(render_capacity(prof, args.max_num_seqs if args.gpu is None else 256,
                          _context(args.model_config if args.gpu is not None else args.model)))
    return 0


def _context(spec: str | None) -> int | None:
    """The model's own context, past which the capacity table has no rows (the built-in model's 512 positions
    had been tabulated up to 131,072 tokens); None where its config does not say."""
    from pathlib import Path

    from argosy.models.packaged import resolve_checkpoint
    from argosy.sim.profile import load_catalogue, model_shape

    if not spec:
        return None
    if spec not in load_catalogue()["models"]:
        path = Path(resolve_checkpoint(spec))
        if not (path.is_dir() or path.suffix == ".json"):  # a GGUF file: its config is no JSON to read (whole)
            return None
    try:
        return model_shape(spec).max_position_embeddings or None
    except ValueError:
        return None
