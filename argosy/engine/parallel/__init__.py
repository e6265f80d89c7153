"""Tensor and pipeline parallelism: `LLM(model, tensor_parallel_size=T, pipeline_parallel_size=P)`.

state.py     ranks, process groups, the (optionally timed) all-reduce / gather / send / recv
linear.py    row-parallel linear, vocab-parallel embedding and LM head
model.py     one rank's shard of the model and the loader that reads only that shard
worker.py    one rank: shard + KV cache + its part of a step; the loop of the non-driver ranks
executor.py  the driver: starts the ranks, sends each step's inputs, watches for dead workers
"""
