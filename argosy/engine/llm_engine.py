"""LLMEngine: requests in, one scheduler step at a time, outputs out. Not thread-safe: one caller."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from pathlib import Path

import torch

from argosy.engine.batch import BatchInputs
from argosy.engine.config import EngineConfig
from argosy.engine.detokenizer import IncrementalDetokenizer
from argosy.engine.errors import InvalidRequestError
from argosy.engine.kv_cache_manager import KVCacheManager
from argosy.engine.loader import Checkpoint, open_checkpoint
from argosy.engine.model_runner import ModelRunner, Runner
from argosy.engine.outputs import CompletionOutput, RequestOutput
from argosy.engine.sampler import Sampler, prompt_logprobs
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.scheduler import Scheduler, SchedulerOutput
from argosy.engine.sequence import Sequence, SequenceStatus
from argosy.engine.structured.compiler import GrammarCompiler
from argosy.engine.structured.matcher import SequenceGrammar


class LLMEngine:
    def __init__(self, config: EngineConfig, served_model_name: str | None = None,
                 checkpoint: Checkpoint | None = None):
        """checkpoint: one already opened, or built in memory (bench/gpu_check.py); default: config.model's."""
        self.config = config
        self.model_name = served_model_name or Path(config.model).name
        checkpoint = checkpoint or open_checkpoint(config.model)  # a missing folder or config.json is named first
        self.tokenizer = checkpoint.tokenizer()
        self.runner: Runner
        if config.tensor_parallel_size * config.pipeline_parallel_size == 1:
            self.runner = ModelRunner(config, checkpoint)
        else:  # the same interface; other processes run the other shards
            from argosy.engine.parallel.executor import ParallelExecutor

            self.runner = ParallelExecutor(config)
        mc = self.runner.model_config
        limit = min(x for x in (mc.max_position_embeddings, mc.sliding_window) if x)
        self.max_model_len = min(config.max_model_len or limit, limit)
        # The model's vocabulary, which may be padded past the tokenizer's: sampling covers all of it,
        # as transformers, vLLM and llama.cpp do, so greedy outputs agree with theirs token for token.
        self.vocab_size = mc.vocab_size
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(mc.eos_token_ids)
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        budget = config.token_budget(self.runner.device)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, budget, config.scheduling_policy)
        self.sampler = Sampler(self.vocab_size, self.eos_token_ids, seed=config.seed)
        # Pipeline parallel: micro-batches in flight at once, (scheduled, batch, handle, start) oldest first.
        self.pipeline_depth = self.runner.pipeline_depth
        self._in_flight: deque[tuple[SchedulerOutput, BatchInputs, object, float]] = deque()
        self.requests: dict[str, list[Sequence]] = {}
        self.prompts: dict[str, str | None] = {}
        self.final_only: set[str] = set()
        self.grammars: GrammarCompiler | None = None  # made by the first structured request
        self._compiling: list[Sequence] = []  # sequences whose grammar was not ready when last looked at
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (logprobs' decoded_token)

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                    final_only: bool = False) -> None:
        """Queues a request. final_only: step() reports it only when it finishes (no streaming)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", "request_id")
        token_ids = self._tokenize(prompt)
        highest = max(params.logit_bias or (), default=-1)
        if highest >= self.vocab_size:
            raise InvalidRequestError(f"logit_bias names token id {highest}, outside this model's vocabulary "
                                      f"(ids 0 to {self.vocab_size - 1})", "logit_bias")
        highest = max(params.stop_token_ids or (), default=-1)
        if highest >= self.vocab_size:  # it could never stop the output: a typo the caller should hear of
            raise InvalidRequestError(f"stop_token_ids names token id {highest}, outside this model's vocabulary "
                                      f"(ids 0 to {self.vocab_size - 1})", "stop_token_ids")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise InvalidRequestError(f"logprobs must be at most {self.config.max_logprobs}", "logprobs")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.config.max_logprobs:
            raise InvalidRequestError(f"prompt_logprobs must be at most {self.config.max_logprobs}", "prompt_logprobs")
        room = self.max_model_len - len(token_ids)
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {len(token_ids)} tokens, but this model's context is {self.max_model_len} "
                "tokens and at least one must be left to generate", "prompt")
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if max_tokens > room:
            raise InvalidRequestError(
                f"max_tokens is {max_tokens}, but the prompt is {len(token_ids)} tokens and this model's "
                f"context is {self.max_model_len} tokens: at most {room} can be generated", "max_tokens")
        blocks_needed = -(-(len(token_ids) + max_tokens) // self.config.block_size)
        if blocks_needed > self.runner.num_blocks:
            raise InvalidRequestError(
                f"this request needs {blocks_needed} KV-cache blocks but the cache holds "
                f"{self.runner.num_blocks}", "max_tokens")
        future = None
        if params.structured_outputs is not None:
            if self.grammars is None:
                self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
            future = self.grammars.compile(params.structured_outputs)  # a bad spec raises here: a 400
        now = arrival_time if arrival_time is not None else time.monotonic()
        seqs = []
        for i in range(params.n):
            seq = Sequence(request_id, token_ids, params, index=i, priority=priority, cache_salt=cache_salt,
                           arrival_time=now)
            seq.max_tokens = max_tokens
            if params.seed is not None:
                # Each of the n completions gets its own stream, as vLLM's seed + index.
                seq.generator = torch.Generator(self.runner.device).manual_seed(params.seed + i)
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params)
            if future is not None:
                seq.grammar = SequenceGrammar(future)
                self._compiling.append(seq)
            seqs.append(seq)
        self.requests[request_id] = seqs
        self.prompts[request_id] = prompt if isinstance(prompt, str) else None
        if final_only:
            self.final_only.add(request_id)
        for seq in seqs:
            self.scheduler.add(seq)

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        elif not isinstance(prompt, list | tuple):
            raise InvalidRequestError(
                f"the prompt must be a string or a list of token ids, not {type(prompt).__name__}", "prompt")
        else:
            token_ids = list(prompt)
            bad = [t for t in token_ids if not isinstance(t, int) or isinstance(t, bool)
                   or not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"token id {bad[0]!r} is out of range: ids must be integers in [0, {self.vocab_size})", "prompt")
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        return token_ids

    def abort_request(self, request_id: str) -> None:
        seqs = self.requests.pop(request_id, [])
        for seq in seqs:
            if not seq.finished:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)
        self.prompts.pop(request_id, None)
        self.final_only.discard(request_id)
        compiling = {id(s.grammar.future): s.grammar.future for s in seqs
                     if s.grammar is not None and not s.grammar.future.done()}
        for future in compiling.values():  # a grammar queued for nobody else is not compiled
            if not any(not s.finished and s.grammar.future is future for s in self._compiling):
                self.grammars.drop(future)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        failed = self._end_failed_grammars() if self._compiling else []
        if self.pipeline_depth > 1:
            return failed + self._step_pipelined()
        out = self.scheduler.schedule()
        if not out.scheduled:
            self._wait_for_grammars()
            return failed
        start = time.monotonic()
        batch = self.runner.prepare(out.scheduled)
        return self._finish_batch(out, batch, self.runner.execute(batch), start)

    def _step_pipelined(self) -> list[RequestOutput]:
        """Pipeline parallel: keeps up to P micro-batches in flight (stage 0 computes batch k+1 while
        stage 1 computes batch k), each from sequences not already in flight; then finishes the oldest."""
        while len(self._in_flight) < self.pipeline_depth:
            busy = {seq for out, *_ in self._in_flight for seq, _ in out.scheduled}
            out = self.scheduler.schedule(in_flight=busy)
            if not out.scheduled:
                break
            start = time.monotonic()
            batch = self.runner.prepare(out.scheduled)
            self._in_flight.append((out, batch, self.runner.submit(batch), start))
        if not self._in_flight:
            self._wait_for_grammars()
            return []
        out, batch, handle, start = self._in_flight.popleft()
        return self._finish_batch(out, batch, self.runner.collect(handle), start)

    def _end_failed_grammars(self) -> list[RequestOutput]:
        """Ends the sequences whose grammar failed to compile (aborted, the error as stop_reason)."""
        still, touched = [], {}
        for seq in self._compiling:
            if seq.finished:
                continue
            if not seq.grammar.ready():
                still.append(seq)
            elif seq.grammar.error is not None:
                seq.stop_reason = seq.grammar.error
                self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)
                touched[seq.request_id] = None
        self._compiling = still
        now = time.monotonic()
        return [self._output(rid, now) for rid in touched if all(s.finished for s in self.requests[rid])]

    def _wait_for_grammars(self, timeout_s: float = 0.01) -> None:
        """Nothing could be scheduled: if grammars are compiling, sleep until one is done (or briefly),
        rather than spin the caller's loop."""
        pending = [s.grammar.future for s in self._compiling if not s.finished and not s.grammar.future.done()]
        if pending:
            wait_futures(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _finish_batch(self, out: SchedulerOutput, batch: BatchInputs, logits: torch.Tensor,
                      start: float) -> list[RequestOutput]:
        now = time.monotonic()
        touched: dict[str, None] = {}
        for seq, n in out.scheduled:
            if seq.finished:  # aborted while its micro-batch was in flight (its blocks are already freed)
                continue
            seq.num_computed_tokens += n
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = start
        if batch.prompt_logprob_spans:
            self._fill_prompt_logprobs(batch.prompt_logprob_spans, logits[len(batch.sampling_seqs):])
            logits = logits[: len(batch.sampling_seqs)]
        rows = [i for i, seq in enumerate(batch.sampling_seqs) if not seq.finished]
        if rows:
            seqs = batch.sampling_seqs
            if len(rows) < len(seqs):
                seqs, logits = [seqs[i] for i in rows], logits[rows]
            sampled = self.sampler(logits, seqs)
            for i, seq in enumerate(seqs):
                self._append(seq, sampled.token_ids[i], sampled.logprobs[i], sampled.sampled_logprobs[i], now)
                touched[seq.request_id] = None
        final_only = self.final_only
        return [self._output(rid, now) for rid in touched
                if rid not in final_only or all(s.finished for s in self.requests[rid])]

    def _token_text(self, token_id: int) -> str:
        """One token's text, for logprobs: decoded once per token id (at most the vocabulary), as a prompt's
        logprobs ask it for every prompt token and its top-k, between two steps of everyone else."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def _fill_prompt_logprobs(self, spans: list[tuple[Sequence, int, int]], logits: torch.Tensor) -> None:
        """Each span's rows (positions first..first+count-1) give the logprobs of prompt tokens first+1 on."""
        next_ids = [t for seq, first, count in spans for t in seq.prompt_token_ids[first + 1:first + 1 + count]]
        top_ks = [seq.params.prompt_logprobs for seq, _, count in spans for _ in range(count)]
        entries = iter(prompt_logprobs(logits[:, : self.vocab_size], next_ids, top_ks))
        for seq, _, count in spans:
            for _ in range(count):
                entry = next(entries)
                for tid, lp in entry.items():
                    lp.decoded_token = self._token_text(tid)
                seq.prompt_logprobs.append(entry)

    def _append(self, seq: Sequence, token: int, logprobs, sampled_logprob, now: float) -> None:
        seq.append_token(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.last_token_time = now
        if logprobs is not None:
            for tid, lp in logprobs.items():
                lp.decoded_token = self._token_text(tid)
            seq.logprobs.append(logprobs)
        if sampled_logprob is not None:
            seq.cumulative_logprob += sampled_logprob
        params = seq.params
        detok = seq.detokenizer
        status = None
        if token in self.eos_token_ids and not params.ignore_eos:
            status = SequenceStatus.FINISHED_STOPPED
        elif seq.grammar is not None and (seq.grammar.terminated or seq.grammar.error is not None):
            status = SequenceStatus.FINISHED_STOPPED  # the grammar is complete (or broken): nothing may follow
        elif token in params.stop_token_ids:
            status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, token
        stop = detok.update([token], stop_terminated=status is not None)
        if stop is not None:
            status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, stop
        if status is None and (seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len):
            # The held-back tail of a character is released now; it may complete a stop string.
            stop = detok.finish()
            status = SequenceStatus.FINISHED_LENGTH if stop is None else SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = stop
        if status is not None:
            self.scheduler.finish(seq, status)

    def _output(self, request_id: str, now: float) -> RequestOutput:
        seqs = self.requests[request_id]
        finished = all(s.finished for s in seqs)
        first = seqs[0]
        outputs = [
            CompletionOutput(
                index=s.index,
                text=s.detokenizer.visible_text,
                token_ids=s.output_token_ids,
                cumulative_logprob=s.cumulative_logprob if s.params.logprobs is not None else None,
                logprobs=s.logprobs,
                finish_reason=s.status.value if s.finished else None,
                stop_reason=s.stop_reason,
            )
            for s in seqs
        ]
        metrics = {"arrival_time": first.arrival_time,
                   "first_scheduled_time": min((s.first_scheduled_time for s in seqs if s.first_scheduled_time),
                                               default=now),
                   "first_token_time": min((s.first_token_time for s in seqs if s.first_token_time), default=now)}
        if finished:
            metrics["finished_time"] = now
            del self.requests[request_id]
            self.final_only.discard(request_id)
        prompt = self.prompts.pop(request_id, None) if finished else self.prompts.get(request_id)
        return RequestOutput(request_id, prompt, first.prompt_token_ids, outputs, finished,
                             num_cached_tokens=first.num_cached_tokens, metrics=metrics,
                             prompt_logprobs=None if first.wants_prompt_logprobs else first.prompt_logprobs)

    def close(self) -> None:
        """Stops the worker processes of a parallel engine (a no-op for one process)."""
        while self._in_flight:  # micro-batches of aborted requests: let the ranks finish them first
            try:
                self.runner.collect(self._in_flight.popleft()[2])
            except RuntimeError:  # the engine already failed
                self._in_flight.clear()
        self.runner.close()
        if self.grammars is not None:
            self.grammars.close()

    def stats(self) -> dict:
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": self.kv.usage,
            "prefix_cache_queries": self.kv.queries,
            "prefix_cache_hits": self.kv.hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_free_blocks": self.kv.num_free_blocks,
            "num_blocks": self.runner.num_blocks,
        }
