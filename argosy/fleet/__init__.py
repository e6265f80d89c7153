"""The fleet controller: replicas of each model started, placed, scaled and drained behind the gateway.

autoscaler.py   Knative-style pod autoscaler (pure: observations in, decision out)
scaling_metrics.py  the autoscaler's metrics: each one's sample and whether it needs a scrape
placement.py    nodes, GPUs and replica memory needs; best-fit decreasing placement
replica.py      a replica's record and its states
local.py        `argosy engine` subprocesses on this machine
ray_provider.py replicas as Ray actors on a Ray cluster
controller.py   per-model reconcile loop: scale, warm pool, restart, drain; the gateway's activator
serve.py        `argosy serve`: gateway + controller + replicas in one process tree
status.py       `argosy status` and `argosy config check`
"""
