"""The offline API: `LLM(model=...).generate(prompts, params)`, shaped like vLLM's `LLM` class."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence as Seq
from dataclasses import fields

from argosy.engine.config import EngineConfig
from argosy.engine.llm_engine import LLMEngine
from argosy.engine.loader import Checkpoint
from argosy.engine.outputs import RequestOutput
from argosy.engine.sampling_params import SamplingParams

PromptType = str | list[int] | dict


class LLM:
    """`LLM(model=PATH, dtype=..., kv_cache_memory_gib=..., max_num_seqs=..., ...)`: any EngineConfig field."""

    def __init__(self, model: str, **kwargs):
        known = {f.name for f in fields(EngineConfig)}
        # vLLM spellings that mean the same here.
        if "kv_cache_memory" in kwargs:
            kwargs["kv_cache_memory_gib"] = kwargs.pop("kv_cache_memory")
        for ignored in ("tokenizer", "trust_remote_code"):
            kwargs.pop(ignored, None)
        kwargs.setdefault("usage", "offline")
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown LLM arguments: {', '.join(sorted(unknown))}")
        self._start(EngineConfig(model=model, **kwargs))

    @classmethod
    def from_config(cls, config: EngineConfig, checkpoint: Checkpoint | None = None) -> LLM:
        """An LLM over a whole EngineConfig (built from flags, say), taken as it is; checkpoint: one already
        opened or built in memory (default: config.model's)."""
        llm = cls.__new__(cls)
        llm._start(config, checkpoint)
        return llm

    def _start(self, config: EngineConfig, checkpoint: Checkpoint | None = None) -> None:
        self.engine = LLMEngine(config, checkpoint=checkpoint)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stops the worker processes of a parallel engine; they are also stopped at interpreter exit."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Seq[PromptType], sampling_params: SamplingParams | Seq[SamplingParams]
                 | None = None, use_tqdm: bool = True, priority: list[int] | None = None) -> list[RequestOutput]:
        """Runs every prompt to completion; returns one output per prompt, in order."""
        if isinstance(prompts, str | dict) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError("sampling_params must be one object or one per prompt")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError("priority must hold one value per prompt")
        order: dict[str, int] = {}
        try:
            for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
                if isinstance(prompt, dict):
                    prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt["prompt"]
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, params, priority=priority[i] if priority else 0, final_only=True)
                order[rid] = i
        except Exception:
            for rid in order:  # one bad prompt rejects the call: the ones already queued must not linger
                self.engine.abort_request(rid)
            raise
        return self._run(order, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        prompts = [tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, order: dict[str, int], use_tqdm: bool) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(order)
        done, total, start, last_print = 0, len(order), time.monotonic(), 0.0
        show = use_tqdm and total > 1
        out_tokens = 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    results[order[out.request_id]] = out
                    done += 1
                    out_tokens += sum(len(c.token_ids) for c in out.outputs)
            now = time.monotonic()
            if show and (now - last_print > 0.5 or done == total):
                last_print = now
                rate = out_tokens / max(now - start, 1e-9)
                sys.stderr.write(f"\rProcessed prompts: {done}/{total} | {now - start:.1f} s | "
                                 f"output {rate:.1f} tok/s")
                sys.stderr.flush()
        if show:
            sys.stderr.write("\n")
        return [r for r in results if r is not None]
