"""EncoderEngine: embedding and cross-encoder requests in, one vector (or score) per input out.

    add_request(request_id, inputs)  queues tokenized inputs (validated: lengths, batch size)
    step()                           runs one batch; returns the requests that finished in it
    abort_request(request_id)        drops what of it still waits

Not thread-safe: the server drives it from one thread (argosy/server/encoder_engine_thread.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from argosy.encoder.batch import pack
from argosy.encoder.bert import load_model
from argosy.encoder.checkpoint import EMBED, load_encoder_spec
from argosy.encoder.config import CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS, EncoderConfig
from argosy.encoder.errors import BatchTooLargeError, EncoderInputError, InputTooLongError
from argosy.encoder.pooling import pool
from argosy.encoder.scheduler import EncodeItem, EncodeRequest, EncoderScheduler
from argosy.encoder.tokenize import EncoderTokenizer
from argosy.engine.platforms import platform_for

logger = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Input = list[int] | tuple[list[int], list[int]]  # token ids, or (token ids, token type ids) of a pair


@dataclass(frozen=True)
class EncoderOutput:
    request_id: str
    data: torch.Tensor  # embed: [inputs, dimensions]; rerank: [inputs] logits (float32, on the CPU)
    num_tokens: int  # all inputs' tokens (usage)
    queue_s: float  # arrival to first batch
    e2e_s: float


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but no CUDA device is available")
    return device


def resolve_dtype(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return DTYPES.get(str(checkpoint_dtype), torch.float32)


class EncoderEngine:
    def __init__(self, config: EncoderConfig):
        self.config = config
        self.spec = load_encoder_spec(config.model)
        self.kind = self.spec.kind
        self.device = resolve_device(config.device)
        platform_for(self.device).use_threads(config.cpu_threads)
        self.dtype = resolve_dtype(config.dtype, self.spec.torch_dtype, self.device)
        limit = self.spec.max_seq_len
        if config.max_model_len is not None and config.max_model_len > self.spec.bert.max_position_embeddings:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"{self.spec.bert.max_position_embeddings} positions")
        self.max_model_len = config.max_model_len or limit
        on_cuda = self.device.type == "cuda"
        budget = config.max_num_batched_tokens or (CUDA_BATCH_TOKENS if on_cuda else CPU_BATCH_TOKENS)
        self.max_num_batched_tokens = max(budget, self.max_model_len)  # an input of the longest length must fit
        self.tokenizer = EncoderTokenizer(config.model, self.spec.lowercase)
        if self.device.type == "cpu":
            from argosy.engine.cpu_memory import keep_freed_memory

            keep_freed_memory()  # each batch's activations reuse the last one's pages (see cpu_memory.py)
        self.model = load_model(self.spec, self.device, self.dtype)
        if self.device.type == "cpu":
            from argosy.encoder.cpu_ops import use_fused_cpu_layers
            from argosy.engine.cpu_linear import route_cpu_linears

            use_fused_cpu_layers(self.model)
            route_cpu_linears(self.model)  # the pooler and classifier, and the layers where fusing cannot run
        self.scheduler = EncoderScheduler(self.max_num_batched_tokens, config.max_num_seqs)
        self.num_batches = 0
        self.num_batched_tokens = 0
        logger.info("encoder %s (%s): %s on %s, %d-token inputs, %d-token batches", self.spec.folder, self.kind,
                    self.dtype, self.device, self.max_model_len, self.max_num_batched_tokens)

    @property
    def dimensions(self) -> int:
        return self.spec.dimensions

    # ------------------------------------------------------------------ requests

    def check_inputs(self, inputs: list[Input], param: str = "input") -> None:
        if not inputs:
            raise EncoderInputError(f"'{param}' has no inputs", param)
        if len(inputs) > self.config.max_client_batch_size:
            raise BatchTooLargeError(len(inputs), self.config.max_client_batch_size, param)
        for i, x in enumerate(inputs):
            ids = x[0] if isinstance(x, tuple) else x
            if not ids:
                raise EncoderInputError(f"{param}[{i}] has no tokens", param)
            if len(ids) > self.max_model_len:
                raise InputTooLongError(i, len(ids), self.max_model_len, param)

    def add_request(self, request_id: str, inputs: list[Input], arrival: float | None = None) -> None:
        self.check_inputs(inputs)
        total = sum(len(x[0] if isinstance(x, tuple) else x) for x in inputs)
        request = EncodeRequest(request_id, len(inputs), total, arrival if arrival is not None else time.monotonic())
        items = [EncodeItem(request, i, *(x if isinstance(x, tuple) else (x, None))) for i, x in enumerate(inputs)]
        self.scheduler.add(request, items)

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.waiting)

    # ------------------------------------------------------------------ steps

    @torch.inference_mode()
    def run_batch(self, items: list[EncodeItem]) -> torch.Tensor:
        """The batch's vectors (embed) or scores (rerank), in the items' order, float32 on the CPU."""
        order = sorted(range(len(items)), key=lambda i: -items[i].num_tokens)
        batch = pack([(items[i].ids, items[i].type_ids) for i in order], self.device)
        hidden = self.model(batch)
        if self.kind == EMBED:
            out = pool(hidden, batch, self.spec.pooling, self.spec.normalize)
        else:
            out = self.model.classify(hidden, batch).float()  # logits: activate() turns them into scores
            out = out[:, 0] if out.shape[1] == 1 else out
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        self.num_batches += 1
        self.num_batched_tokens += batch.num_tokens
        return out.index_select(0, inverse.to(out.device)).cpu()

    def step(self) -> list[EncoderOutput]:
        items = self.scheduler.schedule()
        if not items:
            return []
        results = self.run_batch(items)
        finished, now = [], time.monotonic()
        for item, row in zip(items, results, strict=True):
            request = item.request
            if self.scheduler.requests.get(request.request_id) is not request:
                continue  # aborted while its batch ran
            request.results[item.index] = row
            request.remaining -= 1
            if request.remaining == 0:
                self.scheduler.finish(request)
                queue_s = (request.first_scheduled or now) - request.arrival
                finished.append(EncoderOutput(request.request_id, torch.stack(request.results), request.num_tokens,
                                              queue_s, now - request.arrival))
        return finished

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        """A cross-encoder's scores from its logits: the sigmoid with one label (sentence-transformers'
        CrossEncoder and TEI do the same), else the logits as they are."""
        return torch.sigmoid(logits) if self.spec.sigmoid else logits

    def stats(self) -> dict:
        s = self.scheduler
        running = sum(1 for r in s.requests.values() if r.first_scheduled is not None)
        return {"num_waiting": len(s.requests) - running, "num_running": running, "queued_tokens": s.queued_tokens,
                "queued_inputs": len(s.waiting), "num_batches": self.num_batches,
                "num_batched_tokens": self.num_batched_tokens}
