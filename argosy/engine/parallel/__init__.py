"""Tensor and pipeline parallelism: `LLM(model, tensor_parallel_size=T, pipeline_parallel_size=P)`.

state.py     ranks, process groups, the (optionally timed) all-reduce / gather / send / recv
linear.py    row-parallel linear, vocab-parallel embedding and LM head
model.py     one rank's shard of the model and the loader that reads only that shard
worker.py    one rank: shard + KV cache + its part of a step (submit / collect); the loop of the non-driver ranks
control.py   the driver's control connections to its ranks (TCP to those it did not spawn), stopping them
launch.py    the Ranks protocol; where the other ranks come from: spawned here (mp) or started by torchrun
ray_ranks.py the ray backend: a placement group, one actor per bundle
executor.py  the driver: starts the ranks, sends each step's inputs, keeps micro-batches in flight, watches

The torchrun entry for offline generation is argosy/engine/torchrun_generate.py (above this package:
it runs the LLM class).
"""
