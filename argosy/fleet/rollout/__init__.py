"""Safe rollouts: how a model changes revision while it serves (docs/rollouts.md).

  state.py      what the fleet keeps across restarts: the stable revision, the split, the rollout in progress
  store.py      where it keeps it: Redis (gateway.redis_url) or a state file written atomically
  analysis.py   the gates: the candidate against the stable over the same window (pure functions)
  manager.py    RolloutManager, one per model: commands, the driver task, events, persistence
  canary.py, blue_green.py, rolling.py   the strategies
  metrics.py    argosy_rollout_* series;  cli.py: `argosy rollout`
"""
